"""vLLM's fallback config and lookup, ported in moetune.engines.vllm.

Expected values are read off vLLM 0.33.0's `get_default_config` and
`get_moe_configs` (vllm/model_executor/layers/fused_moe/fused_moe.py in its wheel).
"""

import json

import pytest

from moetune.engines import vllm
from moetune.engines.installed import InstalledEngine
from moetune.engines.lookup import nearest_row

# (M, E, dtype, block_shape) -> (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages)
GENERAL = [
    # bf16, E=128 (Qwen3-30B-A3B): block_m 16 up to M=32, 32 up to 96, 64 up to 512, then 128
    (1, 128, None, None, (16, 64, 128, 1, 4, 4)),
    (32, 128, None, None, (16, 64, 128, 1, 4, 4)),
    (33, 128, None, None, (32, 64, 128, 1, 4, 3)),  # num_stages 4 only while M <= 32
    (64, 128, None, None, (32, 64, 128, 1, 4, 3)),
    (65, 128, None, None, (32, 128, 64, 1, 4, 3)),  # N tile 128 and K tile 64 past M = 64
    (96, 128, None, None, (32, 128, 64, 1, 4, 3)),
    (128, 128, None, None, (64, 128, 64, 1, 4, 3)),
    (129, 128, None, None, (64, 128, 64, 1, 8, 3)),  # 8 warps past M = 128
    (512, 128, None, None, (64, 128, 64, 1, 8, 3)),
    (513, 128, None, None, (128, 128, 64, 1, 8, 3)),
    (4096, 128, None, None, (128, 128, 64, 1, 8, 3)),  # M // E = 32: no grouping
    # Mixtral (E=8): M // E > 128 from M = 1032 on, GROUP_SIZE_M 16
    (1024, 8, None, None, (128, 128, 64, 1, 8, 3)),
    (1032, 8, None, None, (128, 128, 64, 16, 8, 3)),
    # fp8 per tensor: same branch, K tile always 128
    (4096, 8, "fp8_w8a8", None, (128, 128, 128, 16, 8, 3)),
    # int8 weights without a group block: the general branch too
    (16, 8, "int8_w8a16", None, (16, 64, 128, 1, 4, 4)),
]
FP8_BLOCK = [
    # fp8 block [128, 128]: M tile 16 up to M = 64, group 1 up to M = 16; up to M = 8 an N
    # tile of 64 (0.33.0), with 4 stages up to M = 4
    (1, (16, 64, 128, 1, 4, 4)),
    (4, (16, 64, 128, 1, 4, 4)),
    (5, (16, 64, 128, 1, 4, 3)),
    (8, (16, 64, 128, 1, 4, 3)),
    (9, (16, 128, 128, 1, 4, 3)),
    (16, (16, 128, 128, 1, 4, 3)),
    (17, (16, 128, 128, 32, 4, 3)),
    (64, (16, 128, 128, 32, 4, 3)),
    (65, (64, 128, 128, 32, 4, 3)),
]
KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


@pytest.mark.parametrize(("M", "E", "dtype", "block", "expected"), GENERAL)
def test_general_branch(M, E, dtype, block, expected):
    config = vllm.default_config(M, E, 768, 2048, 8, dtype, block)
    assert config == {**dict(zip(KEYS, expected, strict=True)), "SPLIT_K": 1}


@pytest.mark.parametrize(("M", "expected"), FP8_BLOCK)
def test_fp8_block_branch_follows_the_block(M, expected):
    config = vllm.default_config(M, 256, 256, 7168, 8, "fp8_w8a8", [128, 128])
    assert config == {**dict(zip(KEYS, expected, strict=True)), "SPLIT_K": 1}


def test_wna16_branch_sets_only_the_m_tile():
    # int4, group 128, M * topk / E = 10 > 6: the Triton WNA16 kernel, M tile by M.
    assert vllm.default_config(20, 4, 768, 2048, 2, "int4_w4a16", [0, 128]) == {
        "BLOCK_SIZE_M": 16,
        "GROUP_SIZE_M": 1,
        "SPLIT_K": 1,
    }
    assert vllm.default_config(41, 8, 768, 2048, 2, "int8_w8a16", [0, 128])["BLOCK_SIZE_M"] == 64
    # int4 with M * topk / E <= 6: vLLM's CUDA WNA16 kernel, BLOCK_SIZE_M the next power
    # of two of M up to 16
    assert vllm.default_config(3, 128, 768, 2048, 8, "int4_w4a16", [0, 128]) == {
        "BLOCK_SIZE_M": 4,
        "GROUP_SIZE_M": 1,
        "SPLIT_K": 1,
    }
    assert vllm.default_config(9, 128, 768, 2048, 8, "int4_w4a16", [0, 128])["BLOCK_SIZE_M"] == 16


def test_fp8_block_n_tile_stays_the_block_when_it_is_not_a_multiple_of_64():
    assert vllm.default_config(1, 8, 768, 2048, 8, "fp8_w8a8", [32, 128])["BLOCK_SIZE_N"] == 32


def test_lookup_tries_the_env_folder_then_the_package(tmp_path):
    name = "E=128,N=768,device_name=NVIDIA_H200.json"
    user, package = tmp_path / "user", tmp_path / "package"
    user.mkdir()
    package.mkdir()
    env = {"VLLM_TUNED_CONFIG_FOLDER": str(user)}

    miss = vllm.lookup(name, env=env, package_configs=package)
    assert miss.searched == (str(user / name), str(package / name))
    assert miss.found is None and "get_default_config" in miss.fallback

    (package / name).write_text("{}")
    assert vllm.lookup(name, env=env, package_configs=package).found == package / name
    (user / name).write_text("{}")
    assert vllm.lookup(name, env=env, package_configs=package).found == user / name
    # Without the env var, only the package folder.
    assert vllm.lookup(name, env={}, package_configs=package).searched == (str(package / name),)


def test_lookup_without_vllm_installed_says_so(tmp_path):
    lookup = vllm.lookup("x.json", env={}, package_configs=None, extra_dirs=(tmp_path,))
    assert lookup.searched == (str(tmp_path / "x.json"),)
    assert any("not installed" in note for note in lookup.notes)


def test_nearest_row_is_the_engines_min_abs_rule():
    table = json.loads('{"1": "a", "16": "b", "64": "c"}')
    table = {int(k): v for k, v in table.items()}
    assert [nearest_row(table, m) for m in (1, 8, 9, 40, 41, 5000)] == [
        "a",
        "a",
        "b",
        "b",
        "c",
        "c",
    ]


def test_file_name_is_vllms():
    assert (
        vllm.file_name(256, 256, "NVIDIA H200 NVL", "fp8_w8a8", (128, 128))
        == "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    )


def test_an_empty_env_var_is_vllms_cwd(tmp_path):
    # vLLM tests VLLM_TUNED_CONFIG_FOLDER against None: "" joins to the bare name.
    name = "E=8,N=14336,device_name=NVIDIA_H200.json"
    lookup = vllm.lookup(name, env={"VLLM_TUNED_CONFIG_FOLDER": ""}, package_configs=tmp_path)
    assert lookup.searched == (name, str(tmp_path / name))
    assert any("set but empty" in note for note in lookup.notes)


def test_batch_invariant_mode_is_noted(tmp_path):
    notes = vllm.lookup("x.json", env={"VLLM_BATCH_INVARIANT": "1"}, package_configs=None).notes
    assert any("ignores tuned files" in note for note in notes)
    notes = vllm.lookup("x.json", env={"VLLM_BATCH_INVARIANT": "0"}, package_configs=None).notes
    assert not any("ignores tuned files" in note for note in notes)


def test_the_installed_release_note_is_shown(tmp_path, monkeypatch):
    installed = InstalledEngine(
        engine="vllm",
        version="0.33.1",
        root=tmp_path,
        kernel_source=None,
        configs_dir=tmp_path / "configs",
        lookup_source=None,
        release="0.33.0",
        note="vllm 0.33.1 is not a release moetune has read; following 0.33.0",
    )
    monkeypatch.setattr(vllm, "installed", lambda: installed)
    lookup = vllm.lookup("x.json", env={})
    assert lookup.searched == (str(tmp_path / "configs" / "x.json"),)
    assert installed.note in lookup.notes
    assert vllm.package_config_dir() == tmp_path / "configs"
