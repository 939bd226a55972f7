"""Test-wide setup: Triton runs in its interpreter unless a GPU run asks otherwise.

TRITON_INTERPRET must be set before triton is imported, so it is set here, at
collection time. `make test-gpu` sets TRITON_INTERPRET=0 and MOETUNE_GPU_TESTS=1.
"""

import os
import signal
import subprocess
import warnings

import pytest

# A GPU run's pytest-xdist workers inherit this process's environment, TRITON_INTERPRET
# removed: MOETUNE_GPU_TESTS keeps them off the interpreter too.
if os.environ.get("TRITON_INTERPRET") == "0" or os.environ.get("MOETUNE_GPU_TESTS") == "1":
    os.environ.pop("TRITON_INTERPRET", None)
else:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The width moetune wraps at comes from the terminal or $COLUMNS. pytest-xdist's workers
# inherit COLUMNS=80 from somewhere in their start-up, a plain run none: a test that wants a
# width sets $COLUMNS itself, so the suite reads the same under both.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)


def pytest_collection_modifyitems(items):
    """Run the tests marked ``slow`` first (the rest keep their order).

    `make test` spreads single tests over its workers as each one frees up (pytest-xdist's
    loadgroup), in this order: a one-minute tune started last would run alone at the end of
    the suite, while started first it runs beside the many short tests.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def moetune_in_process(capsys, monkeypatch):
    """Run ``moetune ARGS`` in this process, through `moetune.cli.main` as ``python -m
    moetune`` runs it (its exit codes, its one-line errors), for a test where a fresh process
    adds nothing but its start-up (a second or two: torch's import).

    Returns a callable ``(args, env=None)`` answering a `subprocess.CompletedProcess`; `env`
    holds variables set for the rest of the test (a value None: unset). Not for what a
    process must see afresh (CUDA_VISIBLE_DEVICES once torch has looked, signals, exit).
    """
    from moetune.cli import _TERMINATING, main

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # main sets it

    def run(args, env=None):
        for name, value in (env or {}).items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        argv = [str(arg) for arg in args]
        handlers = {signum: signal.getsignal(signum) for signum in _TERMINATING}
        capsys.readouterr()
        try:
            with pytest.raises(SystemExit) as stop:
                main(argv)
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
        out = capsys.readouterr()
        return subprocess.CompletedProcess(argv, stop.value.code or 0, out.out, out.err)

    return run
