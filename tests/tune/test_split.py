"""Split up/down configs: the pair-selection rule on synthetic timings, and the files written."""

import json

import pytest

from moetune.engines.formats import ENGINE_FORMATS
from moetune.engines.tuned_file import validate_tuned_config
from moetune.errors import TuneError
from moetune.kernel.config import Candidate
from moetune.kernel.probe import Probe
from moetune.tune.output import write_engine_files
from moetune.tune.problem import TuneProblem
from moetune.tune.search.split import (
    SplitResult,
    best_per_block_m,
    choose_pair,
    decide,
    split_engines,
)


def cand(bm, bn=64, bk=64, group=1, warps=4, stages=3):
    return Candidate(bm, bn, bk, group, warps, stages)


def up(c, tma=False):
    return Probe("up", c, tma)


def down(c, tma=False):
    return Probe("down", c, tma)


def test_best_per_block_m_keeps_the_fastest_of_each_block_m_over_tma_variants():
    timings = [
        (down(cand(16)), 30.0),
        (down(cand(16), tma=True), 25.0),  # TMA wins at 16
        (down(cand(16, bn=128)), 27.0),
        (down(cand(32)), 20.0),
        (down(cand(32), tma=True), 22.0),
        (down(cand(32, bk=128)), 19.0),  # a second config wins at 32
    ]
    best = best_per_block_m(timings)
    assert list(best) == [16, 32]
    assert best[16] == (down(cand(16), tma=True), 25.0)
    assert best[32] == (down(cand(32, bk=128)), 19.0)


def test_the_pair_is_the_block_m_with_the_smallest_up_plus_down_not_each_gemms_best():
    # Up alone is fastest at BLOCK_SIZE_M 64, down alone at 16; the sum is smallest at 32.
    ups = best_per_block_m([(up(cand(16)), 50.0), (up(cand(32)), 41.0), (up(cand(64)), 40.0)])
    downs = best_per_block_m(
        [(down(cand(16), True), 20.0), (down(cand(32), True), 22.0), (down(cand(64)), 30.0)]
    )
    choice = choose_pair(ups, downs)
    assert choice.block_m == 32
    assert choice.sums == {16: 70.0, 32: 63.0, 64: 70.0}
    assert choice.estimate_us == 63.0
    pair = choice.pair()
    assert pair == Probe("pair", cand(32), False, cand(32), True)
    assert pair.down_config()["USE_TMA"] is True and "USE_TMA" not in pair.up_config()


def test_ties_go_to_the_smaller_block_m_and_block_ms_missing_on_one_side_are_skipped():
    ups = best_per_block_m([(up(cand(16)), 10.0), (up(cand(32)), 10.0), (up(cand(128)), 1.0)])
    downs = best_per_block_m([(down(cand(16)), 10.0), (down(cand(32)), 10.0)])
    assert choose_pair(ups, downs).block_m == 16  # 128 has no down timing
    assert choose_pair(ups, {}) is None


def test_the_split_pair_is_written_only_when_strictly_faster_than_the_single_config():
    assert decide(90.0, 100.0)
    assert not decide(100.0, 100.0)
    assert not decide(101.0, 100.0)
    assert not decide(None, 100.0)  # the pair failed (or TMA was unsupported)
    assert decide(90.0, None)  # the single config failed in the pair harness


def test_a_pair_must_share_block_m():
    with pytest.raises(TuneError, match="share BLOCK_SIZE_M"):
        Probe("pair", cand(16), False, cand(32), True)


def test_probes_read_like_the_config_they_time():
    probe = up(cand(64, bn=128))
    assert probe.BLOCK_SIZE_N == 128 and probe.kind == "up"
    assert probe.short() == "up M64 N128 K64 G1 w4 s3"
    with pytest.raises(AttributeError):
        probe.nonexistent  # noqa: B018


def test_only_sglang_reads_a_down_table_today():
    # The seam for vLLM's planned split (vllm-project/vllm#46338): flip its row.
    assert split_engines(("vllm", "sglang")) == ("sglang",)
    assert not ENGINE_FORMATS["vllm"].tma_key and ENGINE_FORMATS["sglang"].tma_key


SINGLE = {1: cand(16), 512: cand(64, bn=128)}
PROBLEM = TuneProblem(256, 512, 7168, 8, "bf16")


def written(tmp_path, split=None):
    paths = write_engine_files(SINGLE, PROBLEM, "NVIDIA H200", "3.6.0", tmp_path, split=split)
    return [json.loads(path.read_text()) for path in paths], paths


def test_without_a_split_the_down_table_repeats_the_single_config_without_tma(tmp_path):
    (vllm, sglang, sglang_down), paths = written(tmp_path)
    assert paths[2].name == "E=256,N=512,device_name=NVIDIA_H200_down.json"
    for m in ("1", "512"):
        assert vllm[m] == sglang[m] == {k: v for k, v in sglang_down[m].items() if k != "USE_TMA"}
        assert sglang_down[m]["USE_TMA"] is False


def test_a_split_tune_writes_the_pair_to_sglang_and_the_single_config_to_vllm(tmp_path):
    pair = choose_pair(
        best_per_block_m([(up(cand(32, bn=128)), 10.0)]),
        best_per_block_m([(down(cand(32, bk=128), True), 10.0)]),
    )
    split = [
        SplitResult(1, SINGLE[1], 30.0, None, None, split=False),
        SplitResult(512, SINGLE[512], 400.0, pair, 300.0, split=True),
    ]
    (vllm, sglang, sglang_down), paths = written(tmp_path, split)
    assert vllm["512"] == SINGLE[512].as_config()
    assert sglang["512"] == cand(32, bn=128).as_config()  # no USE_TMA key in the up table
    assert sglang_down["512"] == {**cand(32, bk=128).as_config(), "USE_TMA": True}
    assert sglang_down["1"] == {**SINGLE[1].as_config(), "USE_TMA": False}
    # The same batch-size keys in both tables, and one BLOCK_SIZE_M per key.
    assert list(sglang) == list(sglang_down)
    assert all(sglang[m]["BLOCK_SIZE_M"] == sglang_down[m]["BLOCK_SIZE_M"] for m in sglang)
    validate_tuned_config(paths[2], "sglang")  # down schema chosen from the name


ENTRY = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 128,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 16,
    "num_warps": 4,
    "num_stages": 2,
}


def test_sglangs_own_down_file_validates(tmp_path):
    # Two entries of SGLang's E=257,N=256,...,NVIDIA_H200,...block_shape=[128, 128]_down.json
    # (configs/triton_3_5_1, sgl-project/sglang@16739a6).
    name = "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json"
    path = tmp_path / name
    path.write_text(
        json.dumps({"1": {**ENTRY, "USE_TMA": True}, "512": {**ENTRY, "USE_TMA": True}})
    )
    validate_tuned_config(path, "sglang")


@pytest.mark.parametrize(
    "payload, engine, down, message",
    [
        ({"1": {**ENTRY, "USE_TMA": True}}, "vllm", False, "should not be valid"),
        ({"1": ENTRY}, "sglang", True, "'USE_TMA' is a required property"),
        ({"1": {**ENTRY, "USE_TMA": 1}}, "sglang", True, "1 is not of type 'boolean'"),
    ],
)
def test_use_tma_is_sglang_only_and_required_in_down_tables(payload, engine, down, message):
    with pytest.raises(TuneError, match=message):
        validate_tuned_config(payload, engine, down=down)


def test_a_vllm_down_table_holds_pairs_with_use_tma_true_and_guard_entries_alone():
    # vLLM 0.34's _down.json (moetune.tune.search.split_vllm): a config runs only with
    # USE_TMA true; elsewhere a guard entry of USE_TMA false alone, as vLLM ships them.
    validate_tuned_config(
        {"1": {"USE_TMA": False}, "64": {**ENTRY, "USE_TMA": True}}, "vllm", down=True
    )
    for entry in ({**ENTRY, "USE_TMA": False}, ENTRY, {"USE_TMA": True}):
        with pytest.raises(TuneError, match="batch size 1"):
            validate_tuned_config({"1": entry}, "vllm", down=True)


# tune_split's orchestration (thorough search, filling, confirming) over a scripted GPU.


class ScriptedGPU:
    """Analytic per-GEMM and whole-call latencies for probes; `pair_penalty` shifts pairs."""

    UP = {16: 10.0, 32: 8.0, 64: 9.0}
    DOWN = {16: 5.0, 32: 7.0, 64: 4.0}

    def __init__(self, pair_penalty=0.0):
        self.pair_penalty = pair_penalty
        self.calls = []

    def gemm(self, kind, c, tma):
        base = (self.UP if kind == "up" else self.DOWN)[c.BLOCK_SIZE_M]
        shape = 0.01 * abs(c.BLOCK_SIZE_N - 128) / 32 + 0.01 * abs(c.BLOCK_SIZE_K - 64) / 32
        return base + shape + 0.001 * c.GROUP_SIZE_M - (2.0 if tma else 0.0)

    def latency(self, probe):
        if probe.kind in ("up", "down"):
            return self.gemm(probe.kind, probe.candidate, probe.use_tma)
        total = self.gemm("up", probe.candidate, probe.use_tma)
        total += self.gemm("down", probe.down, probe.down_tma)
        return total + (0.0 if probe == Probe.single(probe.candidate) else self.pair_penalty)

    def measure(self, batch_size, probes, fidelity):
        from moetune.tune.store import Measurement

        out = {}
        for probe in probes:
            self.calls.append((batch_size, probe, fidelity))
            us = self.latency(probe)
            out[probe] = Measurement(
                "p", batch_size, probe, fidelity, "ok", us, us, us, 0.1, None, "gpu", "3.6.0",
                "0", 0.0,
            )  # fmt: skip
        return out


class PassingBackend:
    def __init__(self):
        self.verified = []

    def run(self, units):
        from moetune.tune.measure.timing import Outcome

        for unit in units:
            for candidate in unit.candidates:
                self.verified.append((unit.batch_size, candidate))
                yield unit, Outcome(candidate, "ok", rel_rms=0.001)


def split_plan(tmp_path, search="fast"):
    from moetune.device import DeviceLimits
    from moetune.tune.runner import TuneRequest, make_plan
    from moetune.tune.search.space import grid

    space = grid(
        {
            "BLOCK_SIZE_M": [16, 32, 64],
            "BLOCK_SIZE_N": [32, 64, 128, 256],
            "BLOCK_SIZE_K": [32, 64, 128],
            "GROUP_SIZE_M": [1, 16],
            "num_warps": [4],
            "num_stages": [3, 4],
        }
    )
    request = TuneRequest(
        problem=TuneProblem(64, 256, 1024, 4, "bf16"),
        batch_sizes=(256, 512),
        space=tuple(space),
        save_dir=tmp_path,
        engines=("sglang",),
        search=search,
        device_name="gpu",
        triton_version="3.6.0",
    )
    return make_plan(request, DeviceLimits.h200())


@pytest.mark.parametrize("search", ["thorough", "exhaustive"])
def test_tune_split_picks_the_block_m_of_the_smallest_sum_and_confirms_it(tmp_path, search):
    from moetune.tune.search.split_search import tune_split

    plan = split_plan(tmp_path, search)
    single = Candidate(32, 128, 64, 1, 4, 3)
    gpu, backend, notes = ScriptedGPU(), PassingBackend(), []
    results = tune_split(plan, gpu, backend, {256: single, 512: single}, notes)
    for result in results:
        # Sums per BLOCK_SIZE_M: 16: 10 + 3, 32: 8 + 5, 64: 9 + 2 (down with TMA): 64 wins.
        assert result.choice.block_m == 64 and result.split
        assert result.up_entry()["BLOCK_SIZE_M"] == result.down_entry()["BLOCK_SIZE_M"] == 64
        assert result.down_entry()["USE_TMA"] is True and "USE_TMA" not in result.up_entry()
        assert result.up_entry()["BLOCK_SIZE_N"] == 128  # the per-GEMM optimum, found
        assert result.pair_us < result.single_us
    # Each written pair was checked against the reference; nothing else was.
    assert sorted(m for m, _ in backend.verified) == [256, 512]
    full_pairs = [c for c in gpu.calls if c[1].kind == "pair"]
    assert all(fidelity == "full" for _, _, fidelity in full_pairs)
    if search == "thorough":  # fast search timed only part of each GEMM's 144-config space
        ups = {c[1] for c in gpu.calls if c[1].kind == "up" and c[0] == 256}
        assert len(ups) < 144


def test_tune_split_keeps_the_single_config_when_the_pair_is_slower_as_a_whole(tmp_path):
    from moetune.tune.search.split_search import tune_split

    plan = split_plan(tmp_path, "exhaustive")
    single = Candidate(32, 128, 64, 1, 4, 3)
    backend = PassingBackend()
    results = tune_split(
        plan, ScriptedGPU(pair_penalty=50.0), backend, {256: single, 512: single}, []
    )
    for result in results:
        assert not result.split and result.pair_us > result.single_us
        assert result.up_entry() == single.as_config()
        assert result.down_entry() == {**single.as_config(), "USE_TMA": False}
    assert backend.verified == []
