"""The store-backed measurer: resume from the store, and the parallel compile pass."""

import pytest

from moetune.kernel.config import Candidate
from moetune.tune.measure.measurer import RunContext, StoreMeasurer
from moetune.tune.measure.worker import FAULTS_ENV, WorkerPool
from moetune.tune.problem import TuneProblem
from moetune.tune.store import ResultStore

PROBLEM = TuneProblem(4, 32, 64, 2, "bf16")
GOOD = Candidate(16, 32, 32, 1, 4, 2)
OTHER = Candidate(16, 32, 64, 1, 4, 2)
BAD_COMPILE = Candidate(16, 64, 32, 1, 4, 2)
RAISES = Candidate(16, 64, 64, 1, 4, 2)
CONTEXT = RunContext(PROBLEM, "NVIDIA H200", "3.6.0")


class Recording:
    """A backend wrapper that remembers which candidates reached which mode."""

    def __init__(self, pool):
        self.pool = pool
        self.seen = []

    compile_workers = property(lambda self: self.pool.compile_workers)
    parallelism = property(lambda self: self.pool.parallelism)

    def run(self, units, then=None):
        for unit, outcome in self.pool.run(units, then=then):
            self.seen.append((unit.mode, outcome.candidate))
            yield unit, outcome


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setenv(
        FAULTS_ENV, "compile:BLOCK_SIZE_N=64,BLOCK_SIZE_K=32;raise:BLOCK_SIZE_K=64,BLOCK_SIZE_N=64"
    )
    with WorkerPool([None], compile_workers=1, timeout_s=60) as pool:
        yield pool


def test_compile_pass_feeds_the_timer_and_settles_compiler_failures(tmp_path, pool):
    backend = Recording(pool)
    store = ResultStore(tmp_path / "m.jsonl")
    measurer = StoreMeasurer(CONTEXT, backend, store)
    results = measurer.measure(2, [GOOD, OTHER, BAD_COMPILE, RAISES], "quick")

    assert results[GOOD].status == results[OTHER].status == "ok"
    assert results[GOOD].compile_s is not None and results[GOOD].latency_us > 0
    # A compiler error is final at the warmer: the timer never sees it.
    assert results[BAD_COMPILE].status == "compile_error"
    assert ("quick", BAD_COMPILE) not in backend.seen
    # Anything else a warmer hits is left to the timer, which records it.
    assert ("quick", RAISES) in backend.seen and results[RAISES].status == "runtime_error"
    assert measurer.warm_count == 4 and measurer.timed == 4
    assert len(store.all()) == 4

    # Asked again (full fidelity): nothing is compiled twice, everything is timed.
    backend.seen.clear()
    measurer.measure(2, [GOOD, OTHER], "full")
    assert [mode for mode, _ in backend.seen] == ["full", "full"]


def test_stored_measurements_are_reused_not_measured(tmp_path, pool):
    store = ResultStore(tmp_path / "m.jsonl")
    StoreMeasurer(CONTEXT, pool, store).measure(4, [GOOD], "quick")
    again = StoreMeasurer(CONTEXT, pool, ResultStore(tmp_path / "m.jsonl"))
    seen = []
    again.on_measurement = lambda m, reused: seen.append(reused)
    results = again.measure(4, [GOOD, OTHER], "quick")
    assert again.reused == 1 and again.timed == 1 and sorted(seen) == [False, True]
    assert results[GOOD].status == results[OTHER].status == "ok"

    overwrite = StoreMeasurer(CONTEXT, pool, ResultStore(tmp_path / "m.jsonl"), overwrite=True)
    overwrite.measure(4, [GOOD], "quick")
    assert overwrite.timed == 1 and overwrite.reused == 0
