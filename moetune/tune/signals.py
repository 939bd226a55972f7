"""Ctrl-C and SIGTERM for a tuning run: the parent stops cleanly, worker processes stay quiet.

A terminal's Ctrl-C sends SIGINT to every process of the foreground process
group: the tuner, its timer processes and its compile processes. Left alone,
each worker would raise KeyboardInterrupt and print a traceback (about 100
lines from 16 compile workers). Instead:

- worker processes never act on SIGINT: they start with SIGINT blocked (a
  blocked signal mask is inherited through fork and exec, so it holds from the
  child's first instruction, before Python has installed its handler) and ignore
  it from then on (`ignore_interrupts`). The parent owns shutdown: it kills them
  when its own KeyboardInterrupt unwinds (`WorkerPool.close`).
- SIGTERM and SIGHUP keep their default action in workers (a silent exit); the
  parent turns its own into `moetune.errors.Terminated` (see `moetune.cli`).
- workers watch their parent (`watch_parent`): if it dies without stopping them
  (``kill -9``), they exit at once and quietly, whatever they are doing.
- short sections that must not be cut (appending one line to the results store,
  killing the workers) run under `signals_deferred`: a signal arriving inside is
  delivered when the section ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

# SIGHUP (the terminal closed) stops a run like SIGTERM does.
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def children_ignore_interrupts() -> Iterator[None]:
    """Processes started inside this block begin life with SIGINT blocked.

    Only the calling thread's mask changes, for the moment of the start; a
    SIGINT meant for this process meanwhile stays pending (or reaches another
    thread) and is handled as usual, never lost.
    """
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_interrupts() -> None:
    """In a worker process: ignore SIGINT for good (the parent decides when workers stop)."""
    if _in_main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Run a short section to its end; SIGINT/SIGTERM arriving inside are acted on after it.

    Python-level handlers are swapped for one that only records the signal,
    so this works whichever thread the kernel delivers the signal to. Outside
    the main thread (where handlers cannot be changed) the section just runs.
    """
    if not _in_main_thread():
        yield
        return
    pending: list[int] = []
    previous: dict[int, Any] = {}
    for signum in STOP_SIGNALS:
        previous[signum] = signal.signal(signum, lambda s, _frame: pending.append(s))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if pending:
            _deliver(pending[0], previous[pending[0]])


def _deliver(signum: int, handler: Any) -> None:
    if handler is signal.SIG_IGN:
        return
    if callable(handler):
        handler(signum, None)
    else:  # SIG_DFL, or a handler installed outside Python
        signal.raise_signal(signum)


# prctl(2) option: the signal this process gets when the thread that started it dies.
_PR_SET_PDEATHSIG = 1
# How often a worker checks, besides waiting on its parent's sentinel, that its parent lives.
PARENT_POLL_S = 1.0


def watch_parent(kill_with_parent: bool = False) -> None:
    """In a worker process: exit at once, quietly, when the parent process dies.

    A daemon thread waits on multiprocessing's parent sentinel (readable when
    the parent is gone) and polls the parent pid; either ends the process with
    ``os._exit(0)``, whatever the main thread is doing, and without a traceback.
    With `kill_with_parent` (the parent started this process from its main
    thread), Linux also sends SIGKILL on the parent's death (``PR_SET_PDEATHSIG``),
    which works even while the main thread holds the GIL in native code.
    """
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is None or parent.pid is None:
        return
    if kill_with_parent and sys.platform.startswith("linux"):
        _set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent.pid:  # it died before the death signal was set up
        os._exit(0)
    threading.Thread(
        target=_exit_with_parent,
        args=(parent.sentinel, parent.pid),
        name="moetune-parent-watch",
        daemon=True,
    ).start()


def _exit_with_parent(sentinel: Any, parent_pid: int) -> None:
    from multiprocessing.connection import wait

    while True:
        if sentinel is None:
            time.sleep(PARENT_POLL_S)
            gone = False
        else:
            gone = bool(wait([sentinel], timeout=PARENT_POLL_S))
        if gone or os.getppid() != parent_pid:
            os._exit(0)


def _set_parent_death_signal(signum: int) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):  # no libc prctl: the watching thread is enough
        pass
