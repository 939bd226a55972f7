"""`--backend ray` on a local Ray instance (CPU, interpreter): same units, same fault isolation."""

import sys

import pytest

from moetune.errors import TuneError
from moetune.kernel.config import Candidate
from moetune.tune.measure.worker import FAULTS_ENV, WorkUnit
from moetune.tune.problem import TuneProblem

PROBLEM = TuneProblem(4, 32, 64, 2, "bf16")
GOOD = Candidate(16, 32, 32, 1, 4, 2)
CRASHES = Candidate(16, 64, 32, 1, 4, 2)


def test_missing_ray_gives_a_one_line_error(monkeypatch):
    from moetune.tune.measure.ray_backend import RayBackend

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(TuneError, match=r"pip install -e '\.\[ray\]' in the moetune checkout"):
        RayBackend()


def test_ray_actors_run_units_and_survive_a_crashing_candidate(monkeypatch):
    pytest.importorskip("ray")
    from moetune.tune.measure.ray_backend import RayBackend

    # Read by the worker processes the actor spawns (they inherit the actor's environment).
    monkeypatch.setenv(FAULTS_ENV, "crash:BLOCK_SIZE_N=64")
    backend = RayBackend(
        num_actors=1,
        timeout_s=60,
        init_kwargs={
            "num_cpus": 2,
            "include_dashboard": False,
            "runtime_env": {"env_vars": {FAULTS_ENV: "crash:BLOCK_SIZE_N=64"}},
        },
    )
    try:
        assert backend.parallelism == 1 and backend.compile_workers == 0
        units = [
            WorkUnit(PROBLEM, 2, (GOOD, CRASHES), "quick"),
            WorkUnit(PROBLEM, 4, (GOOD,), "verify"),
        ]
        results = {(u.batch_size, o.candidate): o for u, o in backend.run(units)}
    finally:
        backend.close()
    assert results[(2, GOOD)].status == "ok" and results[(2, GOOD)].latency_us > 0
    assert results[(2, CRASHES)].status == "crashed"
    assert results[(4, GOOD)].status == "ok" and results[(4, GOOD)].rel_rms < 0.02
