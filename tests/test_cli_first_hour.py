"""What a new user trips over in the first hour: commands that disagree, messages that mislead.

Each test is the exact repro of one such fault, run in-process as `moetune` runs.
"""

from pathlib import Path

import pytest

from moetune.cli import main
from moetune.extract import filenames

ROOT = Path(__file__).resolve().parent.parent
TINY_MOE = ROOT / "tests" / "tune" / "data" / "tiny-moe"
VLLM_FILE = ROOT / "bench" / "vllm_configs" / "E=128,N=768,device_name=NVIDIA_H200.json"


@pytest.fixture(autouse=True)
def offline_no_gpu(monkeypatch, tmp_path):
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "MOETUNE_MAPPINGS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(filenames, "detect_device_name", lambda: None)
    monkeypatch.chdir(tmp_path)


def run(capsys, *args):
    """Run the CLI in-process as `moetune` does; return (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main([str(arg) for arg in args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def error_line(err):
    lines = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# --- batch sizes: one rule, one syntax, in tune and benchmark -----------------------


def test_benchmark_takes_a_list_of_batch_sizes_as_tune_does(capsys):
    code, out, err = run(
        capsys, "benchmark", "-m", "Qwen/Qwen3-30B-A3B", "--batch-size", "1,64",
        "--batch-size", "8", "--dry-run", "--device-name", "NVIDIA_H200",
    )  # fmt: skip
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()[1:4]] == ["M=1", "M=8", "M=64"]


@pytest.mark.parametrize("command", ["tune", "benchmark"])
def test_an_absurd_batch_size_is_refused_in_one_line(capsys, command):
    code, out, err = run(
        capsys, command, "-m", "Qwen/Qwen3-30B-A3B", "--batch-size", "1000000000", "--dry-run",
    )  # fmt: skip
    assert code == 2
    assert "1,048,576" in error_line(err) and "1000000000" in error_line(err)
    assert out == ""


def test_the_largest_batch_size_is_planned(capsys):
    code, out, err = run(
        capsys, "tune", "-m", "Qwen/Qwen3-30B-A3B", "--batch-size", "1048576", "--dry-run",
        "--engine", "vllm", "--device-name", "NVIDIA_H200",
    )  # fmt: skip
    assert code == 0, err
    assert "Batch sizes: 1048576" in out


# --- one layout rule for extract, check, tune and benchmark -------------------------

MIXTRAL = "mistralai/Mixtral-8x7B-v0.1"  # 8 experts, top-k 2


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
def test_the_four_commands_agree_on_every_ep_layout(capsys, tp):
    common = ["-m", MIXTRAL, "--tp", tp, "--ep", "--device-name", "NVIDIA_H200"]
    codes = {
        "extract": run(capsys, "extract", *common, "--json")[0],
        "check": run(capsys, "check", *common, "--json")[0],
        "tune": run(capsys, "tune", *common, "--dry-run", "--batch-size", "1")[0],
        "benchmark": run(capsys, "benchmark", *common, "--dry-run", "--batch-size", "1")[0],
    }
    valid = tp <= 8  # 8 experts split evenly over 1, 2, 4 or 8 ranks
    # check exits 4 (no tuned file here) where the layout is valid.
    assert codes == (
        {"extract": 0, "check": 4, "tune": 0, "benchmark": 0}
        if valid
        else {"extract": 1, "check": 1, "tune": 1, "benchmark": 1}
    )


def test_a_sweep_skips_only_what_its_reasons_call_invalid(capsys):
    code, out, err = run(
        capsys, "tune", "-m", MIXTRAL, "--tp", "1,2,4,8,16", "--ep", "--dry-run",
        "--device-name", "NVIDIA_H200", "--batch-size", "1",
    )  # fmt: skip
    assert code == 0, err
    layouts = [line.strip() for line in out.splitlines() if line.startswith("  TP")]
    skipped = [line for line in layouts if "skipped" in line]
    assert len(skipped) == 1 and skipped[0].startswith("TP16 EP")
    assert "valid --tp with --ep: 1, 2, 4, 8" in skipped[0]
    tp8 = next(line for line in layouts if line.startswith("TP8 EP"))
    assert "-> shape 4: E=1,N=14336,K=4096,topk=1," in tp8
    # The plan says why a rank's kernel runs top-k 1.
    assert "fewer than top-k 2" in err and "tuned with top-k 1" in err


@pytest.mark.slow
def test_one_expert_per_rank_tunes_end_to_end_on_the_cpu(tmp_path):
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "moetune",
            "tune",
            "-m",
            str(TINY_MOE),
            "--tp",
            "4",
            "--ep",
            "--batch-size",
            "1",
            "--space",
            str(TINY_MOE.parent / "tiny-space.json"),
            "--engine",
            "vllm",
            "--save-dir",
            str(tmp_path / "out"),
            "--json",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "E=1,N=32,device_name=cpu.json").is_file()
