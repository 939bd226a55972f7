"""The signal helpers a tune relies on to stop quietly (see moetune/tune/signals.py)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moetune.tune.signals import children_ignore_interrupts, signals_deferred


def test_a_signal_inside_a_deferred_section_arrives_after_it():
    reached_end = False
    with pytest.raises(KeyboardInterrupt):
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler has run by now; it only recorded the signal
            reached_end = True
    assert reached_end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_deferred_section_without_a_signal_restores_the_handlers():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with signals_deferred():
        pass
    assert {s: signal.getsignal(s) for s in before} == before


def _blocked(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigBlk line")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_processes_started_inside_never_see_sigint_and_the_parent_still_does():
    code = "import sys, time; sys.stdout.write('up\\n'); sys.stdout.flush(); time.sleep(30)"
    with children_ignore_interrupts():
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "up\n"  # Python is up: it has installed its handlers
        assert _blocked(child.pid) & (1 << (signal.SIGINT - 1))
        child.send_signal(signal.SIGINT)
        time.sleep(0.3)
        assert child.poll() is None  # a KeyboardInterrupt would have ended it
    finally:
        child.kill()
        child.wait()
    assert not _blocked(os.getpid()) & (1 << (signal.SIGINT - 1))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_descendants_finds_grandchildren():
    from moetune.tune.measure.worker import descendants

    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
        "print(p.pid, flush=True); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(child.stdout.readline())
        assert descendants(child.pid) == [grandchild]
    finally:
        for pid in descendants(child.pid):
            os.kill(pid, signal.SIGKILL)
        child.kill()
        child.wait()
