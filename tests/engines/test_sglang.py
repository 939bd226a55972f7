"""SGLang's fallback config and its lookup with the Triton-version scan and the _down twin.

Expected values: SGLang 0.5.23's
sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py
(`get_default_config`, `get_moe_configs`, `try_get_optimal_moe_config`); the fixed
fallback list: 0.5.10 and 0.5.11's.
"""

import json

import pytest

from moetune.engines import sglang
from moetune.engines.installed import InstalledEngine

NAME = "E=128,N=768,device_name=NVIDIA_H200.json"
DOWN = "E=128,N=768,device_name=NVIDIA_H200_down.json"
KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


@pytest.mark.parametrize(
    ("M", "E", "dtype", "block", "expected"),
    [
        # not fp8 (bf16/fp16/int8/int4): M <= E -> 16x32x64 G1, else 64x64x32 G8; no warps/stages
        (128, 128, None, None, (16, 32, 64, 1)),
        (129, 128, None, None, (64, 64, 32, 8)),
        (8, 8, "int8_w8a16", None, (16, 32, 64, 1)),
        # fp8 per tensor: 64x128x128 G1 w4 s4 while M <= E, else 128x256x128 G32 w8 s4
        (8, 8, "fp8_w8a8", None, (64, 128, 128, 1, 4, 4)),
        (9, 8, "fp8_w8a8", None, (128, 256, 128, 32, 8, 4)),
        # fp8 block: tiles from the block, at every M
        (1, 256, "fp8_w8a8", (128, 128), (64, 128, 128, 32, 4, 3)),
        (4096, 256, "fp8_w8a8", (128, 128), (64, 128, 128, 32, 4, 3)),
    ],
)
def test_default_config(M, E, dtype, block, expected):
    assert sglang.default_config(M, E, 768, 2048, 8, dtype, block) == dict(
        zip(KEYS, expected, strict=False)
    )


def layout(root, *folders, files=(NAME,)):
    for folder in folders:
        (root / "configs" / folder).mkdir(parents=True, exist_ok=True)
        for name in files:
            (root / "configs" / folder / name).write_text("{}")
    (root / "configs").mkdir(parents=True, exist_ok=True)
    return root


def test_the_installed_tritons_folder_wins(tmp_path):
    root = layout(tmp_path, "triton_3_4_0", "triton_3_6_0")
    hit = sglang.lookup(NAME, "3.6.0", env={"SGLANG_MOE_CONFIG_DIR": str(root)}, package=None)
    assert hit.found == root / "configs" / "triton_3_6_0" / NAME
    assert hit.triton_folder == "triton_3_6_0"
    assert hit.searched[0] == str(root / "configs" / "triton_3_6_0" / NAME)


def test_a_miss_scans_other_versions_newest_first_skipping_the_installed_one(tmp_path):
    root = layout(tmp_path, "triton_3_2_0", "triton_3_10_0", "triton_3_5_1")
    (root / "configs" / "triton_3_6_0").mkdir()  # the installed version's folder, without the file
    hit = sglang.lookup(NAME, "3.6.0", env={}, package=root)
    # numeric order: 3.10.0 is newer than 3.5.1 (and newer than the installed 3.6.0)
    assert [p.split("/")[-2] for p in hit.searched] == [
        "triton_3_6_0",
        "triton_3_10_0",
        "triton_3_5_1",
        "triton_3_2_0",
    ]
    assert hit.found == root / "configs" / "triton_3_10_0" / NAME
    assert hit.triton_folder == "triton_3_10_0"
    assert any("falls back to triton_3_10_0" in note for note in hit.notes)


def test_env_dir_replaces_the_package_dir(tmp_path):
    package = layout(tmp_path / "package", "triton_3_6_0")
    user = layout(tmp_path / "user")
    miss = sglang.lookup(NAME, "3.6.0", env={"SGLANG_MOE_CONFIG_DIR": str(user)}, package=package)
    assert miss.found is None  # SGLang never looks in its own package then
    assert all(path.startswith(str(user)) for path in miss.searched)
    assert "get_default_config" in miss.fallback


def test_a_missing_down_file_falls_back_to_the_up_config_without_tma(tmp_path):
    root = layout(tmp_path, "triton_3_6_0")
    up, down = sglang.lookup_pair(NAME, "3.6.0", env={}, package=root)
    assert up.present and not down.present
    assert down.file_name == DOWN
    assert down.fallback == "the down GEMM reuses the up config, without TMA"

    layout(tmp_path, "triton_3_5_1", files=(DOWN,))
    up, down = sglang.lookup_pair(NAME, "3.6.0", env={}, package=root)
    assert down.found == root / "configs" / "triton_3_5_1" / DOWN  # the scan applies to _down too


def test_a_missing_down_file_with_up_tma_entries_says_sglang_runs_the_down_gemm_with_tma(
    tmp_path,
):
    root = layout(tmp_path, "triton_3_6_0")
    tile = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1}
    table = {"1": tile, "512": {**tile, "USE_TMA": True}, "1024": {**tile, "USE_TMA": True}}
    (root / "configs" / "triton_3_6_0" / NAME).write_text(json.dumps(table))
    up, down = sglang.lookup_pair(NAME, "3.6.0", env={}, package=root)
    assert not down.present
    assert down.fallback == (
        "the down GEMM reuses the up config, USE_TMA included: where the up entry asks for "
        "TMA (M 512, 1024) the down GEMM runs with TMA and the up GEMM writes sorted rows"
    )


def test_check_calls_a_file_sglangs_launch_would_fail_on_invalid(tmp_path):
    from moetune.engines.check import checked

    root = layout(tmp_path, "triton_3_6_0")
    tile = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1}
    path = root / "configs" / "triton_3_6_0" / NAME
    path.write_text(json.dumps({"1": tile}))
    up, _ = sglang.lookup_pair(NAME, "3.6.0", env={}, package=root)
    assert checked(up, "sglang").invalid is None
    path.write_text(json.dumps({"1": tile, "8": {**tile, "SPLIT_K": 1}}))
    assert checked(up, "sglang").invalid == (
        f'{path}: batch size 8: config "SPLIT_K": SGLang passes every key of an entry to its '
        "fused_moe_kernel, which has no such parameter (Triton raises KeyError at the first call)"
    )


def test_folders_sglang_cannot_sort_and_a_missing_configs_folder_are_reported(tmp_path):
    root = layout(tmp_path, "triton_3_5_1", "triton_3_5_1_post1")
    (root / "configs" / "triton_3_5_1_post1" / NAME).unlink()
    (root / "configs" / "triton_main").mkdir()
    hit = sglang.lookup(NAME, "3.6.0", env={}, package=root)
    assert hit.triton_folder == "triton_3_5_1"
    assert any("triton_main" in note for note in hit.notes)
    empty = sglang.lookup(NAME, "3.6.0", env={"SGLANG_MOE_CONFIG_DIR": str(tmp_path / "none")})
    assert empty.found is None and any("does not exist" in note for note in empty.notes)


def test_without_triton_only_the_scan_is_known(tmp_path):
    root = layout(tmp_path, "triton_3_4_0")
    hit = sglang.lookup(NAME, None, env={}, package=root)
    assert hit.found == root / "configs" / "triton_3_4_0" / NAME
    assert any("triton is not installed" in note for note in hit.notes)


OLD_FALLBACK = ("3.4.0", "3.3.1", "3.2.0", "3.1.0")


def test_releases_up_to_0_5_11_try_a_fixed_list_of_other_folders(tmp_path):
    # 0.5.10/0.5.11 never look at triton_3_5_1, even though it is newer and holds the file.
    root = layout(tmp_path, "triton_3_5_1", "triton_3_3_1")
    hit = sglang.lookup(NAME, "3.6.0", env={}, package=root, triton_fallback=OLD_FALLBACK)
    assert [p.split("/")[-2] for p in hit.searched] == [
        "triton_3_6_0",
        "triton_3_4_0",
        "triton_3_3_1",
        "triton_3_2_0",
        "triton_3_1_0",
    ]
    assert hit.triton_folder == "triton_3_3_1"


def test_the_installed_release_decides_the_fallback_and_its_note_is_shown(tmp_path, monkeypatch):
    root = layout(tmp_path / "sglang" / "srt/layers/moe/moe_runner/triton_utils", "triton_3_5_1")
    installed = InstalledEngine(
        engine="sglang",
        version="0.5.11.post9",
        root=tmp_path / "sglang",
        kernel_source=None,
        configs_dir=root / "configs",
        lookup_source=None,
        release="0.5.11",
        triton_fallback=OLD_FALLBACK,
        note="sglang 0.5.11.post9 is not a release moetune has read; following 0.5.11",
    )
    monkeypatch.setattr(sglang, "installed", lambda: installed)
    up, down = sglang.lookup_pair(NAME, "3.6.0", env={})
    assert up.found is None and len(up.searched) == 5
    assert installed.note in up.notes and installed.note in down.notes
    assert sglang.package_root() == root


def test_an_empty_env_var_is_sglangs_cwd(tmp_path):
    # os.environ.get("SGLANG_MOE_CONFIG_DIR", <its folder>) returns "" when set empty.
    package = layout(tmp_path / "package", "triton_3_6_0")
    hit = sglang.lookup(NAME, "3.6.0", env={"SGLANG_MOE_CONFIG_DIR": ""}, package=package)
    assert hit.searched[0] == f"configs/triton_3_6_0/{NAME}"
    assert any("set but empty" in note for note in hit.notes)


def test_the_scan_probes_the_folder_sglang_names_not_the_one_it_listed(tmp_path):
    # "triton_3.5.1" sorts as 3.5.1, but SGLang then opens triton_3_5_1/.
    root = layout(tmp_path, "triton_3.5.1")
    hit = sglang.lookup(NAME, "3.6.0", env={}, package=root)
    assert hit.searched[1] == str(root / "configs" / "triton_3_5_1" / NAME)
    assert hit.found is None
    # and a folder of the installed Triton's version is skipped however it is spelled
    assert len(sglang.lookup(NAME, "3.5.1", env={}, package=root).searched) == 1
