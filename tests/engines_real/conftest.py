"""Tests against the engines' released files: `make test` and `make test-engines` fetch them.

The files are in the site folders of ``$MOETUNE_ENGINES_SITE`` (``:``-separated),
else in every site under ``<repo>/.engines/`` (scripts/fetch_engines.py: one
folder per release mix, such as ``vllm-0.34.0+sglang-0.5.23``, Python and JSON
files only, in the package layout). Every test here runs once per site, its id
naming the site; a site that was never fetched skips, saying how to fetch it.
Each test gets its site first on ``sys.path`` (so `find_spec` finds the engines
there, as it would a ``pip install --no-deps``), and none imports the engines.

Fixtures for the tests here: `engines_site` (the folder), `site_releases`
(engine -> the version its wheel says), `vllm_installed` and `sglang_installed`
(`find_installed` of each). A test that holds for some releases only says so
with ``@pytest.mark.release(vllm="0.33.0")`` (a version or a tuple of them, per
engine); on a site with another release it is skipped, naming both. A test that
reads one engine's files only says so with ``@pytest.mark.reads_only("sglang")``:
it runs on the first site holding each release of that engine, not on every site
(the vLLM sites share SGLang's release).
"""

import os
import sys
from pathlib import Path

import pytest

from moetune.engines.installed import ENGINES, InstalledEngine, find_installed

ROOT = Path(__file__).resolve().parent.parent.parent
ENGINES_DIR = ROOT / ".engines"
# Environment that changes what the engines (and moetune) look up.
ENGINE_ENV = (
    "VLLM_TUNED_CONFIG_FOLDER",
    "VLLM_BATCH_INVARIANT",
    "SGLANG_MOE_CONFIG_DIR",
    "MOETUNE_MAPPINGS",
)


def sites() -> list[Path]:
    """The site folders to test against (at least one, perhaps never fetched)."""
    named = os.environ.get("MOETUNE_ENGINES_SITE", "")
    if named:
        return [Path(p) for p in named.split(os.pathsep) if p]
    fetched = sorted(p.parent for p in ENGINES_DIR.glob("*/.moetune-vllm"))
    return fetched or [ENGINES_DIR / "site"]


def releases_in(site: Path) -> dict[str, str]:
    """Engine -> version, from the wheel each ``.moetune-<engine>`` marker names."""
    found = {}
    for engine in ENGINES:
        marker = site / f".moetune-{engine}"
        if marker.is_file():
            # vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl
            found[engine] = marker.read_text().strip().split("-")[1]
    return found


def _skip_for_release(node, releases: dict[str, str]) -> None:
    for mark in node.iter_markers("release"):
        for engine, wanted in mark.kwargs.items():
            versions = (wanted,) if isinstance(wanted, str) else tuple(wanted)
            if releases.get(engine) not in versions:
                pytest.skip(
                    f"reads {engine} {' or '.join(versions)} only; "
                    f"this site holds {engine} {releases.get(engine)}"
                )


def pytest_collection_modifyitems(config, items):
    """Deselect the runs of a `reads_only` test on a site that repeats its releases."""
    seen, dropped = set(), []
    for item in items:
        mark = item.get_closest_marker("reads_only")
        params = getattr(getattr(item, "callspec", None), "params", {})
        if mark is None or "engines_site" not in params:
            continue
        releases = releases_in(params["engines_site"])
        if not all(engine in releases for engine in mark.args):
            continue  # not fetched: the run is kept, and skips saying so
        others = tuple(sorted((k, repr(v)) for k, v in params.items() if k != "engines_site"))
        key = (item.path, item.originalname, others, *(releases[e] for e in mark.args))
        if key in seen:
            dropped.append(item)
        seen.add(key)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(dropped)
        items[:] = [item for item in items if item not in gone]


@pytest.fixture(autouse=True, params=sites(), ids=lambda site: site.name)
def engines_site(request, monkeypatch, tmp_path):
    """One fetched site, first on sys.path; skips when it was never fetched."""
    site = request.param
    releases = releases_in(site)
    missing = [e for e in ENGINES if e not in releases]
    if missing:
        pytest.skip(
            f"no {', '.join(missing)} files in {site}: `make test-engines` fetches them "
            "(ENGINE_WHEELS=DIR for wheels already downloaded)"
        )
    _skip_for_release(request.node, releases)
    monkeypatch.syspath_prepend(str(site))
    for name in ENGINES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    for variable in ENGINE_ENV:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return site


@pytest.fixture
def site_releases(engines_site) -> dict[str, str]:
    """Engine -> the release this test's site holds."""
    return releases_in(engines_site)


def _installed(engine: str, site: Path) -> InstalledEngine:
    found = find_installed(engine)
    assert found is not None, f"{engine} is not in {site}"
    wheel = releases_in(site)[engine]
    assert found.version == wheel, f"{site} holds {engine} {wheel}, found {found.label}"
    return found


@pytest.fixture
def vllm_installed(engines_site) -> InstalledEngine:
    return _installed("vllm", engines_site)


@pytest.fixture
def sglang_installed(engines_site) -> InstalledEngine:
    return _installed("sglang", engines_site)
