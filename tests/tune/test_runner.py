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
    plan = make_plan(request(tmp_path, engines=("vllm",)), DeviceLimits.h200())
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
    plan = make_plan(
        request(tmp_path / "out", batch_sizes=(2,), engines=("vllm",)), DeviceLimits.h200()
    )
    summary = run_tune(plan)
    assert [b.key for b in summary.baselines] == ["vllm_fallback", "vllm_file"]
    assert summary.baselines[1].configs == {2: A}
    report = summary_json(summary)
    (row,) = report["results"]
    assert row["baselines"]["vllm_file"]["config"] == A.as_config()
    assert row["baselines"]["vllm_file"]["latency_us"] > 0
    assert row["baselines"]["vllm_file"]["speedup"] == pytest.approx(
        row["baselines"]["vllm_file"]["latency_us"] / row["latency_us"]
    )
    assert set(report["geomean_speedup"]) == {"vllm_fallback", "vllm_file"}
    assert report["baselines"][1]["source"] == str(
        existing / "E=4,N=32,device_name=NVIDIA_H200.json"
    )


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
    plan = make_plan(request(tmp_path, engines=("vllm",)), DeviceLimits.h200())
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
    plan = make_plan(request(tmp_path, engines=("vllm",)), DeviceLimits.h200())
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
