"""bench/replay_wall.py: the simulated clock, checked by hand and against a recorded H200 tune."""

from pathlib import Path

import pytest
import replay_wall as wall  # bench/ is on sys.path (conftest.py)

from moetune.kernel.config import Candidate
from moetune.tune.measure.measurer import RunContext, StoreMeasurer
from moetune.tune.problem import TuneProblem
from moetune.tune.store import Measurement

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = TuneProblem(8, 64, 128, 2, "bf16")
A, B, C, D = (Candidate(16, n, 64, 1, 4, 2) for n in (16, 32, 64, 128))


def row(m, candidate, fidelity, timestamp, compile_s, latency=10.0):
    return Measurement(
        problem_key=PROBLEM.key(),
        batch_size=m,
        candidate=candidate,
        fidelity=fidelity,
        status="ok",
        latency_us=latency,
        p20_us=latency,
        p80_us=latency,
        compile_s=compile_s,
        error=None,
        device_name="NVIDIA H200",
        triton_version="3.6.0",
        moetune_version="test",
        timestamp=timestamp,
    )


def measurer(wall, rows, workers=2):
    recorded = wall.Recorded.of(PROBLEM.key(), rows, rows)
    backend = wall.SimulatedBackend({PROBLEM.key(): recorded}, workers=workers, switch_s=0.0)
    context = RunContext(PROBLEM, "NVIDIA H200", "3.6.0")
    return StoreMeasurer(context, backend, wall.MemoryStore()), backend


def test_compiles_share_the_workers_and_the_timer_follows_each_one():
    # Recorded: four 1 s compiles at M=1, timings 0.1 s apart; then A at M=2 loaded the
    # kernel compiled at M=1 (0.01 s).
    rows = [row(1, c, "quick", 10.0 + 0.1 * i, 1.0) for i, c in enumerate((A, B, C, D))]
    rows.append(row(2, A, "quick", 11.0, 0.01))
    found, backend = measurer(wall, rows)
    got = found.measure(1, [A, B, C, D], "quick")
    assert {c: m.latency_us for c, m in got.items()} == dict.fromkeys((A, B, C, D), 10.0)
    # Two warmers: two compiles end at 1 s and two at 2 s; each is timed (0.1 s) after.
    assert backend.now == pytest.approx(2.2)
    assert backend.compile_cpu_s == pytest.approx(4.0)
    found.measure(2, [A], "quick")  # its kernel is in the cache: loaded, not compiled
    assert backend.compile_cpu_s == pytest.approx(4.01)
    assert backend.misses == set()
    found.measure(2, [B], "quick")  # not recorded: a failure, priced at a median compile
    assert len(backend.misses) == 1 and backend.compile_cpu_s == pytest.approx(5.01)


def test_a_kernel_asked_first_where_the_record_found_it_cached_pays_its_compile():
    rows = [row(1, A, "quick", 10.0, 2.0), row(2, A, "quick", 11.0, 0.01)]
    found, backend = measurer(wall, rows)
    found.measure(2, [A], "quick")  # before M=1 compiled it: this one compiles it
    assert backend.compile_cpu_s == pytest.approx(2.0)
    found.measure(1, [A], "quick")
    assert backend.compile_cpu_s == pytest.approx(2.0 + 0.01)


STORE = ROOT / "bench/results/2026-12-02-default-tune-times/vllm_bf16/measurements.jsonl.gz"


@pytest.mark.skipif(not STORE.exists(), reason="the recorded H200 store is not here")
def test_the_recorded_search_replays_exactly_and_the_pipeline_keeps_its_picks():
    """Qwen3-235B TP4 on vLLM 0.33.0's kernel (18 batch sizes, 14 compile workers): the
    sequential search asks exactly the recorded questions, compiles what the run compiled
    (851 CPU-s) and takes about the recorded 125 s; the pipeline picks the same configs.
    The run pruned with the provably safe rules only (before `accumulator_spills`) and
    climbed from three starts (before 2026-12-04)."""
    [report] = wall.replay_store(STORE, pruning="safe", starts=3)
    old, new = report["runs"][wall.SEQUENTIAL], report["runs"][wall.PIPELINED]
    assert old["misses"] == 0 and old["timings"] == 2364  # the store's 2378 but 14 baselines
    assert old["compile_cpu_s"] == pytest.approx(851.4, abs=2)  # the run's summary: 851.443
    assert 0.85 * report["recorded_span_s"] <= old["wall_s"] <= 1.05 * report["recorded_span_s"]
    assert new["wall_s"] < 0.8 * old["wall_s"]
    assert all(pick[wall.PIPELINED]["delta"] == 0 for pick in report["picks"])


@pytest.mark.skipif(not STORE.exists(), reason="the recorded H200 store is not here")
def test_the_fast_search_pruning_keeps_the_picks_and_compiles_less():
    """The same store replayed sequentially with the fast search's measured rule
    (`accumulator_spills`): the same 18 picks, fewer timings and compile seconds."""
    rows = wall.read_rows(STORE)
    whole = [r for r in rows if r.kind == "whole"]
    [key] = {r.problem_key for r in whole}
    recorded = wall.Recorded.of(key, whole, rows)
    safe = wall.replay_search(recorded, wall.SEQUENTIAL, pruning="safe")
    fast = wall.replay_search(recorded, wall.SEQUENTIAL, pruning="fast")
    assert fast.picks == safe.picks and len(fast.picks) == 18
    assert fast.timings < safe.timings and fast.compile_cpu_s < safe.compile_cpu_s - 20


@pytest.mark.skipif(not STORE.exists(), reason="the recorded H200 store is not here")
def test_two_climb_starts_keep_the_recorded_picks_and_compile_less():
    """Today's fast search (two climb starts, the measured pruning rule) on the same store,
    against the replay from ``--search thorough``'s three starts: the same 18 picks, with at
    least 15 % less compile CPU and fewer timings."""
    [report] = wall.replay_store(STORE)
    two, three = report["runs"][wall.PIPELINED], report["runs"][wall.THOROUGH]
    assert len(report["picks"]) == 18
    assert all(pick[wall.PIPELINED]["vs_thorough"] == 0 for pick in report["picks"])
    assert two["compile_cpu_s"] < 0.85 * three["compile_cpu_s"]
    assert two["timings"] < 0.85 * three["timings"]
