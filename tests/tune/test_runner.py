"""The runner: the plan, winner verification with fallback, and a whole run with resume."""

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from moetune.device import DeviceLimits
from moetune.errors import TuneError
from moetune.kernel.config import Candidate
from moetune.tune.measure.timing import Outcome
from moetune.tune.problem import TuneProblem
from moetune.tune.runner import (
    TuneRequest,
    make_plan,
    plan_lines,
    run_tune,
    verify_winners,
)
from moetune.tune.search.space import load_space
from moetune.tune.store import STORE_FILENAME, Measurement, ResultStore

DATA = Path(__file__).parent / "data"
PROBLEM = TuneProblem(4, 32, 64, 2, "bf16")
A = Candidate(16, 32, 32, 1, 4, 2)
B = Candidate(16, 64, 64, 1, 4, 2)


def request(tmp_path, **overrides):
    values = dict(
        problem=PROBLEM,
        batch_sizes=(2, 4),
        space=tuple(load_space(DATA / "tiny-space.json")),
        save_dir=tmp_path,
        search="exhaustive",
        device_name="NVIDIA H200",
        triton_version="3.6.0",
    )
    values.update(overrides)
    return TuneRequest(**values)


def measurement(candidate, latency, batch_size=2):
    return Measurement(
        PROBLEM.key(),
        batch_size,
        candidate,
        "full",
        "ok",
        latency,
        latency,
        latency,
        0.1,
        None,
        "NVIDIA H200",
        "3.6.0",
        "0",
        0.0,
    )


def test_plan_lists_shape_pruning_and_exact_file_names(tmp_path):
    plan = make_plan(request(tmp_path), DeviceLimits.h200())
    text = "\n".join(plan_lines(plan))
    assert "Shape:       E=4,N=32,K=64,topk=2,dtype=bf16" in text
    assert "M=2         3 kept" in text and "M=4         3 kept" in text
    assert plan.files == (
        tmp_path / "E=4,N=32,device_name=NVIDIA_H200.json",
        tmp_path / "configs/triton_3_6_0/E=4,N=32,device_name=NVIDIA_H200.json",
        tmp_path / "configs/triton_3_6_0/E=4,N=32,device_name=NVIDIA_H200_down.json",
    )
    assert plan.store_path == tmp_path / STORE_FILENAME


def test_plan_refuses_an_empty_space(tmp_path):
    with pytest.raises(TuneError, match="the search space is empty"):
        make_plan(request(tmp_path, space=()), DeviceLimits.h200())


@dataclass
class ScriptedBackend:
    """Answers verification units from a table: candidate -> status."""

    verdicts: dict
    compile_workers: int = 0
    parallelism: int = 1

    def run(self, units):
        for unit in units:
            for candidate in unit.candidates:
                status = self.verdicts[candidate]
                error = None if status == "ok" else "relative RMS error 1"
                yield unit, Outcome(candidate, status, error=error, rel_rms=0.004)


def test_a_wrong_winner_is_replaced_by_the_next_best():
    notes = []
    choices = {2: [measurement(A, 10.0), measurement(B, 11.0)]}
    verified = verify_winners(
        ScriptedBackend({A: "wrong_result", B: "ok"}), PROBLEM, choices, notes
    )
    pick, rank, rel_rms = verified[2]
    assert pick.candidate == B and rank == 1 and rel_rms == 0.004
    assert len(notes) == 1 and notes[0].startswith("M=2: M16 N32 K32 G1 w4 s2 rejected")


def test_no_correct_candidate_means_no_file():
    choices = {2: [measurement(A, 10.0)]}
    with pytest.raises(TuneError, match="no candidate passed the check .* batch size"):
        verify_winners(ScriptedBackend({A: "wrong_result"}), PROBLEM, choices, [])


def test_whole_run_writes_valid_files_and_resumes_from_the_store(tmp_path, monkeypatch):
    from moetune.engines.tuned_file import validate_tuned_config

    for variable in ("VLLM_TUNED_CONFIG_FOLDER", "SGLANG_MOE_CONFIG_DIR"):
        monkeypatch.delenv(variable, raising=False)
    # The search's path alone (the confirmation: the tests below).
    plan = make_plan(request(tmp_path, engines=("vllm",), confirm_rounds=0), DeviceLimits.h200())
    current, arrived = [""], []
    first = run_tune(
        plan,
        progress=lambda m, reused: arrived.append((current[0], reused)),
        stage=lambda name: current.__setitem__(0, name),
    )
    # 3 candidates x 2 batch sizes, plus vLLM's fallback at each batch size ...
    assert first.measured == 8 and first.reused == 0
    # ... the fallback timed alongside the search (known before it), not in a stage after it.
    assert arrived == [("search", False)] * 8
    assert [name for name, _, _ in first.stages] == [
        "prepare", "search", "baselines", "verify", "files",
    ]  # fmt: skip
    assert all(seconds >= 0 for _, _, seconds in first.stages)
    assert sum(seconds for _, _, seconds in first.stages) == pytest.approx(first.wall_s)
    assert [b.key for b in first.baselines] == ["vllm_fallback"]
    assert [row.batch_size for row in first.rows] == [2, 4]
    for row in first.rows:
        fallbacks = {b.configs[row.batch_size] for b in first.baselines}
        assert row.config in plan.pruning[row.batch_size].kept or row.config in fallbacks
        assert row.latency_us > 0 and row.rel_rms < 0.02
        assert set(row.baseline_us) == {"vllm_fallback"}
        assert all(base > 0 for base in row.baseline_us.values())
    assert first.files == list(plan.files)
    [vllm] = (json.loads(path.read_text()) for path in first.files)
    validate_tuned_config(first.files[0], "vllm")
    assert vllm["triton_version"] == "3.6.0"
    assert vllm["2"] == first.rows[0].config.as_config()
    assert not list(tmp_path.rglob("*.tmp"))

    second = run_tune(plan)
    assert second.measured == 0 and second.reused == 8
    assert [row.config for row in second.rows] == [row.config for row in first.rows]
    assert len(ResultStore(plan.store_path).all()) == 8


def test_summary_json_says_what_the_floor_is_made_of(tmp_path):
    from moetune.roofline import Ceilings
    from moetune.tune.runner import BatchResult, TuneSummary, summary_json

    plan = make_plan(
        request(tmp_path, problem=TuneProblem(4, 32, 64, 2, "fp8_w8a8")), DeviceLimits.h200()
    )
    ceilings = Ceilings(
        4.6e12,
        "measured: stream-read kernel, 2 GiB",
        {"bf16": 700e12, "fp8": 1400e12},
        {"bf16": "m bf16", "fp8": "m fp8"},
    )
    summary = TuneSummary(plan, ceilings=ceilings)
    summary.rows.append(BatchResult(2, A, 10.0, 11.0, 0, 0.0, {"vllm_fallback": 12.0}))
    data = summary_json(summary)
    assert data["ceilings"]["read_bandwidth_tb_s"] == 4.6
    assert data["ceilings"]["peak_tflops"] == 1400.0 and data["ceilings"]["peak_source"] == "m fp8"
    assert data["results"][0]["roofline_fraction"] == 1.0


def test_the_file_an_engine_would_load_is_timed_too(tmp_path, monkeypatch):
    from moetune.tune.runner import summary_json

    existing = tmp_path / "engine"
    existing.mkdir()
    # What vLLM would load today for this shape: one row, used at every M (nearest key).
    (existing / "E=4,N=32,device_name=NVIDIA_H200.json").write_text(
        json.dumps({"triton_version": "3.6.0", "1": A.as_config()})
    )
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(existing))
    monkeypatch.delenv("SGLANG_MOE_CONFIG_DIR", raising=False)
    # The search times the file's config as a baseline (no confirmation: the tests below).
    only_vllm = request(tmp_path / "out", batch_sizes=(2,), engines=("vllm",), confirm_rounds=0)
    plan = make_plan(only_vllm, DeviceLimits.h200())
    summary = run_tune(plan)
    assert [b.key for b in summary.baselines] == ["vllm_fallback", "vllm_file"]
    assert summary.baselines[1].configs == {2: A}
    report = summary_json(summary)
    (row,) = report["results"]
    assert row["baselines"]["vllm_file"]["config"] == A.as_config()
    assert row["baselines"]["vllm_file"]["latency_us"] > 0
    # The speedup is of what vLLM's file holds at this M over the baseline: the tuned config,
    # or the engine's own where the confirmation kept it (then its own time, ratio 1.0).
    written = row["written"]["vllm"]
    written_us = (
        row["latency_us"] if written == "tuned" else row["baselines"][written]["latency_us"]
    )
    assert row["baselines"]["vllm_file"]["speedup"] == pytest.approx(
        row["baselines"]["vllm_file"]["latency_us"] / written_us
    )
    assert set(report["geomean_speedup"]) == {"vllm_fallback", "vllm_file"}
    assert report["baselines"][1]["source"] == str(
        existing / "E=4,N=32,device_name=NVIDIA_H200.json"
    )


class TableBackend:
    """A backend that answers from tables: the search's timings by (M, candidate), the
    confirmation's by (M, candidate) -> one time per round; every verification passes."""

    compile_workers = 0
    parallelism = 1

    def __init__(self, search_us, confirm_us):
        self.search_us, self.confirm_us = search_us, confirm_us
        self.confirm_units = []

    def run(self, units, then=None):
        from collections import deque

        from moetune.tune.confirm import round_of

        queue = deque(units)
        while queue:
            unit = queue.popleft()
            outcomes = []
            for candidate in unit.candidates:
                m = unit.batch_size
                if unit.mode == "verify":
                    outcome = Outcome(candidate, "ok", rel_rms=0.001)
                elif unit.mode == "confirm":
                    rounds = self.confirm_us[(m, candidate)]
                    outcome = Outcome(candidate, "ok", rounds[round_of(unit.seed, m)])
                else:
                    outcome = Outcome(candidate, "ok", self.search_us(m, candidate))
                outcomes.append(outcome)
                yield unit, outcome
            if unit.mode == "confirm":
                self.confirm_units.append(unit)
            if then is not None:
                queue.extend(then(unit, outcomes))

    def measure_ceilings(self):
        raise AssertionError("no ceilings on the CPU")

    def close(self):
        pass


def test_the_confirmation_keeps_the_engines_config_where_the_winner_is_noise(tmp_path, monkeypatch):
    from moetune.tune.baselines import engine_baselines
    from moetune.tune.confirm import TUNED

    for variable in ("VLLM_TUNED_CONFIG_FOLDER", "SGLANG_MOE_CONFIG_DIR"):
        monkeypatch.delenv(variable, raising=False)
    plan = make_plan(request(tmp_path, engines=("vllm",)), DeviceLimits.h200())
    (fallback,) = engine_baselines(PROBLEM, (2, 4), ("vllm",), "NVIDIA H200", "3.6.0")
    tuned = next(c for c in plan.pruning[2].kept if c not in fallback.configs.values())
    # The search: `tuned` fastest at both batch sizes, the fallback next.
    search = {tuned: 10.0, fallback.configs[2]: 11.0, fallback.configs[4]: 11.0}
    confirm = {
        # M = 2: the tuned config's median is 5 % lower, but it lost two of five rounds.
        (2, tuned): (9.5, 11.2, 9.8, 11.4, 10.0),
        (2, fallback.configs[2]): (10.5, 10.4, 10.6, 10.3, 10.5),
        # M = 4: 10 % faster in every round.
        (4, tuned): (9.0, 9.1, 9.2, 9.0, 9.1),
        (4, fallback.configs[4]): (10.0, 10.1, 10.2, 10.0, 10.1),
    }
    backend = TableBackend(lambda m, c: search.get(c, 12.0), confirm)
    summary = run_tune(plan, backend=backend)

    assert "confirm" in [name for name, _, _ in summary.stages]
    # Interleaved: 5 rounds x 2 batch sizes, each unit the two configs back to back.
    assert len(backend.confirm_units) == 10
    assert all(
        set(u.candidates) == {tuned, fallback.configs[u.batch_size]} for u in backend.confirm_units
    )
    assert backend.confirm_units[0].candidates != backend.confirm_units[2].candidates  # rotated

    at2, at4 = summary.rows
    assert at2.written_for("vllm") == "vllm_fallback" and at4.written_for("vllm") == TUNED
    [vllm] = (json.loads(path.read_text()) for path in summary.files)
    assert vllm["2"] == fallback.configs[2].as_config()
    assert vllm["4"] == tuned.as_config()
    assert any(
        note.startswith("M=2: the vLLM file keeps the vLLM fallback's config")
        for note in summary.notes
    )
    # The speedups are the confirmation's, of what the file holds: none at M = 2.
    assert at2.speedup_over("vllm_fallback") == 1.0
    assert at4.speedup_over("vllm_fallback") == pytest.approx(10.1 / 9.1)
    assert at4.speedup_interval("vllm_fallback").low > 1.0
    assert at4.confirmed_us == 9.1 and at4.search_us == 10.0
    data = summary.to_json()
    assert data["confirmation"]["rounds"] == 5 and data["confirmation"]["engine_configs_kept"] == 1
    row2, row4 = data["results"]
    assert row2["written"] == {"vllm": "vllm_fallback"}
    assert row4["baselines"]["vllm_fallback"]["latency_us"] == 10.1
    assert row4["baselines"]["vllm_fallback"]["search_latency_us"] == 11.0
    low, high = row4["baselines"]["vllm_fallback"]["speedup_interval"]
    assert 1.0 < low <= row4["baselines"]["vllm_fallback"]["speedup"] <= high
    assert data["geomean_speedup"]["vllm_fallback"] == pytest.approx((10.1 / 9.1) ** 0.5)


def test_the_confirmation_runs_on_the_real_workers(tmp_path, monkeypatch):
    for variable in ("VLLM_TUNED_CONFIG_FOLDER", "SGLANG_MOE_CONFIG_DIR"):
        monkeypatch.delenv(variable, raising=False)
    plan = make_plan(
        request(tmp_path, engines=("vllm",), batch_sizes=(2,), confirm_rounds=2),
        DeviceLimits.h200(),
    )
    summary = run_tune(plan)
    (row,) = summary.rows
    assert row.confirmation.rounds == 2
    assert all(
        v is not None and v > 0 for series in row.confirmation.timings_us.values() for v in series
    )
    assert row.speedup_interval("vllm_fallback") is not None
    # The store keeps the search's timings only: a confirmation is never served as one.
    assert summary.measured == 4


def test_a_runner_up_within_the_noise_is_written_where_its_median_is_lower(tmp_path, monkeypatch):
    from moetune.tune.baselines import engine_baselines
    from moetune.tune.confirm import TUNED

    for variable in ("VLLM_TUNED_CONFIG_FOLDER", "SGLANG_MOE_CONFIG_DIR"):
        monkeypatch.delenv(variable, raising=False)
    plan = make_plan(request(tmp_path, engines=("vllm",), batch_sizes=(2,)), DeviceLimits.h200())
    (fallback,) = engine_baselines(PROBLEM, (2,), ("vllm",), "NVIDIA H200", "3.6.0")
    pick, runner_up = [c for c in plan.pruning[2].kept if c != fallback.configs[2]][:2]
    # The search: the pick 1 % ahead of the runner-up, one timing each: within the noise.
    search = {pick: 10.0, runner_up: 10.1, fallback.configs[2]: 11.0}
    confirm = {
        (2, pick): (10.0, 10.2, 10.1, 10.3, 10.1),
        (2, runner_up): (9.6, 9.7, 9.6, 9.8, 9.7),
        (2, fallback.configs[2]): (11.0, 11.1, 11.0, 11.2, 11.1),
    }
    backend = TableBackend(lambda m, c: search.get(c, 12.0), confirm)
    summary = run_tune(plan, backend=backend)
    (row,) = summary.rows
    assert row.config == runner_up and row.verified_rank == 1 and row.search_us == 10.1
    assert row.confirmation.configs["finalist 1"] == pick
    assert all(
        set(u.candidates) == {pick, runner_up, fallback.configs[2]} for u in backend.confirm_units
    )
    assert row.written_for("vllm") == TUNED
    [vllm] = (json.loads(path.read_text()) for path in summary.files)
    assert vllm["2"] == runner_up.as_config()
    assert row.speedup_over("vllm_fallback") == pytest.approx(11.1 / 9.7)


def recorded_store(path, problem, latencies):
    """A store holding `latencies` ({(batch size, candidate): us}) as recorded full timings."""
    store = ResultStore(path / STORE_FILENAME)
    for (m, candidate), latency in latencies.items():
        row = measurement(candidate, latency, batch_size=m)
        store.add(
            Measurement(**{**row.__dict__, "problem_key": problem.key(), "candidate": candidate})
        )
    return store


class VerifyOnly(ScriptedBackend):
    """Every timing comes from the store: a unit that asks to time one fails the test."""

    def run(self, units, then=None):
        assert all(unit.mode == "verify" for unit in units), [unit.mode for unit in units]
        yield from super().run(units)


@pytest.mark.parametrize(
    ("fallback_us", "written_us", "speedup"),
    [(30.0, 10.0, 3.0), (12.5, 10.0, 1.25), (8.0, 8.0, 1.0)],  # last: the fallback is fastest
)
def test_speedups_are_the_recorded_baseline_over_the_recorded_winner(
    tmp_path, monkeypatch, fallback_us, written_us, speedup
):
    """On recorded timings the answer is known: the summary's speedup is the recorded
    fallback's time over the fastest recorded config's, and the written config is that one."""
    from moetune.tune.baselines import engine_baselines

    for variable in ("VLLM_TUNED_CONFIG_FOLDER", "SGLANG_MOE_CONFIG_DIR"):
        monkeypatch.delenv(variable, raising=False)
    # The search's own timings (no confirmation round): the recorded ones.
    plan = make_plan(request(tmp_path, engines=("vllm",), confirm_rounds=0), DeviceLimits.h200())
    [fallback] = engine_baselines(PROBLEM, (2, 4), ("vllm",), "NVIDIA H200", "3.6.0")
    latencies, fastest = {}, {}
    for m in (2, 4):
        kept = [c for c in plan.pruning[m].kept if c != fallback.configs[m]]
        fastest[m] = kept[0] if fallback_us > 10.0 else fallback.configs[m]
        # The fastest searched config at 10 us, the others slower; M=4 twice as slow.
        for rank, candidate in enumerate(kept):
            latencies[(m, candidate)] = m / 2 * (10.0 + 5.0 * rank)
        latencies[(m, fallback.configs[m])] = m / 2 * fallback_us
    recorded_store(tmp_path, PROBLEM, latencies)
    verdicts = dict.fromkeys((c for _, c in latencies), "ok")
    summary = run_tune(plan, backend=VerifyOnly(verdicts))
    assert summary.measured == 0
    for row in summary.rows:
        assert row.config == fastest[row.batch_size]
        assert row.latency_us == row.batch_size / 2 * written_us
        assert row.speedup_over("vllm_fallback") == pytest.approx(speedup)
    assert summary.geomean_speedup("vllm_fallback") == pytest.approx(speedup)
    results = summary.to_json()["results"]
    assert [r["baselines"]["vllm_fallback"]["speedup"] for r in results] == pytest.approx(
        [speedup, speedup]
    )


def test_a_resume_never_reuses_another_kernels_timings_and_says_so(tmp_path, monkeypatch):
    from dataclasses import replace

    from moetune.engines.launch import KernelRef

    for variable in ("VLLM_TUNED_CONFIG_FOLDER", "SGLANG_MOE_CONFIG_DIR"):
        monkeypatch.delenv(variable, raising=False)
    plan = make_plan(request(tmp_path, engines=("vllm",), confirm_rounds=0), DeviceLimits.h200())
    space = {(m, c) for m in (2, 4) for c in plan.pruning[m].kept}
    # The same shape timed on another kernel: an earlier revision of the twin.
    older = replace(PROBLEM, kernel=KernelRef("vllm", "0.33.0", "0.33.0", "old", "0" * 12, True))
    assert older.key() != PROBLEM.key() and older.shape_key() == PROBLEM.shape_key()
    recorded_store(tmp_path, older, dict.fromkeys(space, 1.0))
    first = run_tune(plan)
    # Nothing of the other kernel's was reused: every candidate and the fallback was timed.
    assert first.reused == 0 and first.measured == 8
    [note] = [n for n in first.notes if "other kernels" in n]
    assert note == (
        f"{plan.store_path} holds timings of this shape on other kernels only (6 on "
        f"moetune-vllm-0.33.0@{'0' * 12}): none is reused, this run times "
        f"{PROBLEM.key().partition(',kernel=')[2]}"
    )
    assert all(row.latency_us != 1.0 for row in first.rows)
    # The same kernel's rows are: a second run reuses all of them and says nothing.
    second = run_tune(plan)
    assert second.reused == 8 and second.measured == 0
    assert not [n for n in second.notes if "other kernels" in n]
