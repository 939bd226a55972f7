"""`find_installed`: an engine found on sys.path without importing it, laid out like each release.

Fake packages stand in for the engines: only the files moetune looks at, and an
``__init__.py`` that raises, so a test that imported the engine would fail.
"""

import sys

import pytest

from moetune.engines.installed import (
    RELEASES,
    current_release,
    find_installed,
    nearest_release,
    version_key,
)

EXPLODES = "raise ImportError('moetune must not import the engine')\n"


def fake_engine(site, engine, version, release=None, *, version_file=True, dist_info=False):
    """`engine` under `site`, laid out like `release` (default: `version`), version recorded."""
    layout = RELEASES[engine][release or version]
    root = site / engine
    for relative in (layout.kernel_source, layout.lookup_source):
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# the engine's module\n")
    (root / layout.configs).mkdir(parents=True, exist_ok=True)
    (root / "__init__.py").write_text(EXPLODES)
    if version_file:
        (root / "_version.py").write_text(
            f"__version__: str\n__version__ = version = '{version}'\n"
        )
    if dist_info:
        info = site / f"{engine}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {engine}\nVersion: {version}\n"
        )
    return root


@pytest.fixture
def site(tmp_path, monkeypatch):
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    for name in ("vllm", "sglang"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return folder


def test_vllm_0_33_0_is_found_without_being_imported(site):
    root = fake_engine(site, "vllm", "0.33.0")
    found = find_installed("vllm")
    assert "vllm" not in sys.modules
    assert (found.engine, found.version, found.release, found.note) == (
        "vllm",
        "0.33.0",
        "0.33.0",
        None,
    )
    assert found.root == root.resolve()
    assert found.kernel_source == root.resolve() / "model_executor/layers/fused_moe/fused_moe.py"
    assert found.configs_dir == root.resolve() / "model_executor/layers/fused_moe/configs"


def test_sglang_0_5_23_keeps_its_kernels_apart_from_its_lookup(site):
    root = fake_engine(site, "sglang", "0.5.23").resolve()
    found = find_installed("sglang")
    assert found.kernel_source == root / "kernels/ops/moe/fused_moe_triton_kernels.py"
    assert found.lookup_source == (
        root / "srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py"
    )
    assert found.config_root == root / "srt/layers/moe/moe_runner/triton_utils"
    assert found.triton_fallback is None  # every triton_* folder, newest first


@pytest.mark.parametrize(
    "version, kernel, fallback",
    [
        ("0.5.10", "srt/layers/moe/fused_moe_triton/fused_moe_triton_kernels.py", "3.4.0"),
        ("0.5.11", "srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_kernels.py", "3.4.0"),
        ("0.5.13", "srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_kernels.py", None),
        ("0.5.16", "kernels/ops/moe/fused_moe_triton_kernels.py", None),
    ],
)
def test_older_sglang_releases(site, version, kernel, fallback):
    root = fake_engine(site, "sglang", version).resolve()
    found = find_installed("sglang")
    assert (found.release, found.note) == (version, None)
    assert found.kernel_source == root / kernel
    assert (found.triton_fallback or (None,))[0] == fallback


def test_an_unknown_version_follows_the_nearest_known_release_with_a_one_line_note(site):
    fake_engine(site, "vllm", "0.33.1", release="0.33.0")
    found = find_installed("vllm")
    assert (found.version, found.release) == ("0.33.1", "0.33.0")
    assert found.note == (
        "vllm 0.33.1 is not a release moetune has read; following 0.33.0, the nearest it knows"
    )
    assert found.kernel_source is not None


def test_the_files_on_disk_win_over_the_version(site):
    # Says 0.5.18 (nearest known: 0.5.16) but is laid out like 0.5.13: the kernels are
    # still in moe_runner/triton_utils/, and that is where moetune must read them.
    root = fake_engine(site, "sglang", "0.5.18", release="0.5.13").resolve()
    found = find_installed("sglang")
    assert found.release == "0.5.15.post1"
    assert found.kernel_source == (
        root / "srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_kernels.py"
    )
    assert "laid out like 0.5.15.post1's" in found.note and "\n" not in found.note


def test_a_package_holding_no_known_file_is_reported(site):
    (site / "sglang").mkdir()
    found = find_installed("sglang")
    assert found.kernel_source is None and found.lookup_source is None
    assert found.release == current_release("sglang")[0]
    assert "holds no fused-MoE lookup" in found.note


def test_version_from_the_dist_info_beside_the_package(site):
    fake_engine(site, "vllm", "0.33.0", version_file=False, dist_info=True)
    assert find_installed("vllm").version == "0.33.0"


def test_no_engine_on_the_path_is_none(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    assert find_installed("sglang") is None


def test_unknown_engine_name():
    with pytest.raises(ValueError, match="unknown engine 'trtllm'"):
        find_installed("trtllm")


@pytest.mark.parametrize(
    "version, expected",
    [
        ("0.5.10.post1", ((0, 5, 10), 1)),
        ("0.33.0+cu130", ((0, 33, 0), 0)),
        ("0.34.0rc1", ((0, 34, 0), 0)),
        ("1.0", ((1, 0, 0), 0)),
        ("dev", ((), 0)),
    ],
)
def test_version_key(version, expected):
    assert version_key(version) == expected


def test_nearest_release_prefers_the_newest_not_newer():
    assert nearest_release("sglang", "0.5.18")[0][0] == "0.5.16"
    assert nearest_release("sglang", "0.5.9")[0][0] == "0.5.10"
    ordered, note = nearest_release("sglang", "0.5.10.post1")
    assert ordered[0] == "0.5.10.post1" and note is None
