"""vLLM's releases as moetune launches them (0.33.0, 0.34.0), and the interface check.

Stand-in kernel files carry the interface a release module declares; the released
files themselves are tested in tests/engines_real/test_vllm_*.py.
"""

from pathlib import Path
from types import SimpleNamespace

import pytest
from stand_ins import KernelRecorder, stand_in_release  # tests/ is on sys.path

from moetune.engines.launch import (
    KernelChoiceError,
    resolve_kernel,
    twin_ref,
    vllm_0_33,
    vllm_0_34,
)
from moetune.engines.launch.common import GemmCall
from moetune.engines.launch.interface import interface_change, read_interface
from moetune.kernel.tma import SplitConfigError

BLOCK_FP8 = ("fp8_w8a8", (128, 128))


def installed(version, release, source):  # noqa: ANN001, ANN201
    return SimpleNamespace(version=version, release=release, kernel_source=source, root="/site")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fused_moe.py"
    path.write_text(text)
    return path


def test_the_interface_is_read_from_the_source(tmp_path: Path) -> None:
    read = read_interface(write(tmp_path, stand_in_release(vllm_0_34)), "fused_moe_kernel",
                          "invoke_fused_moe_triton_kernel")  # fmt: skip
    assert read == vllm_0_34.INTERFACE
    assert interface_change(vllm_0_34.INTERFACE, read) is None
    # 0.34 against 0.33's launch: the new parameters and the new config key, named.
    change = interface_change(vllm_0_33.INTERFACE, read)
    assert change == (
        "fused_moe_kernel gained b_desc, a_desc, USE_TMA_B, USE_TMA_A, C_IS_SORTED; "
        "invoke_fused_moe_triton_kernel reads config keys USE_TMA"
    )


def test_each_installed_release_is_launched_by_its_own_module(tmp_path: Path) -> None:
    for module in (vllm_0_33, vllm_0_34):
        source = write(tmp_path, stand_in_release(module))
        resolution = resolve_kernel(
            "vllm", "vllm", lambda e, m=module, s=source: installed(m.RELEASE, m.RELEASE, s)
        )
        assert resolution.note is None
        assert resolution.kernel.release == module.RELEASE
        assert resolution.kernel.tag().startswith(f"vllm-{module.RELEASE}@")


def test_an_unseen_release_with_a_changed_kernel_is_tuned_on_the_twin(tmp_path: Path) -> None:
    source = write(tmp_path, stand_in_release(vllm_0_34, gained="scale_desc"))
    find = lambda e: installed("0.35.0", "0.34.0", source)  # noqa: E731
    resolution = resolve_kernel("auto", "vllm", find)
    assert resolution.kernel == twin_ref("vllm")
    assert resolution.note == (
        "vLLM 0.35.0's fused_moe_kernel is not the one moetune's vLLM 0.34.0 launch was "
        "written for (fused_moe_kernel gained scale_desc): the vLLM file is timed on "
        "moetune's twin of vLLM's kernel (moetune/kernel/fused_moe_kernel.py); a moetune "
        "that knows vLLM 0.35.0 times its own kernel"
    )
    with pytest.raises(KernelChoiceError, match="vLLM 0.35.0 is a release") as info:
        resolve_kernel("vllm", "vllm", find)
    assert "\n" not in str(info.value)


def test_a_known_release_whose_file_changed_is_not_launched_either(tmp_path: Path) -> None:
    # 0.34.0 by its version, but a launcher that reads a key 0.34's launch does not pass.
    text = stand_in_release(vllm_0_34) + "    config.get('USE_TMA_A')\n"
    find = lambda e: installed("0.34.0", "0.34.0", write(tmp_path, text))  # noqa: E731
    resolution = resolve_kernel("auto", "vllm", find)
    assert resolution.kernel is None
    assert "reads config keys USE_TMA_A" in resolution.note
    with pytest.raises(KernelChoiceError, match="reads config keys USE_TMA_A") as info:
        resolve_kernel("vllm", "vllm", find)
    assert "\n" not in str(info.value)


def test_an_unseen_release_with_the_same_interface_is_launched_as_the_nearest(
    tmp_path: Path,
) -> None:
    source = write(tmp_path, stand_in_release(vllm_0_34))
    resolution = resolve_kernel("auto", "vllm", lambda e: installed("0.34.1", "0.34.0", source))
    assert resolution.kernel.release == "0.34.0" and resolution.kernel.version == "0.34.1"
    assert resolution.note == "vLLM 0.34.1: its kernel is launched as vLLM 0.34.0 launches it"


@pytest.mark.parametrize(
    ("config", "dtype", "capability", "n", "k", "block_k", "taken"),
    [
        ({}, BLOCK_FP8, (9, 0), 512, 7168, 128, True),  # USE_TMA absent: True
        ({"USE_TMA": True}, BLOCK_FP8, (10, 0), 512, 7168, 128, True),  # sm100 too
        ({"USE_TMA": False}, BLOCK_FP8, (9, 0), 512, 7168, 128, False),
        ({}, BLOCK_FP8, (8, 9), 512, 7168, 128, False),  # Ada: not family 90/100
        ({}, BLOCK_FP8, (12, 0), 512, 7168, 128, False),
        ({}, BLOCK_FP8, None, 512, 7168, 128, False),  # no CUDA device
        ({}, ("fp8_w8a8", None), (9, 0), 512, 7168, 128, False),  # per-tensor fp8
        ({}, (None, None), (9, 0), 512, 7168, 128, False),  # bf16
        ({}, ("fp8_w8a8", (0, 128)), (9, 0), 512, 7168, 128, False),  # a zero side
        ({}, BLOCK_FP8, (9, 0), 576, 7168, 128, False),  # N % BLOCK_SIZE_N
        ({}, BLOCK_FP8, (9, 0), 512, 7200, 128, False),  # K % BLOCK_SIZE_K
        ({}, BLOCK_FP8, (9, 0), 512, 7200, 32, True),  # ... after the clamp
    ],
)
def test_tma_b_rule(config, dtype, capability, n, k, block_k, taken) -> None:  # noqa: ANN001
    config = {"BLOCK_SIZE_N": 128, **config}
    assert vllm_0_34.use_tma_b(config, *dtype, capability, n, k, block_k) is taken
    assert not vllm_0_34.use_tma_b(config, *dtype, capability, n, k, block_k, contiguous=False)


def test_use_tma_is_a_key_of_0_34_only() -> None:
    assert vllm_0_34.refusal({"USE_TMA": False}, "fp8_w8a8") is None
    assert "true or false" in vllm_0_34.refusal({"USE_TMA": 1}, "fp8_w8a8")
    assert vllm_0_33.refusal({"USE_TMA": True}, None) is not None
    assert "USE_TMA" in vllm_0_34.FILE_KEYS and "USE_TMA" not in vllm_0_33.FILE_KEYS
    # 0.34 pops the entry's USE_TMA in both GEMMs' launches.
    split = vllm_0_34.split_configs({"BLOCK_SIZE_M": 16, "USE_TMA": False}, None)
    assert split.up == split.down == {"BLOCK_SIZE_M": 16, "USE_TMA": False}
    assert not (split.up_tma or split.down_tma)
    # A _down entry runs the down GEMM only with USE_TMA true (its sorted path), on its
    # tile with the main entry's BLOCK_SIZE_M; a guard entry or none: the main entry alone.
    for guard in ({"BLOCK_SIZE_M": 64}, {"USE_TMA": False}):
        split = vllm_0_34.split_configs({"BLOCK_SIZE_M": 16}, guard)
        assert split.up == split.down == {"BLOCK_SIZE_M": 16} and not split.down_tma
    split = vllm_0_34.split_configs(
        {"BLOCK_SIZE_M": 16, "USE_TMA": False},
        {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "USE_TMA": True},
    )
    assert split.down == {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128} and split.down_tma
    assert split.up == {"BLOCK_SIZE_M": 16, "USE_TMA": False} and not split.up_tma
    with pytest.raises(SplitConfigError, match="true or false"):
        vllm_0_34.split_configs({"BLOCK_SIZE_M": 16}, {"USE_TMA": "yes"})


def gemm_call(config: dict, block_shape=(128, 128)) -> GemmCall:  # noqa: ANN001
    import torch

    E, N, K, M, top_k = 4, 256, 256, 3, 2
    a = torch.zeros(M, K).to(torch.float8_e4m3fn)
    w = torch.zeros(E, N, K).to(torch.float8_e4m3fn)
    return GemmCall(
        a=a,
        w=w,
        c=torch.zeros(M * top_k, N, dtype=torch.bfloat16),
        a_scale=torch.ones(M, K // 128),
        w_scale=torch.ones(E, N // 128, K // 128),
        topk_weights=None,
        sorted_token_ids=None,
        expert_ids=torch.zeros(M * top_k, dtype=torch.int32),
        num_tokens_post_padded=torch.tensor([M * top_k * 16], dtype=torch.int32),
        mul_routed_weight=False,
        top_k=top_k,
        config=config,
        quant_dtype="fp8_w8a8",
        block_shape=block_shape,
    )


CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1,
          "num_warps": 4, "num_stages": 3}  # fmt: skip
LAUNCH_OPTIONS = {"num_warps", "num_stages"}  # Triton's, not the kernel's


@pytest.mark.parametrize("module", [vllm_0_33, vllm_0_34], ids=["0.33", "0.34"])
def test_the_launch_passes_the_interface_it_declares(module) -> None:  # noqa: ANN001
    kernel = KernelRecorder()
    module.launch(kernel, gemm_call(dict(CONFIG)), capability=(9, 0))
    names = [p.split(":")[0].split("=")[0].strip() for p in module.INTERFACE.parameters]
    required = {
        name for name, p in zip(names, module.INTERFACE.parameters, strict=True) if "=" not in p
    }
    positional = names[: len(kernel.args)]
    keywords = set(kernel.kwargs) - LAUNCH_OPTIONS
    assert len(kernel.args) <= len(names) and not keywords & set(positional)
    assert keywords <= set(names[len(kernel.args) :])
    assert required <= set(positional) | keywords
    assert set(names) - set(positional) - keywords <= {"USE_TD"} - required
    # The launch decisions both releases share: naive EM, the clamp, SWAP_AB on sm90.
    assert kernel.kwargs["BLOCK_SIZE_K"] == 128 and kernel.kwargs["SWAP_AB"]
    assert kernel.grid == (3 * 2 * 16 // 16 * (256 // 64),)


def test_0_34_passes_the_weight_descriptor_where_it_takes_tma_b(monkeypatch) -> None:  # noqa: ANN001
    from triton.tools.tensor_descriptor import TensorDescriptor

    kernel = KernelRecorder()
    call = gemm_call(dict(CONFIG))
    vllm_0_34.launch(kernel, call, capability=(9, 0))  # CPU tensors: never TMA
    assert kernel.args[2] is None and kernel.kwargs["USE_TMA_B"] is False
    monkeypatch.setattr(vllm_0_34, "use_tma_b", lambda *args, **kwargs: True)
    vllm_0_34.launch(kernel, call, capability=(9, 0))
    desc = kernel.args[2]
    assert isinstance(desc, TensorDescriptor) and desc.base is call.w
    assert list(desc.block_shape) == [1, 64, 128]  # BLOCK_SIZE_K after the clamp
    assert kernel.kwargs["USE_TMA_B"] is True and kernel.args[11] is None  # a_desc
    assert kernel.kwargs["USE_TMA_A"] is False and kernel.kwargs["C_IS_SORTED"] is False
    assert "USE_TMA" not in kernel.kwargs  # popped, as 0.34's launcher does


def test_0_34_refuses_a_sorted_call_it_would_not_take_and_a_strided_topk_weights() -> None:
    from dataclasses import replace

    import torch

    # The sorted path (its _down.json) needs the alignment, and sm90 exactly.
    with pytest.raises(ValueError, match="skips the alignment"):
        vllm_0_34.launch(KernelRecorder(), replace(gemm_call(dict(CONFIG)), c_sorted=True))
    aligned = replace(gemm_call(dict(CONFIG)), sorted_token_ids=torch.zeros(64, dtype=torch.int32))
    with pytest.raises(ValueError, match="capability 9.0 only"):
        vllm_0_34.launch(KernelRecorder(), replace(aligned, c_sorted=True), capability=(10, 0))
    weights = torch.ones(3, 4)[:, ::2]
    with pytest.raises(ValueError, match="contiguous"):
        vllm_0_34.launch(KernelRecorder(), replace(gemm_call(dict(CONFIG)), topk_weights=weights))


def test_the_registry_is_the_release_modules() -> None:
    from moetune.engines import installed
    from moetune.engines.launch import RELEASES, known_releases, release_module

    assert ("vllm", "0.33.0") in RELEASES and ("vllm", "0.34.0") in RELEASES
    assert known_releases("vllm") == ["0.33.0", "0.34.0"]  # oldest first
    for engine, release in RELEASES:
        module = release_module(engine, release)
        assert (module.ENGINE, module.RELEASE) == (engine, release)
        assert release in installed.RELEASES[engine], f"{engine} {release} has no layout"
        if engine == "vllm":  # what check and the interface check read
            assert module.INTERFACE.kernel == module.KERNEL
            assert {"BLOCK_SIZE_M", "num_warps"} <= module.FILE_KEYS
            assert hasattr(module, "DOWN_FILE_CONDITIONS")
