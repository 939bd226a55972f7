"""The results store: every measurement, one JSON line each, as soon as it exists.

The store is the tuner's resume mechanism. The runner asks `ResultStore.get`
before measuring a candidate and `add`s each measurement the moment it is
taken; `add` appends one line and fsyncs it, so a ``kill -9`` loses at most
the line being written, and a Ctrl-C or SIGTERM none (they wait for the append
to finish, `moetune.tune.signals.signals_deferred`). A torn last line (a kill mid-write) is ignored
on load with a warning and cut off before the next append.

A measurement is keyed by (problem key, batch size, candidate, fidelity,
device name, Triton version, and what was timed: `kind` with its TMA flags and,
for a pair, the down config; see `moetune.tune.probe`): a store may hold
several problems, GPUs and Triton versions side by side without mixing them.
Rows written before kinds existed read as ``kind: "whole"``. A failed candidate is a row
like any other, with its status and error. When a key appears twice, the later
line wins (a rerun with ``--overwrite`` re-measures and appends).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, BinaryIO

from filelock import FileLock

from moetune.errors import TuneError
from moetune.tune.probe import KINDS, Probe, from_fields, probe_fields
from moetune.tune.signals import signals_deferred
from moetune.tune.space import Candidate

STORE_FILENAME = "measurements.jsonl"
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
)

StoreKey = tuple[str, int, Candidate, str, str, str, str, bool, Candidate | None, bool]
# Fields added with measurement kinds; rows without them are whole-call timings.
_KIND_DEFAULTS = {"kind": "whole", "use_tma": False, "down_candidate": None, "down_tma": False}


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
    def from_json(cls, data: dict[str, Any]) -> Measurement:
        names = {f.name for f in fields(cls)}
        values = {
            name: data.get(name, _KIND_DEFAULTS[name]) if name in _KIND_DEFAULTS else data[name]
            for name in names
        }
        values["candidate"] = Candidate.from_config(data["candidate"])
        if values["down_candidate"] is not None:
            values["down_candidate"] = Candidate.from_config(values["down_candidate"])
        return cls(**values)

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


class ResultStore:
    """Append-only JSON Lines file of `Measurement`s, indexed in memory by key.

    `path` is the file, or a directory (then ``measurements.jsonl`` inside it).
    The file and its folder are created on the first `add`.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        target = Path(path)
        self.path = target / STORE_FILENAME if target.is_dir() else target
        self._rows: list[Measurement] = []
        self._index: dict[StoreKey, Measurement] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        torn = lines.pop()  # b"" when the file ends with a newline
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                measurement = Measurement.from_json(json.loads(line))
            except (ValueError, KeyError, TypeError, TuneError) as exc:
                warnings.warn(
                    f"{self.path}:{number}: skipping an unreadable measurement ({exc})",
                    stacklevel=3,
                )
                continue
            self._remember(measurement)
        if torn:
            warnings.warn(
                f"{self.path}: ignoring a torn last line ({len(torn)} bytes; "
                "an interrupted write) - it is cut off before the next append",
                stacklevel=3,
            )

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

        `candidate` is a plain candidate (a whole-call timing) or a `Probe`.
        """
        return self._index.get(
            _key(problem_key, batch_size, candidate, fidelity, device_name, triton_version)
        )

    def add(self, measurement: Measurement) -> None:
        """Append one measurement and fsync it before returning."""
        line = json.dumps(measurement.to_json(), separators=(",", ":")) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A Ctrl-C in the middle waits for the line (and the index) to be complete.
        with signals_deferred(), FileLock(str(self.path) + ".lock"):
            with open(self.path, "a+b") as handle:
                _cut_torn_tail(handle)
                handle.write(line.encode())
                handle.flush()
                os.fsync(handle.fileno())
            self._remember(measurement)

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


def _cut_torn_tail(handle: BinaryIO) -> None:
    """Truncate an append handle's file after its last newline (a killed writer's partial line)."""
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
    if newline >= 0 or start == 0:
        handle.truncate(start + newline + 1)
    else:
        handle.write(b"\n")  # a fragment longer than the window: fence it off instead
