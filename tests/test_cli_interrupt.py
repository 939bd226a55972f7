"""Ctrl-C and SIGTERM to the process group of a running tune (what a terminal's Ctrl-C does),
SIGHUP or ``kill -9`` to the tuner alone.

A real CPU tune of the tiny model (with a compile worker, so that the timer and
the warmer both get the signal), stopped once a measurement is stored. The
parent must print one line and exit 128 + signal; no worker may print a
traceback or outlive it; the store must load cleanly and a rerun resume from it.
A tuner killed outright leaves no worker behind either, busy or idle.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from moetune.tune.measure.worker import FAULTS_ENV
from moetune.tune.store import STORE_FILENAME, ResultStore

# Each test is a real CPU tune, stopped midway (and one resumed): slow, so started first.
pytestmark = pytest.mark.slow
DATA = Path(__file__).parent / "tune" / "data"
# 3 candidates at one batch size + the default config.
MEASUREMENTS = 4


def tune_command(save_dir, *extra):
    return [
        sys.executable,
        "-m",
        "moetune",
        "tune",
        "--model",
        str(DATA / "tiny-moe"),
        "--space",
        str(DATA / "tiny-space.json"),
        "--batch-size",
        "2",
        "--search",
        "exhaustive",
        "--save-dir",
        str(save_dir),
        "--device-name",
        "NVIDIA H200",
        "--engine",
        "vllm",  # no SGLang split tune: the 4 measurements below
        *extra,
    ]


def session_members(sid):
    """Pids of live (non-zombie) processes in session `sid`, from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        state, session = fields[0], int(fields[3])
        if session == sid and state != "Z":
            members.append(int(entry))
    return members


def stored_lines(path):
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize(
    ("signum", "code", "head"),
    [(signal.SIGINT, 130, "Interrupted"), (signal.SIGTERM, 143, "Terminated")],
    ids=["SIGINT", "SIGTERM"],
)
def test_signal_to_the_process_group_stops_the_tune_quietly(tmp_path, signum, code, head):
    store = tmp_path / STORE_FILENAME
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    with open(tmp_path / "stderr", "w") as err:
        process = subprocess.Popen(
            tune_command(tmp_path, "--compile-workers", "1"),
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            start_new_session=True,  # its own process group, like a terminal job
        )
        try:
            deadline = time.monotonic() + 120
            while process.poll() is None and time.monotonic() < deadline:
                if stored_lines(store) >= 1:
                    break
                time.sleep(0.02)
            assert process.poll() is None, "the tune ended before it could be interrupted"
            # The tuner, its timer and its compile worker (and multiprocessing's tracker).
            assert len(session_members(process.pid)) >= 3
            os.killpg(process.pid, signum)
            returncode = process.wait(timeout=60)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    stderr = (tmp_path / "stderr").read_text()
    assert returncode == code, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    # First the plan's note of the fallback to the twin (no engine installed here), then
    # exactly one line from the interrupt, the last one; between them at most the progress bar.
    twin = "(moetune/kernel/fused_moe_kernel.py)\n"
    assert stderr.startswith("Note: vLLM is not installed") and twin in stderr, stderr
    lines = [line for line in stderr.split(twin, 1)[1].splitlines() if line.strip()]
    saved = stored_lines(store)
    assert lines[-1] == (
        f"{head}: {saved} measurement{'s' if saved != 1 else ''} saved in {store} "
        f"({saved} from this run); rerun the same command to resume"
    )
    assert len(lines) <= 2 and all(re.match(r"tuning", line) for line in lines[:-1]), stderr

    deadline = time.monotonic() + 10  # multiprocessing's tracker leaves once the pipe closes
    while session_members(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert session_members(process.pid) == [], "a worker outlived the tuner"

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a torn or unreadable line would warn
        kept = ResultStore(store).all()
    assert 1 <= len(kept) == saved < MEASUREMENTS
    assert all(m.status == "ok" for m in kept)  # no worker killed by the signal counted as crashed
    if signum != signal.SIGINT:
        return  # resuming does not depend on how the run was stopped; once is enough

    rerun = subprocess.run(  # no confirmation round: the resumed search is what is checked
        tune_command(tmp_path, "--confirm-rounds", "0", "--json"),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads(rerun.stdout)
    assert summary["reused"] == saved
    assert summary["measured"] == MEASUREMENTS - saved


def start_hanging_tune(tmp_path):
    """A tune whose timer hangs on its second candidate while its compile worker sits idle.

    Returns the process once a measurement is stored and nothing has moved for a while
    (the timer is inside the hang).
    """
    store = tmp_path / STORE_FILENAME
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        # Timing (not compiling) M16 N64 K64 sleeps for an hour.
        FAULTS_ENV: "hang:BLOCK_SIZE_N=64,BLOCK_SIZE_K=64,mode=full",
    }
    err = open(tmp_path / "stderr", "w")
    process = subprocess.Popen(
        tune_command(tmp_path, "--compile-workers", "1", "--timeout", "600"),
        stdout=subprocess.DEVNULL,
        stderr=err,
        env=env,
        start_new_session=True,
    )
    err.close()
    deadline = time.monotonic() + 180
    seen, since = 0, time.monotonic()
    while process.poll() is None and time.monotonic() < deadline:
        lines = stored_lines(store)
        if lines != seen:
            seen, since = lines, time.monotonic()
        elif seen >= 1 and time.monotonic() - since > 4:
            break
        time.sleep(0.1)
    assert process.poll() is None, (tmp_path / "stderr").read_text()
    assert len(session_members(process.pid)) >= 3  # tuner, timer, warmer (and the tracker)
    return process


def wait_until_alone(sid, seconds=15):
    deadline = time.monotonic() + seconds
    while session_members(sid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return session_members(sid)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_workers_exit_quietly_when_the_tuner_is_killed(tmp_path):
    process = start_hanging_tune(tmp_path)
    try:
        os.kill(process.pid, signal.SIGKILL)  # the tuner alone; its workers get no signal
        process.wait()
        left = wait_until_alone(process.pid)
    finally:
        for pid in session_members(process.pid):
            os.kill(pid, signal.SIGKILL)
    assert left == [], "a worker (or multiprocessing's tracker) outlived the tuner"
    stderr = (tmp_path / "stderr").read_text()
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert all(m.status == "ok" for m in ResultStore(tmp_path / STORE_FILENAME).all())


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_sighup_to_the_tuner_stops_it_like_sigterm(tmp_path):
    process = start_hanging_tune(tmp_path)
    try:
        os.kill(process.pid, signal.SIGHUP)  # the terminal closed, as the tuner sees it
        returncode = process.wait(timeout=60)
        left = wait_until_alone(process.pid)
    finally:
        for pid in session_members(process.pid):
            os.kill(pid, signal.SIGKILL)
    stderr = (tmp_path / "stderr").read_text()
    store = tmp_path / STORE_FILENAME
    saved = stored_lines(store)
    assert returncode == 128 + signal.SIGHUP, stderr
    assert "Traceback" not in stderr, stderr
    assert [line for line in stderr.splitlines() if line.strip()][-1] == (
        f"Terminated: {saved} measurement{'s' if saved != 1 else ''} saved in {store} "
        f"({saved} from this run); rerun the same command to resume"
    )
    assert left == [], "a worker outlived the tuner"
