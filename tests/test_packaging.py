"""A wheel build is warning-free and carries every data file moetune reads at run time."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_builds_without_setuptools_warnings_and_holds_the_data(tmp_path):
    source = tmp_path / "src"
    ignore = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", "bench")
    shutil.copytree(ROOT, source, ignore=ignore)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            ".",
            "-w",
            str(tmp_path / "dist"),
            "--no-deps",
            "--no-build-isolation",
            "-v",
        ],
        cwd=source,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stdout + result.stderr
    assert "absent from the `packages` configuration" not in output
    assert "_Warning" not in output
    (wheel,) = (tmp_path / "dist").glob("moetune-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in (
        "moetune/data/moe_mappings.yaml",
        "moetune/data/transformers_defaults.json",
        "moetune/data/schemas/moe_mappings.schema.json",
        "moetune/data/schemas/tuned_config.schema.json",
        "moetune/data/schemas/search_space.schema.json",
        "moetune/data/backends.yaml",
        "moetune/data/estimate_rates.yaml",
        "moetune/data/schemas/backends.schema.json",
        "moetune/catalog/INDEX.md",
        "moetune/catalog/Qwen__Qwen3-30B-A3B.json",
    ):
        assert data in names, data
    assert not any("__pycache__" in name or name.startswith("tests/") for name in names)
