"""The store-backed measurer: resume from the store, and the parallel compile pass."""

import sys
from collections import Counter
from pathlib import Path

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
SMALL = TuneProblem(8, 64, 128, 2, "bf16")  # every candidate above runs on the synthetic GPU

sys.path.insert(0, str(Path(__file__).parent))
from synthetic import SyntheticBackend, SyntheticGPU  # noqa: E402


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


# --- measure_stream: many asks through one backend run (no worker processes) -------------


class Ask:
    """What `measure_stream` reads of `moetune.tune.search.strategy.Ask`."""

    def __init__(self, batch_size, candidates, fidelity="quick", priority=0):
        self.batch_size, self.candidates = batch_size, tuple(candidates)
        self.fidelity, self.priority = fidelity, priority


class Held(SyntheticBackend):
    """Also keeps every set of (mode, batch size, candidate) held at once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.held = []

    def run(self, units, then=None):
        units = list(units)
        self.held.append({(u.mode, u.batch_size, u.candidates) for u in units})

        def noted(unit, outcomes):
            more = list(then(unit, outcomes)) if then else []
            self.held.append({(u.mode, u.batch_size, u.candidates) for u in more})
            return more

        yield from super().run(units, noted)


def stream(tmp_path, compile_workers=4):
    gpu = SyntheticGPU(SMALL, 0, fixed_noise=True)
    backend = Held(gpu, compile_workers)
    context = RunContext(SMALL, "Synthetic GPU", "0.0.0")
    return StoreMeasurer(context, backend, ResultStore(tmp_path / "m.jsonl")), backend


def test_a_candidate_asked_by_two_asks_at_once_is_compiled_and_timed_once(tmp_path):
    measurer, backend = stream(tmp_path)
    first, second = Ask(16, [GOOD, OTHER]), Ask(16, [OTHER, GOOD, RAISES])
    answers = {}
    measurer.measure_stream(
        [first, second], lambda ask, got: answers.setdefault(id(ask), got) and []
    )
    assert set(answers[id(first)]) == {GOOD, OTHER}
    assert set(answers[id(second)]) == {GOOD, OTHER, RAISES}
    assert answers[id(first)][OTHER] is answers[id(second)][OTHER]
    assert max(Counter(backend.log).values()) == 1  # each compiled once, timed at most once
    assert {c for mode, _, c in backend.log if mode == "warm"} == {GOOD, OTHER, RAISES}
    assert len(ResultStore(tmp_path / "m.jsonl").all()) == 3 == measurer.timed


def test_the_asks_that_follow_an_answer_join_the_same_run_and_lower_priorities_go_first(
    tmp_path,
):
    measurer, backend = stream(tmp_path, compile_workers=1)
    later = Ask(64, [BAD_COMPILE], "full")
    order = []

    def answered(ask, got):
        order.append(ask.batch_size)
        return [later] if ask.batch_size == 32 else []

    # One compile worker: the ask queued last but with the lower number is compiled first.
    measurer.measure_stream([Ask(16, [GOOD, OTHER], priority=5), Ask(32, [RAISES])], answered)
    warmed = [(m, c) for mode, m, c in backend.log if mode == "warm"]
    assert warmed[0] == (32, RAISES)
    assert set(warmed) == {(16, GOOD), (16, OTHER), (32, RAISES), (64, BAD_COMPILE)}
    assert order[0] == 32 and sorted(order) == [16, 32, 64]
    assert ("full", 64, BAD_COMPILE) in backend.log
    assert max(sum(1 for mode, *_ in held if mode == "warm") for held in backend.held) <= 1


def test_a_kernel_compiled_at_one_batch_size_is_compiled_after_it_at_another(tmp_path):
    """Two batch sizes most often share the kernel: the second compile waits for the first
    (Triton's cache then serves it), never running beside it."""
    measurer, backend = stream(tmp_path, compile_workers=4)
    measurer.measure_stream([Ask(16, [GOOD]), Ask(32, [GOOD, OTHER])], lambda ask, got: [])
    warms = [(m, c) for mode, m, c in backend.log if mode == "warm"]
    assert warms.index((16, GOOD)) < warms.index((32, GOOD))
    for held in backend.held:
        assert not {("warm", 16, (GOOD,)), ("warm", 32, (GOOD,))} <= held
    assert measurer.warm_count == 3 and measurer.timed == 3


def test_work_asked_alongside_runs_with_the_next_stream_behind_its_asks(tmp_path):
    """The engine baselines, known before the search, are measured with it (in its idle
    time, after every one of its asks), and never reach the search's own answers."""
    measurer, backend = stream(tmp_path, compile_workers=1)
    measurer.alongside(32, [GOOD], "full")
    answered = []
    measurer.measure_stream(
        [Ask(16, [GOOD, OTHER], priority=5)], lambda ask, got: answered.append(ask) or []
    )
    assert [ask.batch_size for ask in answered] == [16]  # only the search's ask is answered
    warmed = [(m, c) for mode, m, c in backend.log if mode == "warm"]
    assert warmed[-1] == (32, GOOD)  # behind the search's own work, even its priority 5
    assert ("full", 32, GOOD) in backend.log
    backend.log.clear()
    got = measurer.measure(32, [GOOD], "full")  # later: from the store
    assert got[GOOD].ok and backend.log == []
    measurer.measure_stream([Ask(16, [OTHER], "full")], lambda ask, got: [])
    assert ("full", 32, GOOD) not in backend.log  # once only: not again with a later stream
