"""scripts/check_releases.py on tiny synthetic wheels: what differs in the files moetune reads."""

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from moetune.engines import installed

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "check_releases.py"
spec = importlib.util.spec_from_file_location("check_releases", SCRIPT)
check_releases = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = check_releases  # its dataclasses look their module up
spec.loader.exec_module(check_releases)

VLLM_MOE = "vllm/model_executor/layers/fused_moe"
KERNEL_033 = """
import triton.language as tl

@triton.jit
def fused_moe_kernel(a_ptr, b_ptr, c_ptr, N, K, BLOCK_SIZE_M: tl.constexpr, USE_TD: tl.constexpr):
    pass

def invoke_fused_moe_kernel(A, B, C, config):
    grid = (config["BLOCK_SIZE_M"],)
    BLOCK_SIZE_K = config.pop("BLOCK_SIZE_K")
    fused_moe_kernel[grid](A, B, C, 1, 2, BLOCK_SIZE_K=BLOCK_SIZE_K, **config)

def get_config_file_name(E: int, N: int, dtype: str | None) -> str:
    return ""

def get_moe_configs(E: int, N: int, dtype: str | None, block_n: int | None = None):
    return None
"""
# 0.34-like: b_desc after b_ptr, a new constexpr, a launcher key, a lookup parameter.
KERNEL_034 = """
import triton.language as tl

@triton.jit
def fused_moe_kernel(
    a_ptr, b_ptr, b_desc, c_ptr, N, K, BLOCK_SIZE_M: tl.constexpr, USE_TD: tl.constexpr,
    USE_TMA_B: tl.constexpr,
):
    pass

def invoke_fused_moe_kernel(A, B, C, config):
    grid = (config["BLOCK_SIZE_M"],)
    BLOCK_SIZE_K = config.pop("BLOCK_SIZE_K")
    use_tma = config.pop("USE_TMA", True)
    fused_moe_kernel[grid](A, B, None, C, 1, 2, BLOCK_SIZE_K=BLOCK_SIZE_K, **config)

def get_config_file_name(E: int, N: int, dtype: str | None) -> str:
    return ""

def get_moe_configs(
    E: int, N: int, dtype: str | None, block_n: int | None = None, down_moe: bool = False
):
    return None
"""
H200 = "E=8,N=14336,device_name=NVIDIA_H200.json"
DOWN = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128]_down.json"


@pytest.fixture(autouse=True)
def known_releases(monkeypatch):
    """The releases moetune knows, pinned: the script's answers must not move with RELEASES."""
    known = {
        "vllm": {"0.33.0": installed.VLLM_FUSED_MOE},
        "sglang": {"0.5.15": installed.SGLANG_MOE_RUNNER, "0.5.23": installed.SGLANG_KERNELS_OPS},
    }
    monkeypatch.setattr(check_releases, "RELEASES", known)


def wheel(folder: Path, engine: str, version: str, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{engine}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(f"{engine}-{version}.dist-info/METADATA", f"Version: {version}\n")
    return path


def vllm_wheel(folder: Path, version: str, kernel: str, configs: list[str]) -> Path:
    files = {f"{VLLM_MOE}/fused_moe.py": kernel}
    files.update({f"{VLLM_MOE}/configs/{name}": "{}" for name in configs})
    return wheel(folder, "vllm", version, files)


def run(capsys, *args):
    status = check_releases.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out.splitlines(), err


def test_a_new_kernel_parameter_launcher_key_lookup_parameter_and_file(tmp_path, capsys):
    old = vllm_wheel(tmp_path, "0.33.0", KERNEL_033, [H200])
    new = vllm_wheel(tmp_path, "0.34.0", KERNEL_034, [H200, DOWN])
    status, lines, err = run(capsys, "--wheel", old, "--wheel", new)
    assert (status, err) == (1, "")
    assert lines == [
        "vllm 0.34.0 against 0.33.0:",
        "  kernel fused_moe_kernel: parameters added: b_desc (after b_ptr), "
        "constexpr USE_TMA_B (after USE_TD)",
        "  kernel fused_moe_kernel: parameters: 7 -> 9",
        "  launcher invoke_fused_moe_kernel: config keys added: USE_TMA",
        "  lookup get_moe_configs: + down_moe: bool = False",
        "  config files: 1 -> 2",
        f"  config files added: {DOWN}",
    ]


def test_the_same_files_are_exit_zero(tmp_path, capsys):
    old = vllm_wheel(tmp_path / "a", "0.33.0", KERNEL_033, [H200])
    new = vllm_wheel(tmp_path / "b", "0.33.1", KERNEL_033, [H200])
    status, lines, _ = run(capsys, "--wheel", old, "--wheel", new)
    assert (status, lines) == (
        0,
        ["vllm 0.33.1 against 0.33.0: the same in every file moetune reads"],
    )


def test_removed_reordered_and_constexpr_changes_and_a_lost_splat(tmp_path, capsys):
    changed = (
        KERNEL_033.replace("a_ptr, b_ptr, c_ptr, N, K", "b_ptr, a_ptr, c_ptr, N: tl.constexpr")
        .replace("USE_TD: tl.constexpr", "USE_TD")
        .replace(", **config)", ")")
        .replace('config.pop("BLOCK_SIZE_K")', "16")
    )
    old = vllm_wheel(tmp_path, "0.33.0", KERNEL_033, [H200])
    new = vllm_wheel(tmp_path, "0.35.0", changed, [])
    status, lines, _ = run(capsys, "--wheel", old, "--wheel", new)
    assert status == 1
    assert lines[1:] == [
        "  kernel fused_moe_kernel: parameters removed: K",
        "  kernel fused_moe_kernel: parameters reordered: b_ptr, a_ptr, c_ptr, N, BLOCK_SIZE_M, "
        "USE_TD",
        "  kernel fused_moe_kernel: now constexpr: N",
        "  kernel fused_moe_kernel: no longer constexpr: USE_TD",
        "  kernel fused_moe_kernel: parameters: 7 -> 6",
        "  launcher invoke_fused_moe_kernel: config keys no longer read: BLOCK_SIZE_K",
        "  launcher invoke_fused_moe_kernel: no longer passes **config on to the kernel",
        "  configs folder: model_executor/layers/fused_moe/configs -> (none found)",
        "  config files: 1 -> 0",
        f"  config files removed: {H200}",
    ]


def test_a_file_moved_to_another_known_layout_is_found_there(tmp_path, capsys):
    """SGLang 0.5.16 moved its kernel to kernels/ops/moe/; a release moving it back is read."""
    kernel = KERNEL_033.replace("invoke_fused_moe_kernel", "invoke_fused_moe_kernel_sglang")
    lookup = "def get_config_file_name(E, N, dtype):\n    return ''\n"
    runner = "sglang/srt/layers/moe/moe_runner/triton_utils"
    common = {f"{runner}/fused_moe_triton_config.py": lookup, f"{runner}/configs/x/a.json": "{}"}
    old = wheel(
        tmp_path,
        "sglang",
        "0.5.23",
        {"sglang/kernels/ops/moe/fused_moe_triton_kernels.py": kernel, **common},
    )
    new = wheel(
        tmp_path, "sglang", "0.5.24", {f"{runner}/fused_moe_triton_kernels.py": kernel, **common}
    )
    status, lines, _ = run(capsys, "--wheel", old, "--wheel", new)
    assert (status, lines) == (
        1,
        [
            "sglang 0.5.24 against 0.5.23:",
            "  kernel file: kernels/ops/moe/fused_moe_triton_kernels.py -> "
            "srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_kernels.py",
        ],
    )


def test_a_wheel_without_the_kernel_says_so(tmp_path, capsys):
    old = vllm_wheel(tmp_path, "0.33.0", KERNEL_033, [H200])
    new = wheel(tmp_path, "vllm", "0.40.0", {"vllm/__init__.py": ""})
    status, lines, _ = run(capsys, "--wheel", old, "--wheel", new)
    assert (
        status == 1
        and "  kernel: no fused_moe_kernel found where any known layout puts it" in lines
    )


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: [vllm_wheel(d, "0.33.0", KERNEL_033, [])], "--wheel takes two wheels"),
        (
            lambda d: [vllm_wheel(d, "0.33.0", KERNEL_033, []), wheel(d, "sglang", "0.5.23", {})],
            "vllm against sglang: compare one engine's wheels",
        ),
        (lambda d: [d / "notes.txt", d / "notes.txt"], "notes.txt: not a vllm or sglang wheel"),
        (
            lambda d: [d / "vllm-0.1.0-py3-none-any.whl", d / "vllm-0.1.0-py3-none-any.whl"],
            "cannot read the wheel",
        ),
        (
            lambda d: [
                vllm_wheel(d, "0.33.0", "def broken(:\n", []),
                vllm_wheel(d, "0.34.0", "", []),
            ],
            "does not parse",
        ),
    ],
)
def test_bad_wheels_are_one_line_and_exit_2(tmp_path, capsys, make, message):
    args = [arg for path in make(tmp_path) for arg in ("--wheel", path)]
    status, lines, err = run(capsys, *args)
    assert (status, lines) == (2, [])
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A fake registry: `pip index versions` lists `versions`, `pip download` copies wheels."""
    shelf = tmp_path / "shelf"
    vllm_wheel(shelf, "0.33.0", KERNEL_033, [H200])
    vllm_wheel(shelf, "0.34.0", KERNEL_034, [H200, DOWN])
    versions = {"vllm": "0.34.0, 0.33.0, 0.32.1", "sglang": "0.5.23, 0.5.22"}

    def pip(*args):
        if args[:2] == ("index", "versions"):
            engine = args[2]
            out = f"{engine} ({versions[engine].split(',')[0]})\nAvailable versions: {versions[engine]}\n"
            return subprocess.CompletedProcess(args, 0, out, "")
        assert args[0] == "download" and "--no-deps" in args
        dest, (engine, version) = Path(args[args.index("--dest") + 1]), args[-1].split("==")
        for found in shelf.glob(f"{engine}-{version}-*.whl"):
            (dest / found.name).write_bytes(found.read_bytes())
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(check_releases, "pip", pip)
    return versions


def test_the_registry_lists_the_newest_and_compares_the_unknown(tmp_path, capsys, registry):
    status, lines, _ = run(capsys, "--dest", tmp_path / "wheels")
    assert status == 1
    assert (
        lines[0]
        == "vllm: newest on the registry 0.34.0; newest moetune knows 0.33.0; not known: 0.34.0"
    )
    assert lines[1] == "vllm 0.34.0 against 0.33.0:"
    assert "  launcher invoke_fused_moe_kernel: config keys added: USE_TMA" in lines
    assert lines[-1] == "sglang: newest on the registry 0.5.23; newest moetune knows 0.5.23"
    assert sorted(p.name for p in (tmp_path / "wheels").iterdir()) == [
        "vllm-0.33.0-py3-none-any.whl",
        "vllm-0.34.0-py3-none-any.whl",
    ]


def test_every_release_known_is_exit_zero(tmp_path, capsys, registry):
    registry["vllm"] = "0.33.0, 0.32.1"
    status, lines, _ = run(capsys, "--dest", tmp_path / "wheels", "--engine", "vllm")
    assert (status, lines) == (
        0,
        ["vllm: newest on the registry 0.33.0; newest moetune knows 0.33.0"],
    )


def test_no_registry_is_one_line(tmp_path, capsys, monkeypatch):
    def pip(*args):
        return subprocess.CompletedProcess(args, 1, "", "WARNING: retrying\nERROR: no network\n")

    monkeypatch.setattr(check_releases, "pip", pip)
    status, lines, err = run(capsys, "--dest", tmp_path)
    assert (status, lines) == (2, [])
    assert err == "error: pip index versions vllm failed: ERROR: no network\n"
