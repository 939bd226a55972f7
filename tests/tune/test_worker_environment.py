"""Workers and the machine: environment failures stop the run, a dead parent ends the workers.

Faults are injected through MOETUNE_TEST_FAULTS (``import``: the worker finds
no numpy), read by the spawned worker.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moetune.errors import TuneError
from moetune.kernel.config import Candidate
from moetune.tune.environment import ENVIRONMENT, WorkerEnvironmentError
from moetune.tune.measure.measurer import RunContext, StoreMeasurer
from moetune.tune.measure.worker import FAULTS_ENV, WorkerPool, classify, parse_faults
from moetune.tune.problem import TuneProblem
from moetune.tune.store import ResultStore

PROBLEM = TuneProblem(4, 32, 64, 2, "bf16")
FIRST = Candidate(16, 32, 32, 1, 4, 2)
SECOND = Candidate(16, 32, 64, 1, 4, 2)
CONTEXT = RunContext(PROBLEM, "NVIDIA H200", "3.6.0")


def test_machine_errors_classify_as_environment():
    assert classify(ModuleNotFoundError("No module named 'numpy'", name="numpy")) == ENVIRONMENT
    assert classify(RuntimeError("No CUDA GPUs are available")) == ENVIRONMENT
    assert classify(AssertionError("Torch not compiled with CUDA enabled")) == ENVIRONMENT
    assert classify(RuntimeError("CUDA error: an illegal memory access")) == "runtime_error"


def test_a_fault_can_be_limited_to_one_mode():
    [fault] = parse_faults("hang:BLOCK_SIZE_N=32,mode=full")
    assert fault.hits(FIRST, "full") and not fault.hits(FIRST, "warm")


def test_an_environment_failure_is_recorded_then_stops_the_run_and_is_measured_again(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(FAULTS_ENV, "import:BLOCK_SIZE_K=32")
    store = ResultStore(tmp_path)
    with WorkerPool([None], timeout_s=60) as pool:
        measurer = StoreMeasurer(CONTEXT, pool, store, chunk_size=2)
        with pytest.raises(WorkerEnvironmentError, match="No module named 'numpy'"):
            measurer.measure(2, [FIRST, SECOND], "quick")
    # The failure is in the store, as such; the candidate after it was never tried.
    assert [(m.candidate, m.status) for m in ResultStore(tmp_path).all()] == [(FIRST, ENVIRONMENT)]

    monkeypatch.delenv(FAULTS_ENV)
    store = ResultStore(tmp_path)
    with WorkerPool([None], timeout_s=60) as pool:
        measurer = StoreMeasurer(CONTEXT, pool, store)
        results = measurer.measure(2, [FIRST, SECOND], "quick")
    assert measurer.reused == 0 and measurer.timed == 2
    assert all(m.ok for m in results.values())


def test_pool_refuses_a_timeout_that_is_not_finite():
    for bad in (float("inf"), float("nan"), 0.0, 1e300):
        with pytest.raises(TuneError, match="timeout must be a number of seconds"):
            WorkerPool([None], timeout_s=bad)


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="a CUDA machine measures them")
def test_ceilings_that_cannot_be_measured_are_an_error_not_a_worker_traceback(capfd):
    with WorkerPool([None], timeout_s=60) as pool:
        with pytest.raises(TuneError, match="CUDA"):
            pool.measure_ceilings()
        assert pool.timers[0].process.is_alive()  # the worker lives on
    assert "Traceback" not in capfd.readouterr().err


ORPHAN = """
import sys, threading
from moetune.tune.problem import TuneProblem
from moetune.kernel.config import Candidate
from moetune.tune.measure.worker import WorkerPool, WorkUnit

def run():
    pool = WorkerPool([None], timeout_s=600)
    for _ in pool.run([WorkUnit(TuneProblem(4, 32, 64, 2, "bf16"), 2,
                                (Candidate(16, 32, 32, 1, 4, 2),), "quick")]):
        pass

thread = threading.Thread(target=run, daemon=sys.argv[1] == "thread")
if sys.argv[1] == "thread":  # started off the main thread: no parent-death signal
    thread.start()
    thread.join()
else:
    run()
"""


def session_members(sid):
    members = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(entry))
    return members


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize("started_from", ["main", "thread"])
def test_a_busy_worker_exits_quietly_when_its_parent_is_killed(tmp_path, started_from):
    with open(tmp_path / "stderr", "w") as err:
        parent = subprocess.Popen(
            [sys.executable, "-c", ORPHAN, started_from],
            stderr=err,
            env={**os.environ, "TRITON_INTERPRET": "1", FAULTS_ENV: "hang:BLOCK_SIZE_N=32"},
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while len(session_members(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(3)  # the worker is inside the hour-long candidate by now
        assert parent.poll() is None and len(session_members(parent.pid)) >= 2
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while session_members(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = session_members(parent.pid)
    finally:
        for pid in session_members(parent.pid):
            os.kill(pid, signal.SIGKILL)
    assert left == [], "the worker outlived its parent"
    assert (tmp_path / "stderr").read_text() == ""
