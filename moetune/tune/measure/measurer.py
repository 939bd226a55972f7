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

import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from moetune import __version__
from moetune.tune.environment import ENVIRONMENT
from moetune.tune.measure.timing import Outcome
from moetune.tune.measure.worker import FollowUp, WorkUnit
from moetune.tune.store import Measurement, ResultStore

DEFAULT_CHUNK = 16
# The priority of `StoreMeasurer.alongside` asks: after every search ask (lower goes first).
ALONGSIDE_PRIORITY = 1 << 30
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
        self.reported: set[tuple] = set()  # keys this run measured or took from the store
        self.warmed: dict[tuple[int, Any], float | None] = {}
        self.timed = 0
        self.reused = 0
        # What the parallel compile pass did: candidates, summed compile seconds, wall seconds.
        self.warm_count = 0
        self.warm_compile_s = 0.0
        self.warm_wall_s = 0.0
        # Asks measured alongside the next `measure_stream`, behind every other (`alongside`).
        self._alongside: list[_Ask] = []

    def _key(self, batch_size: int, candidate: Any, fidelity: str) -> tuple:
        return (batch_size, candidate, fidelity)

    def served(self, stored: Measurement, key: tuple) -> None:
        """Count a measurement the store answered with, once per key and run: asked again
        (a prefetched pool asked by its seed round, a baseline the search timed), it is
        neither reused again nor reported again."""
        if key in self.reported:
            return
        self.reported.add(key)
        self.reused += 1
        if self.on_measurement is not None:
            self.on_measurement(stored, True)

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
        ask = _Ask(batch_size, tuple(candidates), fidelity)
        answers: dict[Any, Measurement] = {}

        def answered(_: Any, results: dict[Any, Measurement]) -> list[Any]:
            answers.update(results)
            return []

        self.measure_stream([ask], answered)
        return answers

    def alongside(self, batch_size: int, candidates: Sequence[Any], fidelity: str) -> None:
        """Measure these with the next `measure_stream` (a search), behind all of its own
        asks: known work (the engine baselines) that fills the workers' idle time, chiefly
        the search's tail, instead of a stage of its own after it. Asked again later, it is
        answered from the store."""
        self._alongside.append(_Ask(batch_size, tuple(candidates), fidelity, ALONGSIDE_PRIORITY))

    def measure_stream(
        self, asks: list[Any], answered: Callable[[Any, dict[Any, Measurement]], list[Any]]
    ) -> None:
        """Measure many asks at once (`moetune.tune.search.strategy.Ask`: batch size,
        candidates, fidelity), all through one backend run so the workers stay busy.

        As each ask is complete, `answered(ask, results)` is called with it and returns
        the asks that follow from it, which join the same run. An ask's ``priority``
        (lower first; 0 if it has none) orders the work waiting for a worker. A
        candidate asked twice at once (same batch size and fidelity) is measured
        once, and compiled once.
        """
        extra, self._alongside = self._alongside, []
        ours = {id(ask) for ask in extra}

        def answer(ask: Any, results: dict[Any, Measurement]) -> list[Any]:
            return [] if id(ask) in ours else answered(ask, results)

        run = _StreamRun(self, answer)
        run.submit([*asks, *extra])
        started = time.perf_counter()
        warmed_before = self.warm_count
        while run.busy:
            for unit, outcome in self.backend.run(run.release(), then=run.then):
                run.arrived(unit, outcome)
        if self.warm_count > warmed_before:
            self.warm_wall_s += time.perf_counter() - started

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
        self.reported.add(self._key(unit.batch_size, outcome.candidate, fidelity))
        self.timed += 1
        if self.on_measurement is not None:
            self.on_measurement(measurement, False)
        return measurement


@dataclass(frozen=True)
class _Ask:
    """`moetune.tune.search.strategy.Ask`'s fields (the search layer's type is not imported here)."""

    batch_size: int
    candidates: tuple[Any, ...]
    fidelity: str
    priority: int = 0


class _Pending:
    """One ask on its way: the results so far and how many candidates are still out."""

    def __init__(self, ask: Any) -> None:
        self.ask = ask
        self.results: dict[Any, Measurement] = {}
        self.missing = 0


class _StreamRun:
    """The bookkeeping of one `StoreMeasurer.measure_stream` call.

    `submit` answers what the store holds and queues the rest as work units (a
    warm unit for a candidate not yet compiled at its batch size, else a timing
    unit), by the priority of the ask (lower first, then first come); `release`
    hands the backend only as many units as it has workers of each role, so a
    unit queued later with a lower priority number still runs first. `arrived`
    records each outcome; each ask it completes is answered, and the asks that
    follow are submitted in turn. `then` (the backend's follow-up hook) releases
    more units whenever one finishes.
    """

    def __init__(
        self,
        measurer: StoreMeasurer,
        answered: Callable[[Any, dict[Any, Measurement]], list[Any]],
    ) -> None:
        self.measurer = measurer
        self.answered = answered
        backend = measurer.backend
        warmers = backend.compile_workers
        self.capacity = {"warmer": warmers, "timer": max(1, backend.parallelism)}
        self.queued: dict[str, list[tuple[int, int, WorkUnit]]] = {"warmer": [], "timer": []}
        self.in_backend = {"warmer": 0, "timer": 0}
        # Units by id() (each held here, so no id is reused while the run lasts): those
        # handed to the backend, and the outcomes each has still to bring.
        self.released: dict[int, WorkUnit] = {}
        self.left: dict[int, tuple[WorkUnit, int]] = {}
        self.order = itertools.count()
        # (batch size, candidate, fidelity) being measured -> the asks waiting for it.
        self.waiting: dict[tuple[int, Any, str], list[_Pending]] = {}
        # ... and the unit measuring it (a warm unit first: its key is (batch size, candidate)).
        self.unit_of: dict[tuple, WorkUnit] = {}
        # (batch size, candidate) being compiled -> (fidelity, priority) to time it at next.
        self.warming: dict[tuple[int, Any], list[tuple[str, int]]] = {}
        # Candidate -> the batch sizes it is being compiled at, and those waiting for them.
        self.warms_of: dict[Any, set[int]] = {}
        self.deferred: dict[Any, list[tuple[int, int]]] = {}

    @property
    def busy(self) -> bool:
        return any(self.queued.values()) or any(self.in_backend.values())

    def _role(self, unit: WorkUnit) -> str:
        return "warmer" if unit.mode == "warm" and self.capacity["warmer"] else "timer"

    def _queue(self, unit: WorkUnit, priority: int) -> None:
        self.left[id(unit)] = (unit, len(unit.candidates))
        heapq.heappush(self.queued[self._role(unit)], (priority, next(self.order), unit))

    def _hurry(self, key: tuple, priority: int) -> None:
        """Queue the unit measuring `key` again at `priority` if it still waits (the old entry
        is skipped when popped)."""
        unit = self.unit_of.get(key)
        if unit is not None and id(unit) not in self.released:
            heapq.heappush(self.queued[self._role(unit)], (priority, next(self.order), unit))

    def release(self) -> list[WorkUnit]:
        units = []
        for role, queue in self.queued.items():
            while queue and self.in_backend[role] < max(1, self.capacity[role]):
                _, _, unit = heapq.heappop(queue)
                if id(unit) in self.released:
                    continue
                self.released[id(unit)] = unit
                self.in_backend[role] += 1
                units.append(unit)
        return units

    def submit(self, asks: list[Any]) -> None:
        todo = deque(asks)
        while todo:
            pending = self._start(todo.popleft())
            if pending.missing == 0:
                todo.extend(self.answered(pending.ask, pending.results))

    def _start(self, ask: Any) -> _Pending:
        measurer, m, fidelity = self.measurer, ask.batch_size, ask.fidelity
        priority = getattr(ask, "priority", 0)
        pending = _Pending(ask)
        cold, warm = [], []
        for candidate in dict.fromkeys(ask.candidates):
            stored = measurer.lookup(m, candidate, fidelity)
            if stored is not None:
                pending.results[candidate] = stored
                measurer.served(stored, (m, candidate, fidelity))
                continue
            pending.missing += 1
            key = (m, candidate, fidelity)
            if key in self.waiting:  # asked by another ask of this run: measured once
                self.waiting[key].append(pending)
                self._hurry(key, priority)
                self._hurry((m, candidate), priority)
                continue
            self.waiting[key] = [pending]
            if (m, candidate) in self.warming:
                self.warming[(m, candidate)].append((fidelity, priority))
                self._hurry((m, candidate), priority)
            elif measurer.backend.compile_workers and (m, candidate) not in measurer.warmed:
                self.warming[(m, candidate)] = [(fidelity, priority)]
                cold.append(candidate)
            else:
                warm.append(candidate)
        for candidate in cold:
            self._warm(m, candidate, priority)
        self._time(m, warm, fidelity, priority)
        return pending

    def _warm(self, m: int, candidate: Any, priority: int) -> None:
        """Queue the compile of `candidate` at batch size `m`, or, while one at another batch
        size is on its way, after it: the kernel is most often the same one, which Triton's
        cache then serves instead of a second process compiling it again."""
        others = self.warms_of.setdefault(candidate, set())
        if others:
            self.deferred.setdefault(candidate, []).append((m, priority))
            for other in others:
                self._hurry((other, candidate), priority)
            return
        others.add(m)
        unit = WorkUnit(self.measurer.context.problem, m, (candidate,), "warm")
        self.unit_of[(m, candidate)] = unit
        self._queue(unit, priority)

    def _time(self, m: int, candidates: list[Any], fidelity: str, priority: int) -> None:
        for unit in self.measurer._units(m, candidates, fidelity):
            for candidate in unit.candidates:
                self.unit_of[(m, candidate, fidelity)] = unit
            self._queue(unit, priority)

    def then(self, unit: WorkUnit, outcomes: list[Outcome]) -> list[WorkUnit]:
        """The backend's follow-up hook: whatever may run now."""
        return self.release()

    def arrived(self, unit: WorkUnit, outcome: Outcome) -> None:
        _, count = self.left.pop(id(unit))
        if count > 1:
            self.left[id(unit)] = (unit, count - 1)
        else:
            self.in_backend[self._role(unit)] -= 1
        measurer, m, candidate = self.measurer, unit.batch_size, outcome.candidate
        if unit.mode != "warm":
            self.unit_of.pop((m, candidate, unit.mode), None)
            compile_s = measurer.warmed.get((m, candidate))
            measured = measurer._record(unit, outcome, unit.mode, compile_s)
            self._settle((m, candidate, unit.mode), measured)
            return
        self.unit_of.pop((m, candidate), None)
        self.warms_of[candidate].discard(m)
        for later, priority in self.deferred.pop(candidate, []):
            self._warm(later, candidate, priority)
        measurer.warmed[(m, candidate)] = outcome.compile_s
        measurer.warm_count += 1
        measurer.warm_compile_s += outcome.compile_s or 0.0
        waiting = self.warming.pop((m, candidate), [])
        if outcome.status in (*FINAL_WARM_FAILURES, ENVIRONMENT):
            for fidelity in dict.fromkeys(f for f, _ in waiting):
                measured = measurer._record(unit, outcome, fidelity, None)
                self._settle((m, candidate, fidelity), measured)
            return
        best: dict[str, int] = {}
        for fidelity, priority in waiting:  # time what a warmer compiled, as soon as it has
            best[fidelity] = min(priority, best.get(fidelity, priority))
        for fidelity, priority in best.items():
            self._time(m, [candidate], fidelity, priority)

    def _settle(self, key: tuple[int, Any, str], measurement: Measurement) -> None:
        """Hand `measurement` of `key` (batch size, what was asked, fidelity) to its asks."""
        for pending in self.waiting.pop(key, []):
            pending.results[key[1]] = measurement
            pending.missing -= 1
            if pending.missing == 0:
                self.submit(self.answered(pending.ask, pending.results))
