"""Reading a tuned file as the engine does: SGLang's _down table is paired with its main file."""

import json

import pytest

from moetune.engines.tuned_file import (
    as_pair,
    describe,
    down_table_path,
    load_tuned_file,
    same_harness,
)
from moetune.errors import MoetuneError
from moetune.kernel.config import Candidate
from moetune.kernel.probe import Probe

NAME = "E=128,N=768,device_name=NVIDIA_H200,dtype=int8_w8a8,per_channel_quant=True.json"
TILE = {"BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4}


def row(block_m, stages=3, **extra):
    return {"BLOCK_SIZE_M": block_m, **TILE, "num_stages": stages, **extra}


def write(path, table):
    path.write_text(json.dumps(table))
    return path


def test_the_down_table_is_named_as_sglang_looks_it_up(tmp_path):
    assert down_table_path(tmp_path / NAME).name == NAME.removesuffix(".json") + "_down.json"


def test_a_file_without_down_table_gives_one_config_at_the_nearest_key(tmp_path):
    tuned = load_tuned_file(write(tmp_path / NAME, {"1": row(16), "64": row(32), "256": row(64)}))
    assert tuned.down is None and tuned.down_path is None
    assert tuned.pick(1) == Candidate(16, 64, 128, 1, 4, 3)
    assert tuned.pick(100).BLOCK_SIZE_M == 32  # 64 is nearer than 256, as the engines take it
    assert tuned.pick(4096).BLOCK_SIZE_M == 64
    assert same_harness([tuned.pick(m) for m in (1, 64)])


def test_each_table_is_looked_up_on_its_own_and_tma_is_kept(tmp_path):
    main = write(tmp_path / NAME, {"1": row(16, 4), "512": row(64, 4)})
    # The down table has other keys: SGLang takes each table's own nearest key.
    write(down_table_path(main), {"1": row(16, 5, USE_TMA=False), "2048": row(64, 2, USE_TMA=True)})
    tuned = load_tuned_file(main)
    assert tuned.down_path == down_table_path(main)
    small = tuned.pick(8)
    assert small == Probe(
        "pair", Candidate(16, 64, 128, 1, 4, 4), False, Candidate(16, 64, 128, 1, 4, 5)
    )
    big = tuned.pick(4096)
    assert big.down_tma and not big.use_tma and big.down.num_stages == 2
    assert not same_harness([Candidate(16, 64, 128, 1, 4, 4), big])
    assert describe(big)["down_config"]["USE_TMA"] is True
    assert "down_config" not in describe(Candidate(16, 64, 128, 1, 4, 4))


def test_the_down_rows_block_m_is_forced_to_the_up_rows_as_sglang_does(tmp_path):
    main = write(tmp_path / NAME, {"1": row(16), "1024": row(128)})
    write(down_table_path(main), {"1": row(16, USE_TMA=False), "1024": row(64, USE_TMA=False)})
    pick = load_tuned_file(main).pick(1024)
    assert pick.candidate.BLOCK_SIZE_M == pick.down.BLOCK_SIZE_M == 128
    assert pick.down.BLOCK_SIZE_N == 64 and pick.down.num_stages == 3


def test_a_down_table_found_elsewhere_can_be_named(tmp_path):
    main = write(tmp_path / NAME, {"1": row(16)})
    (tmp_path / "other").mkdir()
    elsewhere = write(tmp_path / "other" / down_table_path(main).name, {"1": row(16, 5)})
    tuned = load_tuned_file(main, elsewhere)
    assert tuned.down_path == elsewhere and tuned.pick(1).down.num_stages == 5


def test_passing_the_down_table_itself_names_the_main_file(tmp_path):
    down = write(tmp_path / NAME.replace(".json", "_down.json"), {"1": row(16, USE_TMA=False)})
    with pytest.raises(MoetuneError, match=f"pass its main file {NAME}"):
        load_tuned_file(down)


@pytest.mark.parametrize(
    "entry, message",
    [
        (row(16, USE_TMA="yes"), "config \"USE_TMA\": 'yes' is not of type 'boolean'"),
        (row(16, SPLIT_N=2), "Additional properties are not allowed \\('SPLIT_N'"),
        ({"BLOCK_SIZE_M": 16}, "'BLOCK_SIZE_N' is a required property"),
        (row(16, kpack=2), "unknown key\\(s\\) kpack"),  # ROCm's: in the schema, not timed here
    ],
)
def test_bad_rows_name_the_file_and_batch_size(tmp_path, entry, message):
    path = write(tmp_path / NAME, {"8": entry})
    with pytest.raises(MoetuneError, match=f"{NAME}: batch size 8: .*{message}"):
        load_tuned_file(path)


def test_up_tma_without_down_table_runs_both_gemms_with_tma_as_sglang_does(tmp_path):
    # SGLang reads the up table again for the down GEMM and pops USE_TMA from both copies.
    tuned = load_tuned_file(write(tmp_path / NAME, {"1": row(16, USE_TMA=True), "64": row(32)}))
    pick = tuned.pick(1)
    assert pick.use_tma and pick.down_tma and pick.down == pick.candidate
    assert describe(pick)["down_config"]["USE_TMA"] is True
    assert tuned.pick(64) == Candidate(32, 64, 128, 1, 4, 3)  # no TMA: one plain config


def test_as_pair_times_a_single_config_as_the_pair_of_itself():
    single = Candidate(16, 64, 128, 1, 4, 4)
    assert as_pair(single) == Probe.single(single)
    pair = Probe("pair", single, True, single, False)
    assert as_pair(pair) is pair
