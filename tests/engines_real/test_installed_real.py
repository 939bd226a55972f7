"""`find_installed` on the released wheels' files: exact release, no note, the right files."""

import ast
import shutil
import sys

import pytest

from moetune.engines.installed import ENGINES, find_installed

pytestmark = pytest.mark.engines


def functions(path):
    """{name: FunctionDef} of the module-level functions in `path`."""
    tree = ast.parse(path.read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_the_sites_releases_are_found_exactly_and_never_imported(engines_site, site_releases):
    for engine, version in site_releases.items():
        found = find_installed(engine)
        assert (found.version, found.release, found.note) == (version, version, None)
        assert found.root == (engines_site / engine).resolve()
    assert not {"vllm", "sglang"} & set(sys.modules)


@pytest.mark.parametrize("engine", ENGINES)
def test_kernel_source_holds_the_triton_fused_moe_kernel(engine, engines_site):
    kernel = functions(find_installed(engine).kernel_source)["fused_moe_kernel"]
    assert any("jit" in ast.unparse(decorator) for decorator in kernel.decorator_list)


def test_lookup_sources_hold_the_lookups(vllm_installed, sglang_installed):
    lookups = {"get_config_file_name", "get_moe_configs", "try_get_optimal_moe_config"}
    assert lookups <= set(functions(vllm_installed.lookup_source))
    assert lookups <= set(functions(sglang_installed.lookup_source))
    # vLLM's lookup reads <folder of fused_moe.py>/configs; SGLang's <its folder>/configs.
    assert vllm_installed.configs_dir == vllm_installed.lookup_source.parent / "configs"
    assert sglang_installed.configs_dir == sglang_installed.lookup_source.parent / "configs"


# vLLM's H200 files, per release (0.34.0 adds two `_down.json` files).
VLLM_H200_FILES = {"0.33.0": 52, "0.34.0": 54}


def test_the_shipped_h200_files_are_where_the_layout_says(vllm_installed, sglang_installed):
    h200 = list(vllm_installed.configs_dir.glob("*device_name=NVIDIA_H200*.json"))
    assert len(h200) == VLLM_H200_FILES[vllm_installed.version]
    triton_3_6_0 = sglang_installed.configs_dir / "triton_3_6_0"
    assert len(list(triton_3_6_0.glob("*device_name=NVIDIA_H200*.json"))) == 12  # of 26 files
    assert (triton_3_6_0 / "E=128,N=768,device_name=NVIDIA_H200.json").is_file()
    folders = sorted(p.name for p in sglang_installed.configs_dir.glob("triton_*"))
    assert folders[0] == "triton_3_1_0" and folders[-1] == "triton_3_8_0"


def test_a_newer_release_follows_the_nearest_known_one(tmp_path, monkeypatch, engines_site):
    site = tmp_path / "site"
    shutil.copytree(engines_site / "vllm", site / "vllm")
    (site / "vllm" / "_version.py").write_text("__version__ = version = '0.33.1'\n")
    monkeypatch.syspath_prepend(str(site))
    found = find_installed("vllm")
    assert (found.version, found.release) == ("0.33.1", "0.33.0")
    assert found.note == (
        "vllm 0.33.1 is not a release moetune has read; following 0.33.0, the nearest it knows"
    )
    assert found.kernel_source == (site / "vllm/model_executor/layers/fused_moe/fused_moe.py")
