"""Failures of the machine, not of a config: a missing package, no GPU, a broken driver.

A config can fail on its own (a compile error, out of resources, a wrong
result, a hang): that is a measurement, kept in the results store and reused
on resume. An environment failure says nothing about the config: every other
candidate would fail the same way. The tuner records it with the status
``environment``, never reuses it (the next run measures the candidate again),
and stops at once with the cause on one line (`WorkerEnvironmentError`).

Rows written before this status existed stored such failures as
``runtime_error`` or ``crashed``; `is_environment_error` recognises them by
their error text, so old stores are re-measured too. Pure: imports nothing heavy.
"""

from __future__ import annotations

import re

from moetune.errors import TuneError

ENVIRONMENT = "environment"

# Error texts that come from the machine, whatever the config (matched case-insensitively).
_MISSING_MODULE = re.compile(r"No module named '([^']+)'")
_PATTERNS = tuple(
    re.compile(text, re.IGNORECASE)
    for text in (
        r"^(ModuleNotFoundError|ImportError)\b",
        r"No module named '",
        r"cannot import name '",
        r"No CUDA GPUs are available",
        r"no CUDA-capable device is detected",
        r"Found no NVIDIA driver",
        r"NVIDIA driver on your system is too old",
        r"CUDA driver version is insufficient",
        r"Torch not compiled with CUDA enabled",
        r"CUDA unknown error",
        r"invalid device ordinal",
        r"\b0 active drivers\b",
        r"libcuda\.so cannot (be )?found",
        r"cuInit\b.*failed",
        r"CUDA_ERROR_(NO_DEVICE|NOT_INITIALIZED|SYSTEM_DRIVER_MISMATCH|COMPAT_NOT_SUPPORTED)",
        r"the worker cannot use (GPU|a GPU)",
        r"worker process cannot start",
    )
)
# Statuses an environment failure was stored under before it had its own.
_OLD_STATUSES = ("runtime_error", "crashed")


class WorkerEnvironmentError(TuneError):
    """The workers cannot run the kernel at all on this machine; no config is to blame."""

    def __init__(self, error: str) -> None:
        self.error = error
        super().__init__(
            f"the worker cannot run the kernel: {_cause(error)} (an environment problem, "
            f"not a config; {_remedy(error)}, and rerun)"
        )


def is_environment_error(error: str | None) -> bool:
    """Whether a one-line error text is the machine's fault rather than the config's."""
    return bool(error) and any(pattern.search(error) for pattern in _PATTERNS)


def is_environment_failure(status: str, error: str | None) -> bool:
    """Whether a stored row is an environment failure (its own status, or an old row's text)."""
    return status == ENVIRONMENT or (status in _OLD_STATUSES and is_environment_error(error))


def _cause(error: str) -> str:
    """The error without its exception-type prefix when that adds nothing (an import error)."""
    return re.sub(r"^(ModuleNotFoundError|ImportError): ", "", error.strip())


def _remedy(error: str) -> str:
    missing = _MISSING_MODULE.search(error)
    if missing or re.match(r"(ModuleNotFoundError|ImportError)\b", error):
        name = missing.group(1).split(".")[0] if missing else "the missing package"
        return (
            f"install {name}, e.g. with moetune's kernel extra (in the moetune checkout: "
            "pip install -e '.[kernel]')"
        )
    if "cannot start" in error:
        return "fix the error the worker printed above"
    return "check the GPU, its driver and --gpus / CUDA_VISIBLE_DEVICES"
