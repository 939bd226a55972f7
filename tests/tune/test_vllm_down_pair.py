"""vLLM 0.34's down file (``<name>_down.json``): when it is tuned, the pair search, the file.

The conditions per case (hidden size, block shape, GPU, release, kernel), the plan lines,
and a tune over a stand-in backend (no kernel runs: the sorted path needs sm90 or the
interpreter, tests/engines_real/test_vllm_down_pair_real.py runs it) where the sorted
down GEMM is faster as a whole call at some batch sizes, or only alone.
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from moetune.device import DeviceLimits
from moetune.engines import vllm
from moetune.engines.launch import KernelRef
from moetune.engines.tuned_file import validate_tuned_config
from moetune.kernel.config import Candidate
from moetune.kernel.probe import Probe
from moetune.tune.measure.worker import Outcome
from moetune.tune.runner import TuneRequest, make_plan, plan_json, plan_lines, run_tune
from moetune.tune.search.split import PairChoice, SplitResult
from moetune.tune.search.split_vllm import (
    down_file_applies,
    down_file_refusal,
    down_plan_lines,
    down_table,
    settle,
    tunes_down_file,
)

sys.path.insert(0, str(Path(__file__).parent))
from synthetic import DEEPSEEK_V3_TP8, SyntheticGPU  # noqa: E402

VLLM_034 = KernelRef("vllm", "0.34.0", "0.34.0", "/site/vllm/fused_moe.py", "0123456789ab")
H200 = DeviceLimits.h200()
B200 = replace(H200, name="NVIDIA B200", compute_capability=(10, 0))
ON_034 = replace(DEEPSEEK_V3_TP8, kernel=VLLM_034)  # E=256, I=256, H=7168, block [128, 128]
SPACE = tuple(
    Candidate(bm, bn, bk, group, 4, stages)
    for bm in (16, 64)
    for bn in (128, 256)
    for bk in (64, 128)
    for group in (1, 16)
    for stages in (3, 4)
)
# M=4: 4 * 8 * 4 <= 256 experts, vLLM's naive path (no alignment, no sorted path).
BATCH_SIZES = (4, 64, 256)


@pytest.mark.parametrize(
    ("problem", "capability", "release", "reason"),
    [
        (ON_034, (9, 0), "0.34.0", None),
        (replace(ON_034, hidden_size=2048), (9, 0), "0.34.0", "hidden size 2048 < 4096"),
        (ON_034, (10, 0), "0.34.0", "compute capability 9.0 only, not 10.0"),
        (ON_034, None, "0.34.0", "compute capability 9.0 only, not unknown"),
        (replace(ON_034, kernel=None), (9, 0), "0.34.0", "vLLM 0.34.0's own kernel"),
        (ON_034, (9, 0), "0.33.0", "vLLM 0.33.0 reads no _down.json"),
    ],
)
def test_where_vllm_reads_a_down_file(problem, capability, release, reason):
    found = down_file_refusal(problem, release, capability)
    assert (found is None) == (reason is None)
    if reason is not None:
        assert reason in found
    assert down_file_applies(problem, release, capability) is (reason is None)


def test_no_down_file_for_another_block_shape_or_dtype():
    for problem in (
        replace(ON_034, block_shape=(64, 64)),
        replace(ON_034, dtype="bf16", block_shape=None),
    ):
        assert not down_file_applies(problem, "0.34.0", (9, 0))
        assert down_file_refusal(problem, "0.34.0", (9, 0)) is None  # silent: never looked up


def _request(tmp_path, problem=ON_034, **extra):
    values = dict(
        problem=problem,
        batch_sizes=BATCH_SIZES,
        space=SPACE,
        save_dir=tmp_path,
        engines=("vllm",),
        device_name="NVIDIA H200",
        triton_version="3.6.0",
        vllm_release="0.34.0",
        vllm_deepgemm=True,
    )
    values.update(extra)
    return TuneRequest(**values)


def _down_lines(plan):
    return [
        line
        for line in plan_lines(plan)
        if line.startswith("vLLM down:") or "reads it only with" in line or "DeepGEMM E8M0" in line
    ]


def test_the_plan_states_when_the_down_file_is_tuned_and_when_vllm_reads_it(tmp_path):
    plan = make_plan(_request(tmp_path), H200)
    assert tunes_down_file(plan)
    lines = _down_lines(plan)
    assert len(lines) == 2 and all(len(line) <= 100 for line in lines)
    assert lines[0].startswith("vLLM down:   _down.json where the sorted-TMA down GEMM is faster")
    assert "DeepGEMM E8M0 in use (DeepGEMM installed), SiLU, no expert map/LoRA" in lines[1]
    assert plan_json(plan)["vllm_down"]["tuned"] is True

    undeclared = make_plan(_request(tmp_path, vllm_deepgemm=False), H200)
    assert not tunes_down_file(undeclared)
    lines = _down_lines(undeclared)
    assert len(lines) == 2 and "not tuned (--vllm-deepgemm tunes it)" in lines[0]
    assert plan_json(undeclared)["vllm_down"]["tuned"] is False


@pytest.mark.parametrize(
    ("changes", "limits", "expected"),
    [
        (dict(problem=replace(ON_034, hidden_size=2048)), H200, ["hidden size 2048 < 4096"]),
        ({}, B200, ["compute capability 9.0 only"]),
        (dict(vllm_release="0.33.0"), H200, []),
        (dict(problem=replace(ON_034, block_shape=(64, 64))), H200, []),
        (dict(engines=("sglang",)), H200, []),
    ],
)
def test_the_plan_says_one_short_line_or_nothing_where_vllm_never_reads_it(
    tmp_path, changes, limits, expected
):
    plan = make_plan(_request(tmp_path, **changes), limits)
    assert not tunes_down_file(plan)
    lines = down_plan_lines(plan)
    assert len(lines) == len(expected)
    for line, words in zip(lines, expected, strict=True):
        assert line.startswith("vLLM down:   _down.json not tuned: ") and words in line
        assert len(line) <= 100


# The down table from the pairs: the winners' down configs, guard entries elsewhere.

UP = Candidate(64, 128, 128, 1, 4, 3)
SORTED_DOWN = Candidate(64, 256, 128, 16, 4, 4)


def _result(m, up=UP, split=True, down_tma=True):
    choice = PairChoice(64, Probe("up", up), Probe("down", SORTED_DOWN, down_tma), 9.0, {64: 9.0})
    return SplitResult(m, up, 10.0, choice, 9.0 if split else 11.0, split)


def test_the_down_table_holds_the_winners_and_guard_entries():
    results = {4: UP, 64: UP, 256: UP}
    table = down_table(results, [_result(4, split=False), _result(64), _result(256, split=False)])
    assert table == {
        4: {"USE_TMA": False},
        64: {**SORTED_DOWN.as_config(), "USE_TMA": True},
        256: {"USE_TMA": False},
    }
    validate_tuned_config({str(m): e for m, e in table.items()}, "vllm", down=True)


def test_no_down_table_where_no_pair_won_or_its_up_is_not_the_main_entry():
    results = {64: UP, 256: UP}
    assert down_table(results, [_result(64, split=False), _result(256, split=False)]) is None
    other = replace(UP, GROUP_SIZE_M=16)  # the confirmation kept another main entry
    assert down_table({64: other}, [_result(64)]) is None
    assert down_table(results, [_result(64, down_tma=False)]) is None  # not the sorted path


# A tune over a stand-in backend.


class DownPairBackend:
    """Whole calls on a synthetic GPU; an up GEMM alone is 60 % of its whole call, a down
    GEMM 40 %, `sorted_gain` times that on the sorted path. A pair's whole call is its
    GEMMs plus `pair_cost` (what the lone timings miss); every check passes.
    `log`: (mode, M, candidate or probe)."""

    compile_workers = 0
    parallelism = 1

    def __init__(self, problem, sorted_gain=0.5, pair_cost=0.0):
        self.gpu = SyntheticGPU(problem, 5, fixed_noise=True)
        self.sorted_gain, self.pair_cost = sorted_gain, pair_cost
        self.log = []

    def whole(self, m, candidate):
        return self.gpu.true_us(m, candidate.with_tma_b(True))

    def latency(self, m, item):
        if not isinstance(item, Probe):
            return self.whole(m, item)
        if item.kind == "up":
            return 0.6 * self.whole(m, item.candidate)
        if item.kind == "down":
            return 0.4 * self.whole(m, item.candidate) * (self.sorted_gain if item.use_tma else 1)
        if item == Probe.single(item.candidate):
            return self.whole(m, item.candidate)
        down = 0.4 * self.whole(m, item.down) * (self.sorted_gain if item.down_tma else 1)
        return 0.6 * self.whole(m, item.candidate) + down + self.pair_cost

    def run(self, units, then=None):
        for unit in units:
            for item in unit.candidates:
                self.log.append((unit.mode, unit.batch_size, item))
                if unit.mode == "verify":
                    yield unit, Outcome(item, "ok", rel_rms=0.001)
                    continue
                us = self.latency(unit.batch_size, item)
                if us is None:
                    yield unit, Outcome(item, "crashed", error="synthetic")
                    continue
                yield unit, Outcome(item, "ok", us, us, us, compile_s=0.1)

    def close(self):
        pass


DOWN_NAME = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128]_down.json"


def test_a_tune_writes_the_down_file_where_the_pair_is_faster_as_a_whole_call(tmp_path):
    plan = make_plan(_request(tmp_path), H200)
    backend = DownPairBackend(ON_034)
    summary = run_tune(plan, backend=backend)
    singles = {result.batch_size: result.single for result in summary.vllm_down}
    probes = [(m, item) for _, m, item in backend.log if isinstance(item, Probe)]
    assert probes and all(m != 4 for m, _ in probes)  # M=4: vLLM's naive path, no pair
    sorted_downs = [(m, p) for m, p in probes if p.kind == "down" and p.use_tma]
    assert sorted_downs  # on the up config's BLOCK_SIZE_M (vLLM replaces the down's)
    assert all(p.BLOCK_SIZE_M == singles[m].BLOCK_SIZE_M for m, p in sorted_downs)
    assert len({p.candidate for _, p in sorted_downs}) > 1  # searched
    # The up GEMM and the down GEMM off the sorted path: the single config alone (the
    # main file's entry, and the reference the pair must beat), never searched.
    fixed = [(m, p) for m, p in probes if p.kind == "up" or (p.kind == "down" and not p.use_tma)]
    assert fixed and all(p.candidate == singles[m] for m, p in fixed)
    verified_pairs = [
        item for mode, _, item in backend.log if mode == "verify" and isinstance(item, Probe)
    ]
    assert verified_pairs  # a written pair matched the reference first

    down_path = tmp_path / DOWN_NAME
    assert down_path in summary.files
    table = json.loads(down_path.read_text())
    main = json.loads((tmp_path / DOWN_NAME.replace("_down", "")).read_text())
    assert table["4"] == {"USE_TMA": False}
    # The sorted path takes an up BLOCK_SIZE_M that is a multiple of 16; where the search's
    # single config has 8, vLLM's main entry runs and the table holds a guard entry.
    sortable = [
        r.batch_size for r in summary.vllm_down if r.batch_size != 4 and r.single.BLOCK_SIZE_M % 16 == 0
    ]  # fmt: skip
    assert sortable  # the landscape leaves the pair somewhere to win
    for result in summary.vllm_down[1:]:
        entry = table[str(result.batch_size)]
        if result.batch_size in sortable:
            assert entry["USE_TMA"] is True
            assert entry["BLOCK_SIZE_M"] == main[str(result.batch_size)]["BLOCK_SIZE_M"]
        else:
            assert entry == {"USE_TMA": False}
            assert "not a multiple of 16" in result.stopped
    validate_tuned_config(down_path, "vllm")
    assert vllm.read_table_for(down_path, "0.34.0", down=True).keys() == {4, 64, 256}
    for index, result in enumerate(summary.vllm_down):
        assert result.split is (result.batch_size in sortable)
        if result.split:  # the up GEMM stays on the main file's entry
            assert result.pair_us < result.single_us
            assert result.choice.up.candidate == result.single
            assert json.loads(json.dumps(result.single.as_config())) == main[str(result.batch_size)]
            assert summary.to_json()["vllm_down"][index]["written"] == "split"
    won = ", ".join(map(str, sortable))
    assert any(f"vLLM down pair: faster as a whole call at M={won}" in n for n in summary.notes)


def test_no_down_file_where_the_pair_loses_as_a_whole_call(tmp_path):
    # Alone the sorted down GEMM is half as fast; as a whole call the pair pays more than
    # that saves (the lone timings miss it): no pair is written, and no file.
    plan = make_plan(_request(tmp_path), H200)
    backend = DownPairBackend(ON_034, pair_cost=1e4)
    summary = run_tune(plan, backend=backend)
    pairs = [item for _, _, item in backend.log if isinstance(item, Probe) and item.kind == "pair"]
    assert any(p != Probe.single(p.candidate) for p in pairs)  # a pair was timed whole
    assert all(not result.split for result in summary.vllm_down)
    assert not (tmp_path / DOWN_NAME).exists()
    assert all(not str(path).endswith("_down.json") for path in summary.files)
    assert any("no pair was faster as a whole call" in n for n in summary.notes)


def test_no_pair_search_without_the_deepgemm_declaration_or_for_0_33(tmp_path):
    for extra in (dict(vllm_deepgemm=False), dict(vllm_release="0.33.0")):
        plan = make_plan(_request(tmp_path, **extra), H200)
        backend = DownPairBackend(ON_034)
        summary = run_tune(plan, backend=backend)
        assert not any(isinstance(item, Probe) for _, _, item in backend.log)
        assert summary.vllm_down == [] and not (tmp_path / DOWN_NAME).exists()


def test_check_accepts_the_written_down_file(tmp_path, monkeypatch, capsys):
    from moetune.cli import main
    from moetune.engines import names, sglang

    run_tune(make_plan(_request(tmp_path / "out"), H200), backend=DownPairBackend(ON_034))
    assert (tmp_path / "out" / DOWN_NAME).is_file()
    for variable in ("VLLM_TUNED_CONFIG_FOLDER", "SGLANG_MOE_CONFIG_DIR", "MOETUNE_MAPPINGS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(names, "detect_device_name", lambda: None)
    monkeypatch.setattr(vllm, "installed", lambda: None)
    monkeypatch.setattr(sglang, "installed", lambda: None)
    args = ["check", "--model", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--engine", "vllm",
            "--device-name", "NVIDIA_H200", "--vllm-release", "0.34.0",
            "--compare-dir", str(tmp_path / "out"), "--compare-only"]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr().out
    assert exc.value.code == 0, out
    assert f"_down file FOUND: {tmp_path / 'out' / DOWN_NAME}" in out
    assert "INVALID" not in out


def test_install_takes_the_down_file_this_run_wrote(tmp_path):
    from moetune.engines.install import engine_files

    main = tmp_path / DOWN_NAME.replace("_down", "")
    down = tmp_path / DOWN_NAME
    for path in (main, down):
        path.write_text("{}")
    assert engine_files("vllm", main, [main, down]) == [main, down]
    assert engine_files("vllm", main, [main]) == [main]  # an earlier run's stays behind


def test_a_pair_timed_with_an_up_config_the_confirmation_replaced_is_not_claimed(tmp_path):
    """The confirmation may keep another finalist for the vLLM file than the one the pair was
    searched with (an H100 run, 2026-12-05: M = 2048 and 4096); vLLM would pair the down
    config with that other up GEMM, so the pair is not written, and the summary says so."""
    summary = run_tune(make_plan(_request(tmp_path), H200), backend=DownPairBackend(ON_034))
    split = [r for r in summary.vllm_down if r.split]
    assert split
    other = {r.batch_size: r.single for r in summary.vllm_down}
    replaced = split[0].batch_size
    other[replaced] = replace(other[replaced], GROUP_SIZE_M=other[replaced].GROUP_SIZE_M * 2)
    settled = {r.batch_size: r for r in settle(other, summary.vllm_down)}
    assert settled[replaced].split is False
    assert "the confirmation kept another config" in settled[replaced].stopped
    assert all(settled[r.batch_size] == r for r in split[1:])
    assert down_table(other, list(settled.values())) == down_table(other, summary.vllm_down)
