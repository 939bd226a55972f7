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
- SIGTERM keeps its default action in workers (a silent exit); the parent
  turns its own SIGTERM into `moetune.errors.Terminated` (see `moetune.cli`).
- short sections that must not be cut (appending one line to the results store,
  killing the workers) run under `signals_deferred`: a signal arriving inside is
  delivered when the section ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
