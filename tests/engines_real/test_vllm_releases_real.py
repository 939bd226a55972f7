"""Whichever vLLM release the site holds (0.33.0 or 0.34.0): its kernel launched by its own
release module, against the PyTorch reference, and copies of it as releases moetune has
not read (the interface check of `moetune.engines.launch`).

Run under Triton's interpreter on small fp16 and fp8 shapes (its bf16 dot is wrong,
see moetune/kernel/fused_moe_kernel.py). TMA-B needs a CUDA device of family 9.x/10.x:
here the rule and the descriptor are checked, the TMA loads run on a GPU only.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moetune.engines.installed import RELEASES, find_installed, version_key
from moetune.engines.launch import (
    EngineGemm,
    interface_change_at,
    release_module,
    resolve_kernel,
)
from moetune.kernel.fused_moe import fused_moe
from moetune.kernel.naive import naive_fused_moe
from moetune.kernel.problem import make_problem
from moetune.tune.measure.verify import compare

pytestmark = pytest.mark.engines
# Interpreter tests build their tensors on the CPU; `make test-gpu` runs them on the GPU.
DEVICE = "cuda" if os.environ.get("MOETUNE_GPU_TESTS") == "1" else "cpu"
ROOT = Path(__file__).resolve().parent.parent.parent
TINY = ROOT / "tests" / "tune" / "data"


@pytest.fixture
def vllm(engines_site):  # noqa: ANN001, ANN201
    found = find_installed("vllm")
    if found is None or found.version not in RELEASES["vllm"]:
        pytest.skip(f"no vLLM release moetune knows in {engines_site}")
    return found


def config(bm=16, bn=32, bk=32):  # noqa: ANN001, ANN201
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 1,
            "num_warps": 4, "num_stages": 2}  # fmt: skip


def check(gemm, M, E, dtype, cfg, block_shape=None, N=64, K=64, top_k=2) -> None:  # noqa: ANN001
    p = make_problem(M, E, N, K, top_k, dtype, block_shape=block_shape, device=DEVICE, seed=5)
    out = fused_moe(p.x, p.w1, p.w2, p.router_logits, top_k, config=cfg, quant=p.quant, gemm=gemm)
    ref = naive_fused_moe(p.x, p.w1, p.w2, p.router_logits, top_k, quant=p.quant)
    result = compare(out, ref, dtype)
    assert result.ok, result


def test_the_installed_kernel_is_the_one_its_release_module_declares(vllm) -> None:  # noqa: ANN001
    module = release_module("vllm", vllm.version)
    assert interface_change_at(module, vllm.kernel_source) is None
    resolution = resolve_kernel("vllm", "vllm")
    assert resolution.note is None and resolution.kernel.release == vllm.version
    # Every other known release's launch would be refused on this file.
    for other in RELEASES["vllm"]:
        if other != vllm.version and (
            getattr(release_module("vllm", other), "INTERFACE", None) is not None
        ):
            assert interface_change_at(release_module("vllm", other), vllm.kernel_source)


@pytest.mark.parametrize(
    ("M", "E", "dtype", "block_shape", "cfg", "capability"),
    [
        (5, 4, "fp16", None, config(), None),  # aligned
        (1, 16, "fp16", None, config(), None),  # naive: M * top_k * 4 <= E
        (5, 8, "fp8_w8a8", (32, 32), config(bn=64, bk=64), None),  # BLOCK_SIZE_K clamped
        (2, 32, "fp8_w8a8", (32, 32), config(bm=8, bn=64), (9, 0)),  # SWAP_AB, naive
        (9, 8, "fp8_w8a8", (32, 32), dict(config(bm=8, bn=64), USE_TMA=False), (9, 0)),
    ],
    ids=["aligned", "naive", "block-fp8-clamp", "swap-ab-naive", "swap-ab-use-tma-false"],
)
def test_the_installed_kernel_matches_the_reference(
    vllm, M, E, dtype, block_shape, cfg, capability
):  # noqa: ANN001, ANN201, E501
    if "USE_TMA" in cfg and "USE_TMA" not in release_module("vllm", vllm.version).FILE_KEYS:
        pytest.skip(f"vLLM {vllm.version} refuses USE_TMA")
    gemm = EngineGemm(resolve_kernel("vllm", "vllm").kernel)
    gemm.capability = capability  # the launch rules read it; the interpreter runs any tile
    check(gemm, M, E, dtype, cfg, block_shape=block_shape)


def unseen_release(vllm, site: Path, version: str, gained: str | None = None) -> Path:  # noqa: ANN001
    """A copy of the installed vLLM as `version`, its kernel with one more positional
    parameter after ``b_ptr`` when `gained` is given."""
    shutil.copytree(vllm.root, site / "vllm")
    (site / "vllm" / "_version.py").write_text(f"__version__ = version = {version!r}\n")
    dist = site / f"vllm-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    if gained:
        kernel = site / "vllm" / "model_executor" / "layers" / "fused_moe" / "fused_moe.py"
        text = kernel.read_text()
        signature = "def fused_moe_kernel(\n"
        start = text.index(signature)
        at = text.index("    b_ptr,\n", start) + len("    b_ptr,\n")
        kernel.write_text(text[:at] + f"    {gained},\n" + text[at:])
    return site


def tiny_tune(site: Path, out: Path) -> subprocess.CompletedProcess:
    # The site first; what the caller's path holds (a carried jsonschema) after it.
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, TRITON_INTERPRET="1")
    command = [
        sys.executable, "-m", "moetune", "tune", "--model", str(TINY / "tiny-moe"), "--tp", "1",
        "--space", str(TINY / "tiny-space.json"), "--batch-size", "1,4", "--engine", "vllm",
        "--dtype", "fp16", "--save-dir", str(out),
        "--confirm-rounds", "0",  # the kernel a release is timed on is checked, not the round
    ]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT, timeout=600)


@pytest.mark.slow
def test_an_unseen_release_whose_kernel_gained_a_parameter_tunes_on_the_twin(vllm, tmp_path):  # noqa: ANN001, ANN201
    site = unseen_release(vllm, tmp_path / "site", "0.35.0", gained="b_extra_ptr")
    result = tiny_tune(site, tmp_path / "out")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "vLLM 0.35.0's fused_moe_kernel is not the one moetune's vLLM 0.34.0 launch" in (
        " ".join(result.stderr.split())
    )
    assert "gained b_extra_ptr" in " ".join(result.stderr.split())
    assert "Kernel:      moetune's twin of vLLM" in result.stdout
    assert (tmp_path / "out" / "E=4,N=32,device_name=cpu.json").is_file()


def test_an_unseen_release_with_the_same_kernel_is_launched_as_its_nearest(vllm, tmp_path):  # noqa: ANN001, ANN201
    release = max(RELEASES["vllm"], key=version_key)
    if vllm.version != release:
        pytest.skip(f"an unseen release follows the newest known one, {release}")
    patch = release.rsplit(".", 1)[0] + ".9"
    site = unseen_release(vllm, tmp_path / "site", patch)
    result = tiny_tune(site, tmp_path / "out")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"vLLM {patch}: its kernel is launched as vLLM {release} launches it" in (
        " ".join(result.stderr.split())
    )
    assert f"Kernel:      vLLM {patch}'s fused_moe_kernel" in result.stdout
    # The store's key names the installed release's kernel.
    store = (tmp_path / "out" / "measurements.jsonl").read_text()
    assert f"kernel=vllm-{patch}@" in store


def test_0_34_block_scale_shortcut(vllm) -> None:  # noqa: ANN001
    """0.34 loads one weight scale per tile where ``group_n % BLOCK_SIZE_N == 0`` and
    broadcasts it with ``b_scale[None, :]``; Triton 3.9 refuses that index on a scalar
    ("too many indices for tensor of rank 0"), Triton 3.8 (vLLM 0.34's pin) takes it. The
    launch says so in one line."""
    import triton

    gemm = EngineGemm(resolve_kernel("vllm", "vllm").kernel)
    try:
        check(gemm, 5, 8, "fp8_w8a8", config(bn=32, bk=32), block_shape=(32, 32))
    except ValueError as exc:
        assert vllm.version == "0.34.0"
        assert f"does not compile on Triton {triton.__version__}" in str(exc)
        assert "\n" not in str(exc)
        pytest.xfail(f"vLLM 0.34.0's block-scale shortcut on Triton {triton.__version__}")


def _hopper_or_blackwell() -> bool:
    try:
        import torch
    except ImportError:
        return False
    from moetune.kernel.fused_moe_kernel import interpreting

    return (
        not interpreting()
        and torch.cuda.is_available()
        and torch.cuda.get_device_capability()[0] in (9, 10)
    )


@pytest.mark.skipif(not _hopper_or_blackwell(), reason="TMA-B runs on sm90/sm100 only (a GPU)")
@pytest.mark.parametrize("M", [1, 8, 64, 512])
@pytest.mark.parametrize("use_tma", [None, False])
@pytest.mark.parametrize("bn", [128, 256])
def test_0_34_tma_b_on_the_gpu_matches_the_reference(vllm, monkeypatch, M, use_tma, bn) -> None:  # noqa: ANN001, E501
    """DeepSeek-V3-like block fp8 (E=16 of 256 for speed, N=256, K=7168): 0.34 reads the
    weights through TMA unless the entry says ``USE_TMA: false``; both match the reference.
    BLOCK_SIZE_N 128 takes 0.34's per-tile weight scale too (not on Triton 3.9: xfail)."""
    from moetune.engines.launch import vllm_0_34

    if vllm.version != "0.34.0":
        pytest.skip("TMA-B is vLLM 0.34's")
    taken = []
    rule = vllm_0_34.use_tma_b
    monkeypatch.setattr(
        vllm_0_34, "use_tma_b", lambda *a, **k: taken.append(rule(*a, **k)) or taken[-1]
    )
    gemm = EngineGemm(resolve_kernel("vllm", "vllm").kernel)
    cfg = dict(config(bm=16 if M <= 64 else 64, bn=bn, bk=128), num_stages=3)
    if use_tma is not None:
        cfg["USE_TMA"] = use_tma
    p = make_problem(M, 16, 256, 7168, 8, "fp8_w8a8", block_shape=(128, 128), device="cuda")
    try:
        out = fused_moe(p.x, p.w1, p.w2, p.router_logits, 8, config=cfg, quant=p.quant, gemm=gemm)
    except ValueError as exc:
        if "does not compile on Triton" in str(exc):
            pytest.xfail(str(exc))
        raise
    ref = naive_fused_moe(p.x, p.w1, p.w2, p.router_logits, 8, quant=p.quant)
    result = compare(out, ref, "fp8_w8a8")
    assert result.ok, result
    assert taken == [use_tma is None] * 2  # both GEMMs
