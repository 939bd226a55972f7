"""The results store: every measurement, one JSON line each, as soon as it exists.

The store is the tuner's resume mechanism. The runner asks `ResultStore.get`
before measuring a candidate and `add`s each measurement the moment it is
taken; `add` appends one line and fsyncs it, so a ``kill -9`` loses at most
the line being written, and a Ctrl-C or SIGTERM none (they wait for the append
to finish, `moetune.tune.signals.signals_deferred`). A torn last line (a kill mid-write) is ignored
on load with a warning and cut off before the next append.

A measurement is keyed by (problem key, batch size, candidate, fidelity,
device name, Triton version, and what was timed: `kind` with its TMA flags and,
for a pair, the down config; see `moetune.kernel.probe`): a store may hold
several problems, GPUs and Triton versions side by side without mixing them.
Rows written before kinds existed read as ``kind: "whole"``. A failed candidate is a row
like any other, with its status and error. When a key appears twice, the later
line wins (a rerun with ``--overwrite`` re-measures and appends).

An environment failure (a missing package, no GPU: `moetune.tune.environment`)
is stored with the status ``environment`` but never served by `get`: the
candidate is measured again on the next run. Old rows that hold such a failure
as ``runtime_error`` are recognised by their error text.

Reading never loses data: a line that is not a measurement (junk, wrong types,
a field out of range) is skipped with a warning naming its line and left in the
file; only a torn last line (no newline, not even a whole JSON value) is cut
off before the next append; a whole last line missing its newline is kept. The store
refuses to follow a symlink (its target would be truncated and appended to); given the
save dir it lies in (`within`), it also refuses a symlinked folder between the two
(`moetune.fileio.refuse_links_under`), where creating and appending would land elsewhere.
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, BinaryIO

from filelock import FileLock

from moetune.errors import MoetuneWarning, TuneError
from moetune.fileio import Within, refuse_links_under
from moetune.kernel.config import Candidate
from moetune.kernel.probe import KINDS, Probe, from_fields, probe_fields
from moetune.tune.environment import ENVIRONMENT, is_environment_failure
from moetune.tune.signals import signals_deferred

STORE_FILENAME = "measurements.jsonl"
# Open flags that refuse a symlink and keep the descriptor out of worker processes.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# How far back from the end a torn line is looked for (one line is well under 1 KiB).
_TAIL_WINDOW = 1 << 20
FIDELITIES = ("quick", "full")
STATUSES = (
    "ok",
    "out_of_resources",
    "compile_error",
    "runtime_error",
    "timeout",
    "crashed",
    "wrong_result",
    "unsupported",  # the device cannot run it (TMA off Hopper, or in the interpreter)
    ENVIRONMENT,  # the machine, not the config (no module, no GPU): never reused
)

StoreKey = tuple[str, int, Candidate, str, str, str, str, bool, Candidate | None, bool]
# Fields added with measurement kinds; rows without them are whole-call timings.
_KIND_DEFAULTS = {"kind": "whole", "use_tma": False, "down_candidate": None, "down_tma": False}
# How many skipped line numbers a load warning lists.
_SKIPPED_SHOWN = 5


class BadRow(ValueError):
    """A store line that is not a measurement; the message says which field and why."""


@dataclass(frozen=True)
class Measurement:
    """One timing (or failure) of one candidate at one batch size.

    Latencies are microseconds per fused call: `latency_us` the median of the
    replays, `p20_us`/`p80_us` the 20th/80th percentiles; all three are None
    unless `status` is ``"ok"``. `compile_s` is the compile time, kept out of
    the latency. `fidelity` is ``"quick"`` (few replays, for early search
    rounds) or ``"full"``.
    """

    problem_key: str
    batch_size: int
    candidate: Candidate
    fidelity: str
    status: str
    latency_us: float | None
    p20_us: float | None
    p80_us: float | None
    compile_s: float | None
    error: str | None
    device_name: str
    triton_version: str
    moetune_version: str
    timestamp: float
    kind: str = "whole"
    use_tma: bool = False
    down_candidate: Candidate | None = None
    down_tma: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.candidate, Probe):  # a probe is stored as its fields
            kind, candidate, use_tma, down, down_tma = probe_fields(self.candidate)
            for name, value in (
                ("candidate", candidate),
                ("kind", kind),
                ("use_tma", use_tma),
                ("down_candidate", down),
                ("down_tma", down_tma),
            ):
                object.__setattr__(self, name, value)
        if self.kind not in KINDS:
            raise TuneError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.fidelity not in FIDELITIES:
            raise TuneError(
                f"fidelity must be one of {', '.join(FIDELITIES)}, got {self.fidelity!r}"
            )
        if self.status not in STATUSES:
            raise TuneError(f"status must be one of {', '.join(STATUSES)}, got {self.status!r}")
        if self.status == "ok" and self.latency_us is None:
            raise TuneError("an ok measurement needs a latency")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def environment_failure(self) -> bool:
        """A failure of the machine, not of the config (re-measured on the next run)."""
        return is_environment_failure(self.status, self.error)

    @property
    def probe(self) -> Candidate | Probe:
        """What was timed: the candidate (a whole call) or the `Probe`."""
        return from_fields(
            self.kind, self.candidate, self.use_tma, self.down_candidate, self.down_tma
        )

    def key(self) -> StoreKey:
        return _key(
            self.problem_key,
            self.batch_size,
            self.probe,
            self.fidelity,
            self.device_name,
            self.triton_version,
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["candidate"] = self.candidate.as_config()
        if self.down_candidate is not None:
            data["down_candidate"] = self.down_candidate.as_config()
        return data

    @classmethod
    def from_json(cls, data: Any) -> Measurement:
        """A measurement from one store row; `BadRow` names the field that is wrong."""
        if not isinstance(data, dict):
            raise BadRow(f"not a JSON object but {type(data).__name__}")
        values: dict[str, Any] = {}
        for spec in fields(cls):
            name = spec.name
            if name not in data and name not in _KIND_DEFAULTS:
                raise BadRow(f"no {name}")
            values[name] = _checked(name, data.get(name, _KIND_DEFAULTS.get(name)))
        try:
            measurement = cls(**values)
            measurement.probe  # noqa: B018 - a kind and configs that do not fit together raise
        except (TuneError, ValueError, TypeError) as exc:
            raise BadRow(str(exc)) from None
        return measurement

    @classmethod
    def failure(
        cls,
        *,
        problem_key: str,
        batch_size: int,
        candidate: Candidate | Probe,
        fidelity: str,
        status: str,
        error: str,
        device_name: str,
        triton_version: str,
        moetune_version: str,
        compile_s: float | None = None,
    ) -> Measurement:
        """A row for a candidate that did not produce a timing."""
        return cls(
            problem_key=problem_key,
            batch_size=batch_size,
            candidate=candidate,
            fidelity=fidelity,
            status=status,
            latency_us=None,
            p20_us=None,
            p80_us=None,
            compile_s=compile_s,
            error=error,
            device_name=device_name,
            triton_version=triton_version,
            moetune_version=moetune_version,
            timestamp=time.time(),
        )


_NUMBERS = {"latency_us", "p20_us", "p80_us", "compile_s"}
_TEXTS = {"problem_key", "fidelity", "status", "device_name", "triton_version", "kind"}


def _checked(name: str, value: Any) -> Any:
    """One row field with its JSON type checked (and a candidate parsed); `BadRow` if wrong."""
    if name in _TEXTS or name == "moetune_version":
        if not isinstance(value, str):
            raise BadRow(f"{name} must be a string, got {value!r:.80}")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # JSON's \ud800 escape: no text to print or write
                raise BadRow(f"{name} is not valid Unicode, got {value!r:.80}") from None
    elif name == "error":
        if value is not None and not isinstance(value, str):
            raise BadRow(f"error must be a string or null, got {value!r:.80}")
    elif name == "batch_size":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadRow(f"batch_size must be a positive integer, got {value!r:.80}")
    elif name in _NUMBERS or name == "timestamp":
        if value is None and name != "timestamp":
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadRow(f"{name} must be a number, got {value!r:.80}")
        try:
            value = float(value)
        except OverflowError:
            raise BadRow(f"{name} is out of range") from None
        if not math.isfinite(value) or value < 0:
            raise BadRow(f"{name} must be a finite number >= 0, got {value!r:.80}")
        return value
    elif name in ("use_tma", "down_tma"):
        if not isinstance(value, bool):
            raise BadRow(f"{name} must be true or false, got {value!r:.80}")
    elif name in ("candidate", "down_candidate"):
        if value is None and name == "down_candidate":
            return None
        try:
            return Candidate.from_config(value)
        except (TuneError, TypeError, ValueError) as exc:
            raise BadRow(f"{name}: {str(exc):.200}") from None
    return value


def parse_line(line: bytes) -> Measurement:
    """The measurement one store line holds; `BadRow` (a ValueError) if it holds none."""
    try:
        data = json.loads(line)
    except RecursionError:
        raise BadRow("nested too deeply to be a measurement") from None
    except ValueError as exc:  # invalid JSON or UTF-8
        raise BadRow(f"not JSON: {str(exc):.120}") from None
    return Measurement.from_json(data)


def _unwritable(path: Path, exc: OSError) -> TuneError:
    return TuneError(
        f"cannot write to the results store {path} ({exc.strerror or exc}); make it writable "
        "or pass another --save-dir"
    )


def _is_json(line: bytes) -> bool:
    """Whether `line` is one whole JSON value (a torn row never is: it lacks its closing brace)."""
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


def _refuse_links(path: Path, what: str = "the results store") -> None:
    """Refuse a store (or its lock) that is a symlink or not a regular file."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TuneError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(info.st_mode):
        raise TuneError(
            f"{what} {path} is a symlink; moetune does not follow it (it would append to "
            "and cut the target): replace it with the file itself, or use another --save-dir"
        )
    if not stat.S_ISREG(info.st_mode):
        raise TuneError(f"{what} {path} is not a regular file; move it away")


def store_lock_path(path: Path) -> Path:
    """The lock file `ResultStore.add` takes for the store at `path`."""
    return Path(f"{path}.lock")


class ResultStore:
    """Append-only JSON Lines file of `Measurement`s, indexed in memory by key.

    `path` is the file, or a directory (then ``measurements.jsonl`` inside it); a path
    named ``measurements.jsonl`` is always the file, so a directory of that name is
    refused, not given a store nested inside it.
    The file and its folder are created on the first `add`. `skipped` lists the
    line numbers that held no measurement (they stay in the file). `within` (the save
    dir, a folder above `path`): no folder or file between the two may be a symlink.
    """

    def __init__(self, path: str | os.PathLike[str], *, within: Within = None) -> None:
        target = Path(path)
        nested = target.is_dir() and target.name != STORE_FILENAME
        self.path = target / STORE_FILENAME if nested else target
        self.lock_path = store_lock_path(self.path)
        self.within = within
        self._rows: list[Measurement] = []
        self._index: dict[StoreKey, Measurement] = {}
        self.skipped: list[int] = []
        self._load()

    def _refuse_linked_folders(self) -> None:
        if self.within is not None:
            refuse_links_under(self.within, self.lock_path)
            refuse_links_under(self.within, self.path)

    def _load(self) -> None:
        self._refuse_linked_folders()
        _refuse_links(self.path)
        _refuse_links(self.lock_path, "the results store's lock")
        try:
            fd = os.open(self.path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise TuneError(
                f"cannot read the results store {self.path}: {exc.strerror or exc}"
            ) from None
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read()
        lines = raw.split(b"\n")
        last = lines.pop()  # b"" when the file ends with a newline
        reasons: dict[int, str] = {}
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                self._remember(parse_line(line))
            except BadRow as exc:
                reasons[number] = str(exc)
        if last.strip():
            # A complete line that only lacks its newline is kept (and fenced on append).
            if _is_json(last):
                try:
                    self._remember(parse_line(last))
                except BadRow as exc:
                    reasons[len(lines) + 1] = str(exc)
            else:
                warnings.warn(
                    f"{self.path}: ignoring a torn last line ({len(last)} bytes; "
                    "an interrupted write) - it is cut off before the next append",
                    MoetuneWarning,
                    stacklevel=3,
                )
        if reasons:
            self.skipped = sorted(reasons)
            _warn_skipped(self.path, reasons)

    def _remember(self, measurement: Measurement) -> None:
        self._rows.append(measurement)
        self._index[measurement.key()] = measurement

    def get(
        self,
        problem_key: str,
        batch_size: int,
        candidate: Candidate | Probe,
        fidelity: str,
        device_name: str,
        triton_version: str,
    ) -> Measurement | None:
        """The stored measurement for this key (the latest, if repeated), or None.

        `candidate` is a plain candidate (a whole-call timing) or a `Probe`. An
        environment failure is never returned: it says nothing about the candidate.
        """
        found = self._index.get(
            _key(problem_key, batch_size, candidate, fidelity, device_name, triton_version)
        )
        return None if found is None or found.environment_failure else found

    def check_writable(self) -> None:
        """Fail now, before any measurement, where `add` could not append to the file."""
        self._refuse_linked_folders()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | _NOFOLLOW | _CLOEXEC)
        except FileNotFoundError:
            return  # created by the first add
        except OSError as exc:
            raise _unwritable(self.path, exc) from None
        os.close(fd)

    def add(self, measurement: Measurement) -> None:
        """Append one measurement and fsync it before returning."""
        line = json.dumps(measurement.to_json(), separators=(",", ":")) + "\n"
        self._refuse_linked_folders()
        _refuse_links(self.lock_path, "the results store's lock")
        # A Ctrl-C in the middle waits for the line (and the index) to be complete.
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with signals_deferred(), FileLock(str(self.lock_path)):
                _refuse_links(self.path)
                flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | _NOFOLLOW | _CLOEXEC
                with os.fdopen(os.open(self.path, flags, 0o666), "a+b") as handle:
                    _cut_torn_tail(handle)
                    handle.write(line.encode())
                    handle.flush()
                    os.fsync(handle.fileno())
                self._remember(measurement)
        except OSError as exc:
            raise _unwritable(self.path, exc) from None

    def all(self) -> list[Measurement]:
        """Every measurement in file order (repeated keys included)."""
        return list(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


def _key(
    problem_key: str,
    batch_size: int,
    item: Candidate | Probe,
    fidelity: str,
    device_name: str,
    triton_version: str,
) -> StoreKey:
    kind, candidate, use_tma, down, down_tma = probe_fields(item)
    return (
        problem_key,
        batch_size,
        candidate,
        fidelity,
        device_name,
        triton_version,
        kind,
        use_tma,
        down,
        down_tma,
    )


def _warn_skipped(path: Path, reasons: dict[int, str]) -> None:
    numbers = sorted(reasons)
    first = numbers[0]
    more = ""
    if len(numbers) > 1:
        shown = ", ".join(map(str, numbers[1:_SKIPPED_SHOWN]))
        rest = len(numbers) - _SKIPPED_SHOWN
        more = f"; {len(numbers) - 1} more: line {shown}" + (
            f" and {rest} more" if rest > 0 else ""
        )
    warnings.warn(
        f"{path}:{first}: skipping an unreadable measurement ({reasons[first]}){more}; "
        "skipped lines stay in the file",
        MoetuneWarning,
        stacklevel=4,
    )


def _cut_torn_tail(handle: BinaryIO) -> None:
    """End an append handle's file with a newline before a new line is added.

    A last line without its newline that is not a whole JSON value is a killed
    writer's partial line: it is cut off. A whole one is kept and given its newline.
    """
    size = handle.seek(0, os.SEEK_END)
    if size == 0:
        return
    handle.seek(size - 1)
    if handle.read(1) == b"\n":
        return
    start = max(0, size - _TAIL_WINDOW)
    handle.seek(start)
    tail = handle.read()
    newline = tail.rfind(b"\n")
    if newline < 0 and start > 0:
        handle.write(b"\n")  # a fragment longer than the window: fence it off instead
        return
    if _is_json(tail[newline + 1 :]):
        handle.write(b"\n")
    else:
        handle.truncate(start + newline + 1)
