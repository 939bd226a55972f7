"""The `Measurer` the search strategies talk to: the results store first, then the workers.

Resume is nothing more than this: before measuring, each candidate is looked
up in the store under its full key (problem, batch size, candidate, fidelity,
device, Triton version); only the missing ones go to the workers, and every
measurement is appended to the store the moment it comes back. A killed run
therefore loses at most the candidates in flight, and rerunning the same
command measures only what is missing.

When the backend has compile workers, each candidate not yet compiled at
this batch size goes to a warmer first and to the timer the moment it is
compiled, so compiling (many processes) and timing (one per GPU) overlap. A
candidate the compiler rejects (compile error, out of resources) is recorded
with that status and never reaches the timer.

An environment failure (a missing module, no GPU) is recorded as such and ends
the run: the backend raises `moetune.tune.environment.WorkerEnvironmentError`
right after it, and the store never serves it again, so a rerun measures it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from moetune import __version__
from moetune.tune.environment import ENVIRONMENT
from moetune.tune.measure.timing import Outcome
from moetune.tune.measure.worker import FollowUp, WorkUnit
from moetune.tune.store import Measurement, ResultStore

DEFAULT_CHUNK = 16
# Failures a warmer's compile pass settles for good (deterministic). Anything else a
# warmer hits (a crash, a hang, an error outside the compiler) is left to the timer.
FINAL_WARM_FAILURES = ("compile_error", "out_of_resources")


class Backend(Protocol):
    """Runs work units somewhere (local worker processes, Ray) and streams the outcomes back."""

    @property
    def compile_workers(self) -> int: ...

    @property
    def parallelism(self) -> int: ...

    def run(
        self, units: Iterable[WorkUnit], then: FollowUp | None = None
    ) -> Iterator[tuple[WorkUnit, Outcome]]: ...

    def measure_ceilings(self) -> Any: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RunContext:
    """What, besides the candidate, a measurement is keyed on."""

    problem: Any  # TuneProblem
    device_name: str
    triton_version: str


class StoreMeasurer:
    """`moetune.tune.search.strategy.Measurer` over a backend, with the store as cache and journal."""

    def __init__(
        self,
        context: RunContext,
        backend: Backend,
        store: ResultStore,
        *,
        overwrite: bool = False,
        chunk_size: int = DEFAULT_CHUNK,
        on_measurement: Callable[[Measurement, bool], None] | None = None,
    ) -> None:
        self.context = context
        self.backend = backend
        self.store = store
        self.overwrite = overwrite
        self.chunk_size = chunk_size
        self.on_measurement = on_measurement
        self.problem_key = context.problem.key()
        self.measured_now: set[tuple] = set()  # keys measured by this run (kept under --overwrite)
        self.warmed: dict[tuple[int, Any], float | None] = {}
        self.timed = 0
        self.reused = 0
        # What the parallel compile pass did: candidates, summed compile seconds, wall seconds.
        self.warm_count = 0
        self.warm_compile_s = 0.0
        self.warm_wall_s = 0.0

    def _key(self, batch_size: int, candidate: Any, fidelity: str) -> tuple:
        return (batch_size, candidate, fidelity)

    def lookup(self, batch_size: int, candidate: Any, fidelity: str) -> Measurement | None:
        """The stored measurement, unless --overwrite asks to redo what earlier runs stored."""
        if self.overwrite and self._key(batch_size, candidate, fidelity) not in self.measured_now:
            return None
        return self.store.get(
            self.problem_key,
            batch_size,
            candidate,
            fidelity,
            self.context.device_name,
            self.context.triton_version,
        )

    def measure(
        self, batch_size: int, candidates: Sequence[Any], fidelity: str
    ) -> dict[Any, Measurement]:
        results: dict[Any, Measurement] = {}
        missing = []
        for candidate in dict.fromkeys(candidates):
            stored = self.lookup(batch_size, candidate, fidelity)
            if stored is None:
                missing.append(candidate)
                continue
            results[candidate] = stored
            self.reused += 1
            if self.on_measurement is not None:
                self.on_measurement(stored, True)
        if not missing:
            return results
        cold = []
        if self.backend.compile_workers:
            cold = [c for c in missing if (batch_size, c) not in self.warmed]
        warm_set = set(cold)
        units = [WorkUnit(self.context.problem, batch_size, (c,), "warm") for c in cold]
        units += self._units(batch_size, [c for c in missing if c not in warm_set], fidelity)

        def then(unit: WorkUnit, outcomes: list[Outcome]) -> list[WorkUnit]:
            """Time what a warmer compiled, as soon as it has compiled it."""
            if unit.mode != "warm":
                return []
            ready = [o.candidate for o in outcomes if o.status not in FINAL_WARM_FAILURES]
            return self._units(batch_size, ready, fidelity) if ready else []

        started = time.perf_counter()
        for unit, outcome in self.backend.run(units, then=then):
            if unit.mode == "warm":
                self.warmed[(batch_size, outcome.candidate)] = outcome.compile_s
                self.warm_count += 1
                self.warm_compile_s += outcome.compile_s or 0.0
                if outcome.status in (*FINAL_WARM_FAILURES, ENVIRONMENT):
                    results[outcome.candidate] = self._record(unit, outcome, fidelity, None)
                continue
            compile_s = self.warmed.get((batch_size, outcome.candidate))
            results[outcome.candidate] = self._record(unit, outcome, fidelity, compile_s)
        if cold:
            self.warm_wall_s += time.perf_counter() - started
        return results

    def _units(self, batch_size: int, candidates: list[Any], mode: str) -> list[WorkUnit]:
        if not candidates:
            return []
        # Small enough chunks that every worker gets some; at most chunk_size per unit.
        per_worker = math.ceil(len(candidates) / max(1, self.backend.parallelism))
        size = max(1, min(self.chunk_size, per_worker))
        return [
            WorkUnit(self.context.problem, batch_size, tuple(candidates[i : i + size]), mode)
            for i in range(0, len(candidates), size)
        ]

    def _record(
        self, unit: WorkUnit, outcome: Outcome, fidelity: str, compile_s: float | None
    ) -> Measurement:
        measurement = Measurement(
            problem_key=self.problem_key,
            batch_size=unit.batch_size,
            candidate=outcome.candidate,
            fidelity=fidelity,
            status=outcome.status,
            latency_us=outcome.latency_us,
            p20_us=outcome.p20_us,
            p80_us=outcome.p80_us,
            compile_s=compile_s if compile_s is not None else outcome.compile_s,
            error=outcome.error,
            device_name=self.context.device_name,
            triton_version=self.context.triton_version,
            moetune_version=__version__,
            timestamp=time.time(),
        )
        self.store.add(measurement)
        self.measured_now.add(self._key(unit.batch_size, outcome.candidate, fidelity))
        self.timed += 1
        if self.on_measurement is not None:
            self.on_measurement(measurement, False)
        return measurement
