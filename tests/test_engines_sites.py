"""tests/engines_real/conftest.py's harness: a run per site, `release` and `reads_only` marks.

Its conftest runs here in a pytest of its own, on fake sites (a marker and a dist-info
per engine, as scripts/fetch_engines.py leaves them), so the harness is checked
without the engines' wheels.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TESTS = """
import pytest


def test_every_site(site_releases):
    assert set(site_releases) == {"vllm", "sglang"}


@pytest.mark.release(vllm="0.33.0")
def test_old_vllm_only(vllm_installed):
    assert vllm_installed.version == "0.33.0"


@pytest.mark.reads_only("sglang")
@pytest.mark.parametrize("n", [1, 2])
def test_sglang_only(sglang_installed, n):
    assert sglang_installed.version == "0.5.23"
"""


def fake_site(folder: Path, vllm: str, sglang: str) -> Path:
    for engine, version in (("vllm", vllm), ("sglang", sglang)):
        (folder / engine).mkdir(parents=True)
        (folder / engine / "__init__.py").write_text("")
        dist = folder / f"{engine}-{version}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {engine}\nVersion: {version}\n"
        )
        (folder / f".moetune-{engine}").write_text(f"{engine}-{version}-py3-none-any.whl\n")
    return folder


def test_each_test_runs_per_site_and_the_marks_choose_where(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(ROOT / "tests" / "engines_real" / "conftest.py", suite / "conftest.py")
    (suite / "test_sites.py").write_text(TESTS)
    sites = [
        fake_site(tmp_path / "vllm-0.33.0+sglang-0.5.23", "0.33.0", "0.5.23"),
        fake_site(tmp_path / "vllm-0.34.0+sglang-0.5.23", "0.34.0", "0.5.23"),
        tmp_path / "never-fetched",
    ]
    env = {
        **os.environ,
        "MOETUNE_ENGINES_SITE": os.pathsep.join(map(str, sites)),
        "PYTHONPATH": str(ROOT),
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", str(suite)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    outcomes = dict(re.findall(r"::(test_\S+) (PASSED|SKIPPED|FAILED|ERROR)", result.stdout))
    assert outcomes == {
        "test_every_site[vllm-0.33.0+sglang-0.5.23]": "PASSED",
        "test_every_site[vllm-0.34.0+sglang-0.5.23]": "PASSED",
        "test_every_site[never-fetched]": "SKIPPED",
        "test_old_vllm_only[vllm-0.33.0+sglang-0.5.23]": "PASSED",
        "test_old_vllm_only[vllm-0.34.0+sglang-0.5.23]": "SKIPPED",
        "test_old_vllm_only[never-fetched]": "SKIPPED",
        # once per SGLang release: the second vLLM site's runs are deselected
        "test_sglang_only[vllm-0.33.0+sglang-0.5.23-1]": "PASSED",
        "test_sglang_only[vllm-0.33.0+sglang-0.5.23-2]": "PASSED",
        "test_sglang_only[never-fetched-1]": "SKIPPED",
        "test_sglang_only[never-fetched-2]": "SKIPPED",
    }, result.stdout
    assert "2 deselected" in result.stdout
    assert "reads vllm 0.33.0 only; this site holds vllm 0.34.0" in result.stdout
    assert f"no vllm, sglang files in {sites[2]}: `make test-engines` fetches them" in (
        result.stdout
    )
