"""Which kernel a tune times (`moetune.engines.launch`) and compiling an engine's source (`.source`).

The released engines' own kernels are tested in tests/engines_real (``make test-engines``);
here stand-in sources and stand-in installs check the rules without them.
"""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from stand_ins import stand_in_release, stand_in_vllm  # tests/ is on sys.path

from moetune.cli import cli, main
from moetune.device import DeviceLimits
from moetune.engines.launch import (
    KernelChoiceError,
    KernelRef,
    benchmark_kernel,
    engine_gemm,
    resolve_kernel,
    resolve_kernels,
    sglang_0_5_23,
    twin_ref,
    vllm_0_33,
)
from moetune.engines.source import EngineSourceError, has_jit_functions, load_jit_functions
from moetune.kernel.config import SWAP_AB_BLOCK_M
from moetune.tune.problem import TuneProblem
from moetune.tune.search.space import default_space, swap_ab_candidates

STAND_IN_KERNEL = """\
import torch  # never executed: only the jit functions are
import triton
import triton.language as tl

RAISES_IF_RUN = 1 / 0


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def fused_moe_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, _twice(tl.load(x_ptr + offs, mask=mask)), mask=mask)


def not_a_kernel():
    raise RuntimeError("never called")
"""


@pytest.fixture
def kernel_file(tmp_path: Path) -> Path:
    path = tmp_path / "fused_moe.py"
    path.write_text(STAND_IN_KERNEL)
    return path


@pytest.fixture
def vllm_kernel_file(tmp_path: Path) -> Path:
    """A stand-in of vLLM 0.33.0's kernel file: its kernel's and launcher's interface."""
    path = tmp_path / "vllm_fused_moe.py"
    path.write_text(stand_in_release(vllm_0_33))
    return path


def installed(version, release, source, root="/site/vllm"):  # noqa: ANN001, ANN201
    return SimpleNamespace(version=version, release=release, kernel_source=source, root=root)


def test_jit_functions_compile_from_the_source_file_alone(kernel_file: Path) -> None:
    import torch

    loaded = load_jit_functions(kernel_file, ("fused_moe_kernel",))
    # The helper it calls comes along; the module's statements never ran (1 / 0 above).
    assert sorted(loaded.functions) == ["_twice", "fused_moe_kernel"]
    assert len(loaded.digest) == 12
    x = torch.arange(5, dtype=torch.float32)
    y = torch.zeros(5)
    loaded["fused_moe_kernel"][(1,)](x, y, 5, BLOCK=8)
    assert y.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("def fused_moe_kernel(): pass\n", "has no @triton.jit fused_moe_kernel"),
        ("@triton.jit\ndef fused_moe_kernel(:\n", "cannot read the engine's kernel source"),
        (b"\xff\xfe", "cannot read the engine's kernel source"),
    ],
)
def test_a_source_without_the_kernel_is_one_line(tmp_path: Path, text, expected) -> None:  # noqa: ANN001
    path = tmp_path / "fused_moe.py"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(EngineSourceError, match=expected) as info:
        has_jit_functions(path, ("fused_moe_kernel",))
    assert "\n" not in str(info.value)


def test_auto_times_the_installed_engines_kernel(vllm_kernel_file: Path) -> None:
    kernel_file = vllm_kernel_file
    resolution = resolve_kernel(
        "auto", "vllm", lambda e: installed("0.33.0", "0.33.0", kernel_file)
    )
    ref = resolution.kernel
    assert resolution.note is None
    assert (ref.engine, ref.version, ref.release, ref.source) == (
        "vllm",
        "0.33.0",
        "0.33.0",
        str(kernel_file),
    )
    assert ref.tag() == f"vllm-0.33.0@{ref.digest}"
    assert f"vLLM 0.33.0's fused_moe_kernel ({kernel_file})" == ref.describe()


def test_auto_falls_back_to_each_engines_twin_when_the_engine_is_absent() -> None:
    # vLLM's twin is moetune's default kernel (no ref); SGLang's is its own twin kernel.
    # The fallback is said, with why.
    vllm = resolve_kernel("auto", "vllm", lambda e: None)
    assert vllm.kernel is None
    assert vllm.note == (
        "vLLM is not installed in this Python environment: the vLLM file is timed on "
        "moetune's twin of vLLM's kernel (moetune/kernel/fused_moe_kernel.py)"
    )
    sglang = resolve_kernel("auto", "sglang", lambda e: None)
    assert sglang.note == (
        "SGLang is not installed in this Python environment: the SGLang file is timed on "
        "moetune's twin of SGLang's kernel (moetune/kernel/fused_moe_kernel_sglang.py)"
    )
    assert sglang.kernel == twin_ref("sglang")
    assert sglang.kernel.twin and sglang.kernel.release == "0.5.23"
    assert sglang.kernel.source == "moetune/kernel/fused_moe_kernel_sglang.py"
    assert sglang.kernel.describe().startswith(
        "moetune's twin of SGLang 0.5.23's fused_moe_kernel "
        "(moetune/kernel/fused_moe_kernel_sglang.py;"
    )
    assert sglang.describe() == sglang.kernel.describe()
    assert vllm.describe().startswith("moetune's twin of vLLM 0.34.0's fused_moe_kernel")


def test_the_sglang_twin_loads_moetunes_kernel_under_sglangs_launch() -> None:
    from moetune.kernel import fused_moe_kernel_sglang

    gemm = engine_gemm(twin_ref("sglang"))
    assert gemm.kernel is fused_moe_kernel_sglang.fused_moe_kernel
    assert gemm.release is sglang_0_5_23
    assert not gemm.naive_assignment(8, 256, "fp8_w8a8", (128, 128))  # SGLang always aligns


def test_an_unknown_release_is_launched_as_the_nearest_known_one(vllm_kernel_file: Path) -> None:
    find = lambda e: installed("0.33.2", "0.33.0", vllm_kernel_file)  # noqa: E731
    resolution = resolve_kernel("auto", "vllm", find)
    assert resolution.kernel.release == "0.33.0" and resolution.kernel.version == "0.33.2"
    assert resolution.note == ("vLLM 0.33.2: its kernel is launched as vLLM 0.33.0 launches it")
    with pytest.raises(KernelChoiceError, match=r"supported: 0\.33\.0"):
        resolve_kernel("vllm", "vllm", find)


def test_a_release_without_a_known_launch_gets_the_twin_with_a_note(kernel_file: Path) -> None:
    find = lambda e: installed("0.5.12", "0.5.12", kernel_file)  # noqa: E731
    resolution = resolve_kernel("auto", "sglang", find)
    assert resolution.kernel == twin_ref("sglang")
    assert "SGLang 0.5.12 is a release whose kernel launch moetune does not know" in (
        resolution.note
    )
    assert "twin" in resolution.note
    with pytest.raises(KernelChoiceError, match="supported: 0.5.23"):
        resolve_kernel("sglang", "sglang", find)


def test_a_source_without_the_kernel_gets_the_twin(tmp_path: Path) -> None:
    empty = tmp_path / "fused_moe.py"
    empty.write_text("x = 1\n")
    find = lambda e: installed("0.33.0", "0.33.0", empty)  # noqa: E731
    resolution = resolve_kernel("auto", "vllm", find)
    assert resolution.kernel is None and "has no @triton.jit fused_moe_kernel" in resolution.note
    with pytest.raises(KernelChoiceError, match="has no @triton.jit"):
        resolve_kernel("vllm", "vllm", find)
    missing = lambda e: installed("0.33.0", "0.33.0", None)  # noqa: E731
    assert resolve_kernel("auto", "vllm", missing).kernel is None
    with pytest.raises(KernelChoiceError, match="has no fused-MoE kernel file"):
        resolve_kernel("vllm", "vllm", missing)


def test_an_explicit_engine_kernel_needs_that_engine_alone() -> None:
    with pytest.raises(KernelChoiceError, match="needs --engine vllm"):
        resolve_kernels("vllm", ("vllm", "sglang"), lambda e: None)
    with pytest.raises(KernelChoiceError, match="vLLM is not installed"):
        resolve_kernels("vllm", ("vllm",), lambda e: None)
    # The twins asked for by name: not a fallback, no note (the Kernel line names them).
    assert resolve_kernels("moetune", ("vllm", "sglang"), lambda e: None) == (
        {"vllm": None, "sglang": twin_ref("sglang")},
        [],
    )


def test_only_vllm_installed_says_sglangs_file_falls_back_to_its_twin(vllm_kernel_file) -> None:  # noqa: ANN001
    only_vllm = lambda e: installed("0.33.0", "0.33.0", vllm_kernel_file) if e == "vllm" else None  # noqa: E731
    kernels, notes = resolve_kernels("auto", ("vllm", "sglang"), only_vllm)
    assert kernels["vllm"].engine == "vllm" and not kernels["vllm"].twin
    assert kernels["sglang"] == twin_ref("sglang")
    assert notes == [
        "SGLang is not installed in this Python environment: the SGLang file is timed on "
        "moetune's twin of SGLang's kernel (moetune/kernel/fused_moe_kernel_sglang.py)"
    ]


def test_benchmark_times_each_engines_columns_on_its_own_kernel(
    kernel_file, vllm_kernel_file
) -> None:  # noqa: ANN001
    both = lambda e: installed(  # noqa: E731
        "0.33.0" if e == "vllm" else "0.5.23",
        "0.33.0" if e == "vllm" else "0.5.23",
        vllm_kernel_file if e == "vllm" else kernel_file,
    )
    kernels, notes = benchmark_kernel("auto", ("vllm", "sglang"), both)
    assert (kernels["vllm"].engine, kernels["sglang"].engine) == ("vllm", "sglang")
    assert not kernels["vllm"].twin and not kernels["sglang"].twin and notes == []
    only_sglang = lambda e: installed("0.5.23", "0.5.23", kernel_file) if e == "sglang" else None  # noqa: E731
    kernels, notes = benchmark_kernel("auto", ("vllm", "sglang"), only_sglang)
    assert kernels["vllm"] is None and kernels["sglang"].engine == "sglang"
    assert notes == [
        "vLLM is not installed in this Python environment: the vLLM file is timed on "
        "moetune's twin of vLLM's kernel (moetune/kernel/fused_moe_kernel.py)"
    ]
    assert benchmark_kernel("moetune", ("vllm",), only_sglang) == ({"vllm": None}, [])
    assert benchmark_kernel("moetune", ("sglang",), only_sglang) == (
        {"sglang": twin_ref("sglang")},
        [],
    )
    # An engine named: every column on that kernel.
    kernels, _ = benchmark_kernel("sglang", ("vllm", "sglang"), only_sglang)
    assert kernels["vllm"] == kernels["sglang"] and kernels["vllm"].engine == "sglang"
    # Neither installed: each engine's twin, each fallback said.
    kernels, notes = benchmark_kernel("auto", ("vllm", "sglang"), lambda e: None)
    assert kernels == {"vllm": None, "sglang": twin_ref("sglang")} and len(notes) == 2


def test_every_store_key_names_its_kernel_by_a_digest_of_its_files(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    from moetune.engines import launch
    from moetune.tune.problem import TuneProblem

    bf16 = TuneProblem(4, 32, 64, 2, "bf16")
    int4 = TuneProblem(4, 32, 64, 2, "int4_w4a16", group_size=32)
    sglang = TuneProblem(4, 32, 64, 2, "bf16", kernel=twin_ref("sglang"))
    digests = {twin: launch.twin_digest(twin) for twin in launch.TWIN_FILES}
    assert bf16.key() == f"{bf16.shape_key()},kernel=moetune-vllm-0.34.0@{digests['vllm']}"
    assert int4.key().endswith(f",kernel=moetune-wna16@{digests['wna16']}")
    assert sglang.key().endswith(f",kernel=moetune-sglang-0.5.23@{digests['sglang']}")
    assert len(set(digests.values())) == 3
    # An edit to a file of a twin's kernel or launch is another kernel: another key.
    copy = tmp_path / "moetune"
    for name in {name for files in launch.TWIN_FILES.values() for name in files}:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_bytes((Path(launch.__file__).parents[2] / name).read_bytes())
    with (copy / "kernel/launch_rules.py").open("a") as handle:
        handle.write("# an edit\n")
    monkeypatch.setattr(launch, "__file__", str(copy / "engines/launch/__init__.py"))
    launch.twin_digest.cache_clear()
    try:
        assert all(launch.twin_digest(twin) != digests[twin] for twin in digests)
        assert bf16.key() != f"{bf16.shape_key()},kernel=moetune-vllm-0.34.0@{digests['vllm']}"
    finally:
        launch.twin_digest.cache_clear()


def test_vllm_0_33_takes_the_naive_path_for_sparse_decode() -> None:
    # DeepSeek-V3 TP8 (256 experts, top-8): up to M=8 each slot is its own block.
    assert vllm_0_33.naive_assignment(8 * 8, 256, "fp8_w8a8", (128, 128))
    assert not vllm_0_33.naive_assignment(9 * 8, 256, "fp8_w8a8", (128, 128))
    # int4/int8 weight-only with a group never does; SGLang never does.
    assert not vllm_0_33.naive_assignment(8, 256, "int4_w4a16", (0, 128))
    assert not sglang_0_5_23.naive_assignment(8, 256, None, None)


@pytest.mark.parametrize(
    ("bm", "bn", "dtype", "capability", "swapped"),
    [
        (16, 64, "fp8_w8a8", (9, 0), True),
        (8, 128, "fp8_w8a8", (9, 0), True),
        (64, 64, "fp8_w8a8", (9, 0), False),  # wgmma rows already
        (16, 32, "fp8_w8a8", (9, 0), False),  # too narrow to be the dot's M
        (16, 64, None, (9, 0), False),  # bf16 never swaps
        (16, 64, "fp8_w8a8", (10, 0), False),  # vLLM: sm90 exactly
        (16, 64, "fp8_w8a8", None, False),  # no CUDA device (the interpreter)
    ],
)
def test_swap_ab_rule(bm, bn, dtype, capability, swapped) -> None:  # noqa: ANN001
    config = {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn}
    assert vllm_0_33.swap_ab(config, dtype, capability) is swapped


def test_vllm_refuses_sglang_only_configs() -> None:
    assert "TMA" in vllm_0_33.refusal({"USE_TMA": True}, None)
    assert vllm_0_33.refusal({}, "int4_w4a16") is not None
    assert vllm_0_33.refusal({"BLOCK_SIZE_M": 16}, "fp8_w8a8") is None


REF = KernelRef("vllm", "0.33.0", "0.33.0", "/site/vllm/fused_moe.py", "f37773a8ca2c")


def test_the_store_key_names_the_kernel_timed() -> None:
    twin = TuneProblem(256, 256, 7168, 8, "fp8_w8a8", (128, 128))
    engine = TuneProblem(256, 256, 7168, 8, "fp8_w8a8", (128, 128), kernel=REF)
    assert engine.key() == twin.shape_key() + ",kernel=vllm-0.33.0@f37773a8ca2c"
    assert twin.key().startswith(twin.shape_key() + ",kernel=moetune-vllm-0.34.0@")
    # The key reads back as the problem; the kernel is the measurement's, not the shape's.
    assert TuneProblem.from_key(engine.key()) == twin
    assert TuneProblem.from_key(twin.key()) == twin
    sglang_twin = TuneProblem(256, 256, 7168, 8, "fp8_w8a8", (128, 128), kernel=twin_ref("sglang"))
    assert sglang_twin.key().startswith(twin.shape_key() + ",kernel=moetune-sglang-0.5.23@")
    assert len({twin.key(), engine.key(), sglang_twin.key()}) == 3
    assert TuneProblem.from_key(sglang_twin.key()) == twin


def test_eight_row_tiles_join_the_space_only_where_the_kernel_swaps() -> None:
    space = default_space()
    hopper = DeviceLimits.h200()
    fp8 = TuneProblem(256, 256, 7168, 8, "fp8_w8a8", (128, 128), kernel=REF)
    added = swap_ab_candidates(space, fp8, hopper)
    assert added and {c.BLOCK_SIZE_M for c in added} == {SWAP_AB_BLOCK_M}
    assert min(c.BLOCK_SIZE_N for c in added) == 64
    assert len(added) == sum(1 for c in space if c.BLOCK_SIZE_M == 16 and c.BLOCK_SIZE_N >= 64)
    from dataclasses import replace

    # moetune's twin swaps as vLLM 0.33 does, so it gets them too.
    assert swap_ab_candidates(space, replace(fp8, kernel=None), hopper) == added
    assert swap_ab_candidates(space, replace(fp8, dtype="bf16", block_shape=None), hopper) == []
    other = DeviceLimits(232_448, 148, "NVIDIA B200", (10, 0))
    assert swap_ab_candidates(space, fp8, other) == []


def run(capsys, *args):  # noqa: ANN001, ANN002, ANN201
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_tune_kernel_vllm_without_vllm_is_one_line(capsys) -> None:  # noqa: ANN001
    code, _, err = run(
        capsys, "tune", "--model", "Qwen/Qwen3-30B-A3B", "--tp", "1", "--engine", "vllm",
        "--kernel", "vllm", "--dry-run", "--device-name", "NVIDIA_H200",
    )  # fmt: skip
    assert code == 1
    assert err.strip().splitlines()[-1] == (
        "Error: --kernel vllm: vLLM is not installed in this Python environment "
        "(pip install --no-deps vllm==0.34.0: moetune reads its kernel's source, or use "
        "--kernel auto)"
    )


def test_tune_plan_names_the_installed_engines_kernel(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    stand_in_vllm(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)  # find_spec reads it first
    result = CliRunner().invoke(
        cli,
        ["tune", "--model", "Qwen/Qwen3-30B-A3B", "--tp", "1", "--engine", "vllm",
         "--dry-run", "--device-name", "NVIDIA_H200", "--save-dir", str(tmp_path / "out")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    source = tmp_path / "vllm" / "model_executor" / "layers" / "fused_moe" / "fused_moe.py"
    assert f"Kernel:      vLLM 0.33.0's fused_moe_kernel ({source})" in result.output
    json_run = CliRunner().invoke(
        cli,
        ["tune", "--model", "Qwen/Qwen3-30B-A3B", "--tp", "1", "--engine", "vllm",
         "--dry-run", "--json", "--device-name", "NVIDIA_H200", "--save-dir", str(tmp_path / "out")],
    )  # fmt: skip
    plan = json.loads(json_run.output)
    assert plan["problem"] == f"{plan['shape_key']},kernel=vllm-0.33.0@{plan['kernel']['digest']}"
    assert plan["kernel"]["description"].startswith("vLLM 0.33.0's fused_moe_kernel")
