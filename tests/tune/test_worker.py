"""Worker processes: faults of every kind become recorded outcomes and the sweep goes on.

Faults are injected through MOETUNE_TEST_FAULTS, read by the (spawned) worker:
a candidate that raises, one that kills its process, one that hangs, one that
reports a CUDA error (the worker exits, as its context would be poisoned), and
a verification that gets a wrong output.
"""

import pytest

from moetune.kernel.config import Candidate
from moetune.tune.measure.timing import Outcome
from moetune.tune.measure.worker import FAULTS_ENV, WorkerPool, WorkUnit, classify, parse_faults
from moetune.tune.problem import TuneProblem

PROBLEM = TuneProblem(4, 32, 64, 2, "bf16")
GOOD = Candidate(16, 32, 32, 1, 4, 2)
RAISES = Candidate(16, 32, 64, 1, 4, 2)
CRASHES = Candidate(16, 64, 32, 1, 4, 2)
HANGS = Candidate(16, 64, 64, 1, 4, 2)
CUDA_ERROR = Candidate(16, 32, 32, 1, 4, 3)
AFTER = Candidate(16, 32, 32, 1, 8, 2)
FAULTS = (
    "raise:BLOCK_SIZE_N=32,BLOCK_SIZE_K=64;"
    "crash:BLOCK_SIZE_N=64,BLOCK_SIZE_K=32;"
    "hang:BLOCK_SIZE_N=64,BLOCK_SIZE_K=64;"
    "cuda:num_stages=3;"
    "wrong:num_warps=8"
)


def test_parse_faults_and_match():
    faults = parse_faults("crash:BLOCK_SIZE_M=32;raise:BLOCK_SIZE_N=64,num_warps=8")
    assert [f.kind for f in faults] == ["crash", "raise"]
    assert faults[0].hits(Candidate(32, 32, 32, 1, 4, 2))
    assert not faults[1].hits(Candidate(16, 64, 32, 1, 4, 2))
    assert faults[1].hits(Candidate(16, 64, 32, 1, 8, 2))


def test_classify_by_exception_type():
    class OutOfResources(Exception):
        pass

    class CompilationError(Exception):
        pass

    assert classify(OutOfResources("shared memory")) == "out_of_resources"
    assert classify(CompilationError("bad")) == "compile_error"
    assert classify(ValueError("x")) == "runtime_error"


@pytest.mark.slow
def test_every_fault_is_recorded_and_the_sweep_goes_on(monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, FAULTS)
    units = [
        WorkUnit(PROBLEM, 4, (GOOD, RAISES, CRASHES, HANGS, CUDA_ERROR, AFTER), "quick"),
        WorkUnit(PROBLEM, 4, (GOOD, AFTER), "verify"),
    ]
    with WorkerPool([None], timeout_s=10) as pool:
        results = [(unit.mode, outcome) for unit, outcome in pool.run(units)]
    timed = {o.candidate: o for mode, o in results if mode == "quick"}
    verified = {o.candidate: o for mode, o in results if mode == "verify"}
    assert len(timed) == 6 and len(verified) == 2

    assert timed[GOOD].status == "ok" and timed[GOOD].latency_us > 0
    assert timed[RAISES].status == "runtime_error"
    assert timed[RAISES].error.startswith("RuntimeError: injected fault")
    assert timed[CRASHES].status == "crashed"
    assert timed[CRASHES].error == "worker process died (exit code 11)"
    assert timed[HANGS].status == "timeout"
    assert "no result within 10 s" in timed[HANGS].error
    assert timed[CUDA_ERROR].status == "runtime_error"
    assert "illegal memory access" in timed[CUDA_ERROR].error
    # Measured by the fresh worker that replaced the poisoned one.
    assert timed[AFTER].status == "ok"

    assert verified[GOOD].status == "ok" and verified[GOOD].rel_rms < 0.02
    assert verified[AFTER].status == "wrong_result"
    assert "relative RMS error" in verified[AFTER].error


@pytest.mark.slow
def test_workers_are_recycled_after_their_quota():
    units = [WorkUnit(PROBLEM, 2, (GOOD,), "warm"), WorkUnit(PROBLEM, 2, (AFTER,), "warm")]
    with WorkerPool([None], recycle_after=1) as pool:
        pids = []
        for _, outcome in pool.run(units[:1]):
            assert outcome.status == "ok" and outcome.compile_s > 0
        pids.append(pool.timers[0].process)
        outcomes = [outcome for _, outcome in pool.run(units[1:])]
    assert pids == [None]  # stopped after one candidate, restarted for the next unit
    assert [o.status for o in outcomes] == ["ok"]


@pytest.mark.slow
def test_a_run_left_midway_hands_the_next_run_none_of_its_outcomes():
    """A caller that stops reading (an error in its follow-up hook, a search that failed)
    leaves no unit behind in a worker for the next run to read as its own."""
    first = WorkUnit(PROBLEM, 2, (GOOD, AFTER, GOOD), "quick")
    with WorkerPool([None], compile_workers=1) as pool:
        run = pool.run([first, WorkUnit(PROBLEM, 2, (AFTER,), "warm")])
        next(run)
        run.close()
        assert all(worker.job is None for worker in pool.timers + pool.warmers)
        again = [
            (unit.batch_size, o.candidate)
            for unit, o in pool.run([WorkUnit(PROBLEM, 4, (AFTER,), "quick")])
        ]
    assert again == [(4, AFTER)]


def test_unknown_mode_is_refused():
    with WorkerPool([None]) as pool, pytest.raises(ValueError, match="unknown mode"):
        list(pool.run([WorkUnit(PROBLEM, 2, (GOOD,), "slow")]))


def test_outcome_defaults():
    outcome = Outcome(GOOD, "timeout", error="x")
    assert outcome.latency_us is None and outcome.compile_s is None


def test_a_confirmation_round_gives_every_config_the_same_routing_draws(monkeypatch):
    """Mode "confirm": each candidate of the unit is timed at full fidelity after the round's
    seed, so each reads the same router logits; another round's seed draws others."""
    import torch

    from moetune.tune.measure import timing
    from moetune.tune.measure.worker import _Inputs, _measure

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    seen = []  # (BLOCK_SIZE_N, the router logits of one call)

    def record(problem, config, router_logits):
        seen.append((config["BLOCK_SIZE_N"], router_logits.clone()))

    monkeypatch.setattr(timing, "_call", record)
    problem = TuneProblem(4, 32, 64, 2, "bf16")
    a, b = Candidate(16, 32, 32, 1, 4, 2), Candidate(16, 64, 32, 1, 4, 2)
    inputs = _Inputs()
    for seed in (11, 12):
        unit = WorkUnit(problem, 2, (a, b), "confirm", seed=seed)
        for candidate in unit.candidates:
            outcome = _measure(unit, candidate, inputs, [])
            assert outcome.status == "ok" and outcome.latency_us > 0
    # Per timing: the compile call on the problem's own logits, then the timed calls' draws.
    calls = 1 + timing.CPU_CALLS["full"]
    assert len(seen) == 4 * calls
    draws = [[logits for _, logits in seen[i * calls + 1 : (i + 1) * calls]] for i in range(4)]
    assert all(torch.equal(x, y) for x, y in zip(draws[0], draws[1], strict=True))  # a, b: seed 11
    assert all(torch.equal(x, y) for x, y in zip(draws[2], draws[3], strict=True))  # a, b: seed 12
    assert not torch.equal(draws[0][0], draws[2][0])
