"""Tests against the engines' released files: `make test-engines` fetches them.

The files are in ``$MOETUNE_ENGINES_SITE``, else ``<repo>/.engines/site``
(scripts/fetch_engines.py: each engine's current release, Python and JSON files
only, in the package layout). Without them every test here is skipped. Each test
gets that folder on ``sys.path`` (so `find_spec` finds the engines there, as it
would a ``pip install --no-deps``), and none imports the engines.

Fixtures for other tests here: `engines_site` (the folder), `vllm_installed` and
`sglang_installed` (`find_installed` of each).
"""

import os
import sys
from pathlib import Path

import pytest

from moetune.engines.installed import ENGINES, InstalledEngine, current_release, find_installed

ROOT = Path(__file__).resolve().parent.parent.parent
SITE = Path(os.environ.get("MOETUNE_ENGINES_SITE") or ROOT / ".engines" / "site")
# Environment that changes what the engines (and moetune) look up.
ENGINE_ENV = (
    "VLLM_TUNED_CONFIG_FOLDER",
    "VLLM_BATCH_INVARIANT",
    "SGLANG_MOE_CONFIG_DIR",
    "MOETUNE_MAPPINGS",
)


@pytest.fixture(autouse=True)
def engines_site(monkeypatch, tmp_path):
    """The fetched engines' folder, first on sys.path; skips when it was never fetched."""
    missing = [e for e in ENGINES if not (SITE / f".moetune-{e}").is_file()]
    if missing:
        pytest.skip(f"no {', '.join(missing)} files in {SITE}: run `make test-engines`")
    monkeypatch.syspath_prepend(str(SITE))
    for name in ENGINES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    for variable in ENGINE_ENV:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return SITE


def _installed(engine: str) -> InstalledEngine:
    found = find_installed(engine)
    assert found is not None, f"{engine} is not in {SITE}"
    assert found.version == current_release(engine)[0], f"{SITE} holds {found.label}: refetch"
    return found


@pytest.fixture
def vllm_installed(engines_site) -> InstalledEngine:
    return _installed("vllm")


@pytest.fixture
def sglang_installed(engines_site) -> InstalledEngine:
    return _installed("sglang")
