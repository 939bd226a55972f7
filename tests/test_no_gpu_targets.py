"""The GPU-only targets on a machine without a GPU: one line and a non-zero exit."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def no_gpu_env():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize(
    ("target", "hint"),
    [("test-gpu", "make test runs the CPU suite"), ("bench", "--quick runs the tiny shape")],
)
def test_a_gpu_target_without_a_gpu_says_so_in_one_line(target, hint):
    result = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), target, f"PYTHON={sys.executable}"],
        capture_output=True,
        text=True,
        env=no_gpu_env(),
        timeout=300,
    )
    assert result.returncode != 0
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert f"make {target}: no CUDA GPU visible" in line and hint in line


def test_the_kernel_benchmark_without_a_gpu_says_so_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "kernel.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**no_gpu_env(), "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("bench/kernel.py: no CUDA GPU visible")
    assert not list(tmp_path.iterdir())


def test_the_kernel_benchmark_tables_of_no_rows_are_their_headers():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_kernel", ROOT / "bench" / "kernel.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    assert len(bench.table_lines([], markdown=False)) == 1
    assert len(bench.glue_table_lines([], markdown=False)) == 1
