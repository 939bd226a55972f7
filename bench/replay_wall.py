"""Replay a recorded tune's searches on a simulated clock: their wall time and picks (no GPU).

A recorded results store holds every timing a tune took, each with the seconds its
compile took (`compile_s`) and the time it was written (`timestamp`). This script runs
the tuner's own searches (`moetune.tune.search.strategy`) through its own
`StoreMeasurer` over `SimulatedBackend`, a backend that answers each work unit from the
store's rows and moves a virtual clock as `moetune.tune.measure.worker.WorkerPool` would
move the real one: W compile processes ("warmers") and one timer per GPU, each taking
the next unit of its queue when idle.

- A warm unit (compile one candidate at one batch size) takes the candidate's recorded
  `compile_s` there on one warmer. Triton's cache serves a kernel compiled before: a
  compile recorded as cheap (under `CACHED_S`) at one batch size loaded the kernel of the
  latest dearer compile of the candidate before it, so those batch sizes share one
  kernel, priced at that compile and paid by whichever compiles it first here (a second
  process starting it before the first has finished pays it too); the others load it.
- A timing takes the median gap between consecutive rows of its batch size and
  fidelity in the store (the timer's rate while busy, kernel loading included).
- A worker whose batch size changes sets up its inputs: `--switch-s` seconds before the
  pipeline (drawing the weights: 11 ms bf16, 109 ms fp8 block on an H200, plus the unit's
  round trip), `--tokens-switch-s` now (`moetune.kernel.problem.with_tokens`).
- A timing the store does not have (a search that asks another question than the
  recorded one did) comes back as a failure ("not recorded") at the store's median
  compile price; the report counts these misses. The recorded search itself asks
  none: replayed as recorded, it asks exactly the store's questions.

Search time in the main process (the cost model, the bookkeeping) is left out: the
recorded searches' Python time is under half a second per tune. Against H200 runs replayed
on their own stores (bench/results/2026-12-02-search-pipeline), the model runs 5-19 % fast
for both schedules.

For each store: the first kernel's fast search, and, where the store holds a second
kernel's plan (a both-engine tune), its transfer search seeded from the first kernel's
recorded full-fidelity rows (as `moetune.tune.runner.transfer_seeds` seeds it). Each is
replayed as the tuner searched before (`SEQUENTIAL`: `FastSearchOptions(pipelined=False)`,
batch sizes one after another) and as it searches now (`PIPELINED`: the searches' jobs
run together through one backend; for fast search also `CONFINED` to the candidates the
store timed at each batch size, so nothing is missing), each on a fresh clock. Printed:
the recorded span of the search (first row to last), the simulated wall times, compile
CPU seconds, and the new picks' recorded full-fidelity latencies against the old ones.

A fast search is also replayed pipelined from ``--search thorough``'s three climb starts
(fast search climbed from three until 2026-12-04, from two since), and the picks of each
schedule are compared with that replay's (``against three starts``). ``--starts N`` replays
the other schedules from N starts (a store recorded before 2026-12-04 replays exactly with
``--starts 3``).

    python bench/replay_wall.py [STORE.jsonl[.gz] ...] [--workers 14] [--switch-s 0.05]
        [--tokens-switch-s 0.005] [--pruning fast|safe] [--starts N] [--json OUT]

With no store it replays the four recorded H200 default tunes (`RECORDED`). The spaces are
pruned as the fast search prunes them (`--pruning fast`: the provably safe rules and the
measured ones, `moetune.tune.search.space.prune_rules`); ``--pruning safe`` applies the
provably safe rules only, as the replays before bench/results/2026-12-02-spill-prune did.
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import json
import re
import statistics
import sys
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from moetune.device import DeviceLimits
from moetune.engines.launch import KernelRef
from moetune.kernel.config import Candidate
from moetune.tune.api import (
    FINAL_WARM_FAILURES,
    PRUNE_RULES,
    THOROUGH_OPTIONS,
    TRANSFER_OPTIONS,
    FastSearchOptions,
    FollowUp,
    Measurement,
    Outcome,
    Rule,
    RunContext,
    StoreMeasurer,
    TuneProblem,
    WorkUnit,
    default_space,
    fast_search,
    prune,
    prune_rules,
    swap_ab_candidates,
    transfer_search,
)

ROOT = Path(__file__).resolve().parent
DEFAULT_TUNES = ROOT / "results" / "2026-12-02-default-tune-times"
RECORDED = tuple(
    DEFAULT_TUNES / name / "measurements.jsonl.gz"
    for name in ("vllm_bf16", "qwen235", "glm", "dsv3")
)
CACHED_S = 0.1  # a recorded compile under this loaded a kernel compiled before
WORKERS = 14  # the recorded H200 runs' compile processes (16 cores)
# Seconds a worker takes to set up another batch size's inputs: drawing the expert weights
# too (before the pipeline), or only the tokens (`moetune.kernel.problem.with_tokens`).
SWITCH_S = 0.05
TOKENS_SWITCH_S = 0.005
NOT_RECORDED = "replay: not recorded in the store"
# `--pruning`: the rules the spaces are pruned with. fast: as `moetune tune --search fast`
# prunes (the provably safe rules and the measured ones); safe: the provably safe ones only.
PRUNINGS: dict[str, tuple[tuple[str, Rule], ...]] = {
    "fast": prune_rules("fast"),
    "safe": PRUNE_RULES,
}
_KERNEL = re.compile(r",kernel=(\w+)-([\w.+-]+)@(\w+)$")


def problem_of(key: str) -> TuneProblem:
    """The problem a store key names, with its engine kernel (source path unknown)."""
    problem = TuneProblem.from_key(key)
    found = _KERNEL.search(key)
    if found:
        engine, version, digest = found.groups()
        problem = replace(problem, kernel=KernelRef(engine, version, version, "", digest))
    return problem


def read_rows(path: Path) -> list[Measurement]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as handle:
        return [Measurement.from_json(json.loads(line)) for line in handle if line.strip()]


@dataclass
class Recorded:
    """One problem's whole-call rows of a store, and the costs they imply.

    Kernels: a compile recorded under `CACHED_S` loaded the kernel of the latest dearer
    compile of the same candidate before it (at another batch size); such batch sizes
    share one kernel (`kernel_of`), priced at that dear compile (`kernel_s`).
    """

    key: str
    rows: dict[tuple[int, str], dict[Candidate, Measurement]]
    compile_s: dict[tuple[int, Candidate], float]  # the first row's, per (batch size, candidate)
    kernel_of: dict[tuple[int, Candidate], tuple[int, Candidate]]  # -> its kernel's first compile
    timer_s: dict[tuple[int, str], float]  # median seconds per timing
    span_s: float  # first row to last
    median_compile_s: float  # of the dear compiles
    cached_s: float  # median of the cheap ones

    @classmethod
    def of(
        cls,
        key: str,
        rows: list[Measurement],
        others: list[Measurement],
        kinds: tuple[str, ...] = ("whole",),
    ) -> Recorded:
        """`rows`: this problem's, keyed by what was timed (`Measurement.probe`: the candidate
        of a whole call); `others`: the whole store (the timer's gaps are per store, taken
        from the rows of `kinds`)."""
        rows = sorted(rows, key=lambda r: r.timestamp)
        by: dict[tuple[int, str], dict[Candidate, Measurement]] = defaultdict(dict)
        compile_s: dict[tuple[int, Candidate], float] = {}
        kernel_of: dict[tuple[int, Candidate], tuple[int, Candidate]] = {}
        latest: dict[Candidate, tuple[int, Candidate]] = {}
        for row in rows:
            probe = row.probe
            by[(row.batch_size, row.fidelity)].setdefault(probe, row)
            pair = (row.batch_size, probe)
            if pair in compile_s or row.compile_s is None:
                continue
            compile_s[pair] = row.compile_s
            if row.compile_s >= CACHED_S or probe not in latest:
                latest[probe] = kernel_of[pair] = pair
            else:
                kernel_of[pair] = latest[probe]
        ordered = sorted(others, key=lambda r: r.timestamp)
        gaps: dict[tuple[int, str], list[float]] = defaultdict(list)
        for before, row in zip(ordered, ordered[1:], strict=False):
            if row.problem_key == key and row.kind in kinds and row.ok:
                gaps[(row.batch_size, row.fidelity)].append(row.timestamp - before.timestamp)
        timer_s = {pair: statistics.median(values) for pair, values in gaps.items()}
        dear = [cost for cost in compile_s.values() if cost >= CACHED_S]
        cheap = [cost for cost in compile_s.values() if cost < CACHED_S]
        return cls(
            key,
            dict(by),
            compile_s,
            kernel_of,
            timer_s,
            rows[-1].timestamp - rows[0].timestamp,
            statistics.median(dear) if dear else 1.0,
            statistics.median(cheap) if cheap else 0.01,
        )

    def row(self, batch_size: int, candidate: Candidate, fidelity: str) -> Measurement | None:
        return self.rows.get((batch_size, fidelity), {}).get(candidate)

    def timing_s(self, batch_size: int, fidelity: str) -> float:
        if (batch_size, fidelity) in self.timer_s:
            return self.timer_s[(batch_size, fidelity)]
        same = [s for (_, f), s in self.timer_s.items() if f == fidelity]
        return statistics.median(same) if same else 0.03

    def kernel(self, batch_size: int, candidate: Candidate) -> tuple[tuple[int, Candidate], float]:
        """The kernel a warm at (batch size, candidate) builds and the price of compiling it
        (a pair the store lacks: a kernel of its own, at the median dear compile)."""
        pair = (batch_size, candidate)
        first = self.kernel_of.get(pair, pair)
        return first, self.compile_s.get(first, self.median_compile_s)


@dataclass
class _SimWorker:
    role: str
    unit: WorkUnit | None = None
    index: int = 0
    outcomes: list[Outcome] = field(default_factory=list)
    batch: tuple[str, int] | None = None  # the inputs it holds
    busy_s: float = 0.0
    compile_s: float = 0.0  # of the warm in hand


class SimulatedBackend:
    """A `Backend` on a virtual clock, answering from recorded rows (module docstring)."""

    def __init__(
        self,
        recorded: dict[str, Recorded],
        workers: int = WORKERS,
        timers: int = 1,
        switch_s: float = SWITCH_S,
    ) -> None:
        self.recorded = recorded
        self.warmers = [_SimWorker("warmer") for _ in range(workers)]
        self.timers = [_SimWorker("timer") for _ in range(timers)]
        self.switch_s = switch_s
        self.now = 0.0
        # Kernel (its first recorded compile) -> when its first compile here finishes.
        self.compiled: dict[tuple[str, tuple[int, Candidate]], float] = {}
        self.compile_cpu_s = 0.0
        self.misses: set[tuple[str, int, Candidate, str]] = set()
        self.substituted = 0
        self.recompiled_s = 0.0  # compile seconds paid twice: two processes compiling one kernel
        self.switches = 0
        self.timer_switches = 0

    @property
    def compile_workers(self) -> int:
        return len(self.warmers)

    @property
    def parallelism(self) -> int:
        return len(self.timers)

    def measure_ceilings(self) -> Any:
        return None

    def close(self) -> None:
        pass

    def _cost(self, worker: _SimWorker, unit: WorkUnit, candidate: Candidate) -> float:
        key = unit.problem.key()
        recorded = self.recorded[key]
        m = unit.batch_size
        cost = 0.0
        if worker.batch != (key, m):
            worker.batch = (key, m)
            cost += self.switch_s
            self.switches += 1
            self.timer_switches += worker.role == "timer"
        if unit.mode != "warm":
            return cost + recorded.timing_s(m, unit.mode)
        kernel, price = recorded.kernel(m, candidate)
        done = self.compiled.get((key, kernel))
        if done is not None and done <= self.now:  # in Triton's cache: loaded, not compiled
            own = recorded.compile_s.get((m, candidate), recorded.cached_s)
            compile_s = own if own < CACHED_S else recorded.cached_s
        else:  # compiled here, even while another process compiles it too
            compile_s = price
            if done is not None:
                self.recompiled_s += price
            finish = self.now + cost + price
            self.compiled[(key, kernel)] = min(finish, done if done is not None else finish)
        self.compile_cpu_s += compile_s
        worker.compile_s = compile_s
        return cost + compile_s

    def _outcome(self, unit: WorkUnit, candidate: Candidate, compile_s: float) -> Outcome:
        key = unit.problem.key()
        recorded = self.recorded[key]
        if unit.mode == "warm":
            found = recorded.row(unit.batch_size, candidate, "quick") or recorded.row(
                unit.batch_size, candidate, "full"
            )
            status = found.status if found and found.status in FINAL_WARM_FAILURES else "ok"
            return Outcome(candidate, status, compile_s=compile_s)
        row = recorded.row(unit.batch_size, candidate, unit.mode)
        if row is None:  # the other fidelity's row, if the store has one
            other = "quick" if unit.mode == "full" else "full"
            row = recorded.row(unit.batch_size, candidate, other)
            if row is not None:
                self.substituted += 1
        if row is None:
            self.misses.add((key, unit.batch_size, candidate, unit.mode))
            return Outcome(candidate, "runtime_error", error=NOT_RECORDED)
        return Outcome(
            candidate, row.status, row.latency_us, row.p20_us, row.p80_us, error=row.error
        )

    def run(
        self, units: Iterable[WorkUnit], then: FollowUp | None = None
    ) -> Iterator[tuple[WorkUnit, Outcome]]:
        queues: dict[str, deque[WorkUnit]] = {"timer": deque(), "warmer": deque()}

        def enqueue(unit: WorkUnit) -> None:
            queues["warmer" if unit.mode == "warm" and self.warmers else "timer"].append(unit)

        for unit in units:
            enqueue(unit)
        events: list[tuple[float, int, int]] = []  # (finish time, order, worker index)
        workers = self.timers + self.warmers
        order = 0

        def begin(index: int) -> None:
            nonlocal order
            worker = workers[index]
            assert worker.unit is not None
            cost = self._cost(worker, worker.unit, worker.unit.candidates[worker.index])
            worker.busy_s += cost
            order += 1
            heapq.heappush(events, (self.now + cost, order, index))

        while True:
            for index, worker in enumerate(workers):
                if worker.unit is None and queues[worker.role]:
                    worker.unit, worker.index, worker.outcomes = (
                        queues[worker.role].popleft(),
                        0,
                        [],
                    )
                    begin(index)
            if not events:
                return
            finish, _, index = heapq.heappop(events)
            self.now = finish
            worker = workers[index]
            unit = worker.unit
            assert unit is not None
            candidate = unit.candidates[worker.index]
            outcome = self._outcome(unit, candidate, worker.compile_s)
            worker.outcomes.append(outcome)
            yield unit, outcome
            worker.index += 1
            if worker.index < len(unit.candidates):
                begin(index)
                continue
            outcomes, worker.unit = worker.outcomes, None
            if then is not None:
                for follow in then(unit, outcomes):
                    enqueue(follow)


class MemoryStore:
    """The part of `ResultStore` a `StoreMeasurer` uses, in memory."""

    def __init__(self) -> None:
        self.rows: dict[tuple, Measurement] = {}

    def get(
        self,
        problem_key: str,
        batch_size: int,
        candidate: Candidate,
        fidelity: str,
        device_name: str,
        triton_version: str,
    ) -> Measurement | None:
        return self.rows.get((problem_key, batch_size, candidate, fidelity))

    def add(self, measurement: Measurement) -> None:
        key = (
            measurement.problem_key,
            measurement.batch_size,
            measurement.probe,  # a split probe's kind and TMA flags, not its config alone
            measurement.fidelity,
        )
        self.rows[key] = measurement

    def all(self) -> list[Measurement]:
        return list(self.rows.values())


SEQUENTIAL = "sequential"
PIPELINED = "pipelined"
CONFINED = "pipelined, recorded candidates only"
THOROUGH = "pipelined, --search thorough's three climb starts"


def spaces_of(
    problem: TuneProblem,
    batch_sizes: Sequence[int],
    recorded: Recorded | None = None,
    pruning: str = "fast",
) -> dict[int, list[Candidate]]:
    """The default grid pruned per batch size, as `moetune.tune.runner.make_plan` prunes it
    for the fast search (`PRUNINGS`); with `recorded`, only the candidates it timed there
    (any fidelity)."""
    limits = DeviceLimits.h200()
    grid = default_space()
    grid = [*grid, *swap_ab_candidates(grid, problem, limits)]
    rules = PRUNINGS[pruning]
    spaces = {m: list(prune(grid, problem, m, limits, rules).kept) for m in batch_sizes}
    if recorded is None:
        return spaces
    timed = {
        m: set(recorded.rows.get((m, "quick"), {})) | set(recorded.rows.get((m, "full"), {}))
        for m in batch_sizes
    }
    return {m: [c for c in space if c in timed[m]] for m, space in spaces.items()}


@dataclass
class Replayed:
    """One search replayed under one schedule."""

    wall_s: float
    compile_cpu_s: float
    timings: int
    misses: int
    switches: int
    timer_busy_s: float
    picks: dict[int, Candidate]


def replay_search(
    recorded: Recorded,
    schedule: str,
    *,
    seeds: dict[int, list[Candidate]] | None = None,
    batch_sizes: Sequence[int] | None = None,
    workers: int = WORKERS,
    switch_s: float = SWITCH_S,
    tokens_switch_s: float = TOKENS_SWITCH_S,
    pruning: str = "fast",
    starts: int | None = None,
) -> Replayed:
    """Replay one problem's search (fast, or transfer with `seeds`) under `schedule`:
    `SEQUENTIAL`, `PIPELINED`, or `CONFINED` (pipelined over the candidates the store
    timed at each batch size, so that nothing it asks is missing). `starts`: the fast search's
    climb starts (default: today's, `FastSearchOptions().starts`)."""
    problem = problem_of(recorded.key)
    limits = DeviceLimits.h200()
    order = sorted(batch_sizes or {m for m, _ in recorded.rows})
    spaces = spaces_of(problem, order, recorded if schedule == CONFINED else None, pruning)
    pipelined = schedule != SEQUENTIAL
    switch = tokens_switch_s if pipelined else switch_s
    backend = SimulatedBackend({problem.key(): recorded}, workers=workers, switch_s=switch)
    context = RunContext(problem, "NVIDIA H200", "3.6.0")
    measurer = StoreMeasurer(context, backend, MemoryStore())  # type: ignore[arg-type]
    if seeds is None:
        options = replace(FastSearchOptions(), pipelined=pipelined)
        if starts is not None:
            options = replace(options, starts=starts)
        found = fast_search(order, spaces.__getitem__, measurer, problem, limits, options)
    else:
        options = replace(TRANSFER_OPTIONS, pipelined=pipelined)
        found = transfer_search(
            order, spaces.__getitem__, measurer, problem, limits, seeds, options
        )
    return Replayed(
        backend.now,
        backend.compile_cpu_s,
        measurer.timed,
        len(backend.misses),
        backend.switches,
        sum(worker.busy_s for worker in backend.timers),
        {m: result.best.candidate for m, result in found.items()},
    )


def full_us(recorded: Recorded, batch_size: int, candidate: Candidate) -> float | None:
    row = recorded.row(batch_size, candidate, "full")
    return row.latency_us if row is not None and row.ok else None


def complete_batch_sizes(recorded: Recorded) -> list[int]:
    """Batch sizes with a full-fidelity row (a search cut short ends before deciding)."""
    return sorted({m for (m, fidelity) in recorded.rows if fidelity == "full"})


def replay_store(
    path: Path,
    *,
    workers: int = WORKERS,
    switch_s: float = SWITCH_S,
    tokens_switch_s: float = TOKENS_SWITCH_S,
    pruning: str = "fast",
    starts: int | None = None,
) -> list[dict[str, Any]]:
    """Replay every plan of the store at `path` (module docstring). A fast search is also
    replayed pipelined from `THOROUGH_OPTIONS.starts` climb starts (``--search thorough``),
    and each schedule's picks are compared with that one's too (`picks[...]["vs_thorough"]`)."""
    rows = read_rows(path)
    whole = [r for r in rows if r.kind == "whole"]
    keys = list(dict.fromkeys(r.problem_key for r in sorted(whole, key=lambda r: r.timestamp)))
    recorded = {
        key: Recorded.of(key, [r for r in whole if r.problem_key == key], rows) for key in keys
    }
    reports = []
    for index, key in enumerate(keys):
        seeds = None
        if index:  # a second kernel's plan: a transfer from the first one's recorded rows
            first = recorded[keys[0]]
            seeds = {
                m: [
                    c
                    for c, _ in sorted(
                        ((c, r.latency_us) for c, r in found.items() if r.ok),
                        key=lambda item: item[1],
                    )
                ]
                for (m, fidelity), found in first.rows.items()
                if fidelity == "full"
            }
        batch_sizes = complete_batch_sizes(recorded[key])
        # A transfer's seeds map to their nearest member of the space: confined, another one.
        schedules = (SEQUENTIAL, PIPELINED) if seeds else (SEQUENTIAL, PIPELINED, CONFINED)
        if not seeds:
            schedules += (THOROUGH,)

        runs = {
            schedule: replay_search(
                recorded[key],
                PIPELINED if schedule == THOROUGH else schedule,
                seeds=seeds,
                batch_sizes=batch_sizes,
                workers=workers,
                switch_s=switch_s,
                tokens_switch_s=tokens_switch_s,
                pruning=pruning,
                starts=THOROUGH_OPTIONS.starts if schedule == THOROUGH else starts,
            )
            for schedule in schedules
        }
        picks = []
        for m in batch_sizes:
            old_us = full_us(recorded[key], m, runs[SEQUENTIAL].picks[m])
            thorough_us = full_us(recorded[key], m, runs[THOROUGH].picks[m]) if not seeds else None
            pick: dict[str, Any] = {"batch_size": m, "old_us": old_us}
            for name in schedules[1:]:
                new_us = full_us(recorded[key], m, runs[name].picks[m])
                delta = None if old_us is None or new_us is None else new_us / old_us - 1
                pick[name] = {"us": new_us, "delta": delta}
                if thorough_us is not None and new_us is not None:
                    pick[name]["vs_thorough"] = new_us / thorough_us - 1
            picks.append(pick)
        reports.append(
            {
                "store": str(path),
                "problem": key,
                "search": "transfer" if seeds else "fast",
                "pruning": pruning,
                "batch_sizes": batch_sizes,
                "recorded_span_s": recorded[key].span_s,
                "recorded_timings": sum(len(found) for found in recorded[key].rows.values()),
                "runs": {
                    name: {
                        "wall_s": run.wall_s,
                        "compile_cpu_s": run.compile_cpu_s,
                        "timings": run.timings,
                        "misses": run.misses,
                        "switches": run.switches,
                        "timer_busy_s": run.timer_busy_s,
                    }
                    for name, run in runs.items()
                },
                "picks": picks,
            }
        )
    return reports


def _format(report: dict[str, Any]) -> list[str]:
    lines = [
        f"{report['problem']} ({report['search']} search, {len(report['batch_sizes'])} batch sizes)",
        f"  recorded: span {report['recorded_span_s']:.1f} s, {report['recorded_timings']} timings",
    ]
    for name, run in report["runs"].items():
        lines.append(
            f"  {name}: wall {run['wall_s']:.1f} s, compile {run['compile_cpu_s']:.1f} CPU-s, "
            f"{run['timings']} timings ({run['misses']} not recorded), timer busy "
            f"{run['timer_busy_s']:.1f} s, {run['switches']} input switches"
        )
    for name in list(report["runs"])[1:]:
        deltas = [p[name]["delta"] for p in report["picks"] if p[name]["delta"] is not None]
        unknown = len(report["picks"]) - len(deltas)
        worst = max(deltas, key=abs) if deltas else 0.0
        lines.append(
            f"  picks, {name}: {sum(1 for d in deltas if d == 0)} of {len(report['picks'])} "
            f"the same, worst {worst:+.2%}, {sum(1 for d in deltas if d > 0.01)} over +1 %"
            + (f", {unknown} without a recorded full timing" if unknown else "")
        )
        for p in report["picks"]:
            delta = p[name]["delta"]
            if delta is None or delta != 0:
                shown = "n/a" if delta is None else f"{delta:+.2%}"
                lines.append(
                    f"    M={p['batch_size']}: {p['old_us'] or float('nan'):.2f} -> "
                    f"{p[name]['us'] or float('nan'):.2f} us ({shown})"
                )
    if THOROUGH in report["runs"]:  # today's fast search against --search thorough's starts
        ratios = [p[PIPELINED].get("vs_thorough") for p in report["picks"]]
        known = [r for r in ratios if r is not None]
        worst = max(known, default=0.0)
        lines.append(
            f"  picks, {PIPELINED} against three starts: {sum(1 for r in known if r == 0)} of "
            f"{len(ratios)} the same, worst {worst:+.2%}, {sum(1 for r in known if r > 0.01)} "
            f"over +1 %"
            + (f", {len(ratios) - len(known)} not comparable" if None in ratios else "")
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stores", nargs="*", type=Path)
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--switch-s", type=float, default=SWITCH_S)
    parser.add_argument("--tokens-switch-s", type=float, default=TOKENS_SWITCH_S)
    parser.add_argument("--pruning", choices=sorted(PRUNINGS), default="fast")
    parser.add_argument(
        "--starts", type=int, default=None, help="climb starts (default: today's fast search)"
    )
    parser.add_argument("--json", dest="json_path", type=Path)
    args = parser.parse_args(argv)
    reports = []
    for path in args.stores or RECORDED:
        found = replay_store(
            path,
            workers=args.workers,
            switch_s=args.switch_s,
            tokens_switch_s=args.tokens_switch_s,
            pruning=args.pruning,
            starts=args.starts,
        )
        reports += found
        print(f"# {path}")
        for report in found:
            print("\n".join(_format(report)))
    if args.json_path:
        args.json_path.write_text(json.dumps(reports, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
