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
