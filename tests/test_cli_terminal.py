"""The terminal: a closed pipe, 80 columns, names and paths never cut."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def environment(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "MOETUNE_MAPPINGS")}
    env.update(
        PYTHONPATH=str(ROOT),
        CUDA_VISIBLE_DEVICES="",
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf_home"),
        **extra,
    )
    return env


@pytest.mark.parametrize(
    "args",
    [
        ["archs"],  # rich
        ["extract", "-m", "Qwen/Qwen3-30B-A3B", "--json", "--device-name", "NVIDIA_H200"],
        ["tune", "-m", "Qwen/Qwen3-30B-A3B", "--dry-run", "--device-name", "NVIDIA_H200"],
    ],
    ids=["archs", "extract-json", "tune-dry-run"],
)
def test_a_reader_that_goes_away_is_no_error(tmp_path, args):
    """`moetune ... | head`: the pipe closes before the command writes; exit 0, nothing said."""
    process = subprocess.Popen(
        [sys.executable, "-m", "moetune", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=environment(tmp_path),
    )
    process.stdout.close()  # before the interpreter has even started: every write fails
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0, stderr
    assert "Error" not in stderr and "Exception" not in stderr, stderr
