"""Search strategies: which candidates to time, at which fidelity, and which one wins.

Strategies talk to the GPU only through a `Measurer`, so they run on CPU in
tests against a synthetic cost model. Three are offered:

- `exhaustive_search` times every candidate at full fidelity (what vLLM's and
  SGLang's tuners do).
- `fast_search` (the default) times a small, well-chosen part of the space
  (about 10 % of a pruned default grid; within 2 % of the best at every batch
  size on the synthetic GPU of ``tests/tune/synthetic.py``):

  1. seed: the candidates `costmodel` ranks fastest, plus the best configs of
     the next smaller batch size so far, timed at quick fidelity;
  2. climb: from the few best so far, time every untimed neighbour (see
     `neighbours`) until the best few have no untimed neighbours left;
  3. decide: re-time the best quick results (and any close to the best) at
     full fidelity; the fastest wins;
  4. refine: offer each batch size the best configs of its neighbours, and
     climb and decide again if one of them is faster.

- `transfer_search` searches a problem already searched on another kernel
  (vLLM's and SGLang's kernels compute the same GEMMs with the same tiles and
  rank configs alike): each batch size starts from the other kernel's best
  full-fidelity configs there instead of the cost model's pool, then climbs
  and decides as fast search does.

Compiling dominates a candidate's cost on the GPU, so `SearchResult.timed`
counts distinct candidates; `measurements` also counts full re-timings.

Each round of a search waits for its slowest compile, so a search that solves
one batch size after another leaves most compile workers idle (H200, 14
workers: the recorded Qwen3-235B TP4 tune compiled 851 CPU-s in 125 s). The
searches are therefore written as jobs (`Job`: generators of the `Ask`s they
need answered) and run together (`run_jobs`): fast search hands its leaders
from one batch size to the next after the first climb round and runs the
large batch sizes as a second chain (`chain_heads`), and transfer search
hands them on after its seed round and asks every batch size's seeds at
once, so the asks of many batch sizes are in
flight at once and a streaming measurer keeps every worker busy. What a job
hands on is taken at a fixed point of its own work, so the results depend on
the timings alone, never on the order they come back in
(``bench/replay_wall.py`` replays the recorded tunes on a simulated clock:
the same picks, about a third less wall time).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Protocol

from moetune.device import DeviceLimits
from moetune.errors import TuneError
from moetune.kernel.config import Candidate
from moetune.tune.problem import TuneProblem
from moetune.tune.search.costmodel import rank_candidates
from moetune.tune.search.space import PARAM_NAMES, values_by_param
from moetune.tune.store import Measurement


class Measurer(Protocol):
    """Times candidates for one batch size; failures come back with status != "ok"."""

    def measure(
        self, batch_size: int, candidates: Sequence[Candidate], fidelity: str
    ) -> dict[Candidate, Measurement]: ...


@dataclass(frozen=True)
class SearchResult:
    """The winner for one batch size and what finding it cost.

    `timed` is the number of distinct candidates measured (any fidelity),
    `measurements` the number of (candidate, fidelity) timings, `space_size`
    the number of candidates the search could choose from.
    """

    batch_size: int
    best: Measurement
    timed: int
    measurements: int = 0
    space_size: int = 0


@dataclass(frozen=True)
class FastSearchOptions:
    """Knobs of `fast_search` and `transfer_search`; fast's defaults time 5-10 % of a pruned space."""

    initial: int = 16  # model-ranked candidates timed first (at least) ...
    initial_fraction: float = 0.01  # ... or this fraction of the space, if larger
    seeds_per_neighbour: int = 4  # best configs of the nearest solved batch size re-timed here
    starts: int = 2  # the climb explores around this many best-so-far candidates
    max_climb_rounds: int = 10
    finalists: int = 10  # best quick results re-timed at full fidelity (at least) ...
    finalist_margin: float = 0.08  # ... and any within this fraction of the best quick one ...
    max_finalists: int = 32  # ... up to this many
    exhaustive_below: int = 40  # spaces this small are timed whole, at full fidelity
    transfer_seeds: int = 8  # transfer_search: the other kernel's best configs timed first
    # Batch sizes searched side by side (module docstring); False: one after another, each
    # from the final leaders of the one below, as before the pipeline (for comparisons).
    pipelined: bool = True

    def __post_init__(self) -> None:
        for name in ("initial", "starts", "max_climb_rounds", "finalists", "transfer_seeds"):
            if getattr(self, name) < 1:
                raise TuneError(f"fast search option {name} must be at least 1")
        if not 0.0 <= self.initial_fraction <= 1.0:
            raise TuneError("fast search option initial_fraction must be within [0, 1]")


# ``--search thorough``: the climb from three best-so-far candidates; the default climbs from
# two. Replayed on 16 recorded H200 stores (277 batch sizes, bench/replay_wall.py), two starts
# pick the same config at 269, +0.04 % on average, over 1 % at 5 (worst +3.7 %, at M = 1), for
# 15-25 % less compile CPU; on the H200 the Qwen3-235B TP8 vLLM file was the same at 17 of 18
# batch sizes, the other 0.5 % faster (BENCHMARKS.md, Tune time). Thorough keeps three so the
# loss can be measured.
THOROUGH_OPTIONS = FastSearchOptions(starts=3)

# A transfer starts next to the best: it climbs from the best one only and re-times fewer
# finalists (the seeds are re-timed too). About a third of fast search's timings, within
# 1 % of it on the two-kernel synthetic GPU (tests/tune/test_strategy_transfer.py).
TRANSFER_OPTIONS = FastSearchOptions(starts=1, finalists=3, finalist_margin=0.02, max_finalists=6)

# A pipelined fast search hands its leaders on after this many climb rounds.
HANDOFF_ROUNDS = 1
# A second chain of batch sizes starts where one expert's rows fill this many tiles'
# worth of rows at the smallest BLOCK_SIZE_M (16 tokens per expert): below, calls stream
# the weights; above, tiles fill and other configs win.
ROWS_PER_EXPERT_AT_SECOND_HEAD = 16
SpaceFor = Callable[[int], list[Candidate]]
OnResult = Callable[[SearchResult], None]


@dataclass(frozen=True)
class Ask:
    """One question a search step asks: time `candidates` at `batch_size` and `fidelity`."""

    batch_size: int
    candidates: tuple[Candidate, ...]
    fidelity: str
    priority: int = 0  # which asks the workers take first when several wait (lower first)
    # Asked only so that later asks find it measured: a measurer without a store to keep it
    # in (`run_jobs` asking one ask at a time) skips it.
    prefetch: bool = False


Answers = dict[Candidate, Measurement]


@dataclass(frozen=True)
class Start:
    """A search step handing work on: `job` runs alongside the job that yields this."""

    job: Job


# A search job: a generator that yields the `Ask`s it needs answered (and receives each
# answer) and the `Start`s of the jobs it hands on to.
Job = Generator[Ask | Start, Answers | None, None]
# Measure many asks at once: `(asks, answered)`, where `answered(ask, results)` is called as
# each ask is fully answered and returns the asks that follow from it.
Stream = Callable[[list[Ask], Callable[[Ask, Answers], list[Ask]]], None]


def run_jobs(jobs: Iterable[Job], measurer: Measurer) -> None:
    """Run search jobs to the end against `measurer`.

    A measurer with ``measure_stream`` (`Stream`; `moetune.tune.measure.measurer.StoreMeasurer`)
    gets every job's asks as they come, so the asks of many batch sizes are measured
    together and keep the compile workers busy; any other measurer is asked one ask
    at a time, one job after another. Jobs share nothing but what they hand on when
    they start one another, so both give the same results from the same timings.
    """
    stream = getattr(measurer, "measure_stream", None)
    if stream is None:
        _run_in_turn(jobs, measurer)
    else:
        _run_together(jobs, stream)


def _run_in_turn(jobs: Iterable[Job], measurer: Measurer) -> None:
    queue = deque(jobs)
    while queue:
        job = queue.popleft()
        reply: Answers | None = None
        while True:
            try:
                step = job.send(reply)
            except StopIteration:
                break
            if isinstance(step, Start):
                queue.append(step.job)
                reply = None
            elif step.prefetch:
                reply = {}
            else:
                reply = measurer.measure(step.batch_size, list(step.candidates), step.fidelity)


def _run_together(jobs: Iterable[Job], stream: Stream) -> None:
    waiting: dict[int, tuple[Ask, Job]] = {}  # by id(ask): each ask object is one job's

    def advance(job: Job, reply: Answers | None) -> list[Ask]:
        """Step `job` (and the jobs it starts) until each waits for an answer or ends."""
        asks: list[Ask] = []
        stack: list[tuple[Job, Answers | None]] = [(job, reply)]
        while stack:
            current, answer = stack.pop()
            while True:
                try:
                    step = current.send(answer)
                except StopIteration:
                    break
                if isinstance(step, Start):
                    stack.append((step.job, None))
                    answer = None
                    continue
                waiting[id(step)] = (step, current)
                asks.append(step)
                break
        return asks

    def answered(ask: Ask, results: Answers) -> list[Ask]:
        _, job = waiting.pop(id(ask))
        return advance(job, results)

    first = [ask for job in jobs for ask in advance(job, None)]
    if first:
        stream(first, answered)


class _Timings:
    """Measurements of one batch size, asked of the measurer at most once per fidelity."""

    def __init__(self, batch_size: int, priority: int = 0) -> None:
        self.batch_size = batch_size
        self.priority = priority
        self.by_fidelity: dict[str, dict[Candidate, Measurement]] = {"quick": {}, "full": {}}
        self.asked: dict[str, set[Candidate]] = {"quick": set(), "full": set()}

    def measure(self, candidates: Iterable[Candidate], fidelity: str) -> Job:
        todo = [c for c in dict.fromkeys(candidates) if c not in self.asked[fidelity]]
        if not todo:
            return
        self.asked[fidelity].update(todo)
        results = yield Ask(self.batch_size, tuple(todo), fidelity, self.priority)
        wanted = set(todo)
        self.by_fidelity[fidelity].update((c, m) for c, m in (results or {}).items() if c in wanted)

    def best(self, fidelity: str, count: int) -> list[Candidate]:
        ok = [(m.latency_us, c) for c, m in self.by_fidelity[fidelity].items() if m.ok]
        return [c for _, c in sorted(ok)[:count]]

    def winner(self) -> Measurement | None:
        ok = [m for m in self.by_fidelity["full"].values() if m.ok]
        return min(ok, key=lambda m: (m.latency_us, m.candidate)) if ok else None

    @property
    def timed(self) -> int:
        return len(self.asked["quick"] | self.asked["full"])

    @property
    def measurements(self) -> int:
        return len(self.asked["quick"]) + len(self.asked["full"])


def _result(timings: _Timings, space_size: int) -> SearchResult:
    best = timings.winner()
    if best is None:
        raise TuneError(
            f"no candidate ran at batch size {timings.batch_size}: all "
            f"{timings.timed} timed candidates failed (see the results store for their errors)"
        )
    return SearchResult(
        batch_size=timings.batch_size,
        best=best,
        timed=timings.timed,
        measurements=timings.measurements,
        space_size=space_size,
    )


def _space(space_for: SpaceFor, batch_size: int) -> list[Candidate]:
    space = list(dict.fromkeys(space_for(batch_size)))
    if not space:
        raise TuneError(f"the search space is empty at batch size {batch_size}")
    return space


def exhaustive_search(
    batch_sizes: Iterable[int],
    space_for: SpaceFor,
    measurer: Measurer,
    on_result: OnResult | None = None,
) -> dict[int, SearchResult]:
    """Time every candidate of every batch size at full fidelity; the fastest wins."""
    order = list(dict.fromkeys(batch_sizes))
    spaces = {m: _space(space_for, m) for m in order}
    timings = {m: _Timings(m) for m in order}
    run_jobs([timings[m].measure(spaces[m], "full") for m in order], measurer)
    results: dict[int, SearchResult] = {}
    for m in order:
        results[m] = _result(timings[m], len(spaces[m]))
        if on_result is not None:
            on_result(results[m])
    return results


# Parameters that trade shared memory against each other: moved in opposite directions in pairs.
_PAIRED = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_stages")
# Tiles and warps grow together: a bigger tile wants more warps.
_TILES = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K")


def neighbours(
    candidate: Candidate, values: dict[str, list[int]], space: set[Candidate]
) -> list[Candidate]:
    """Candidates of `space` one move away from `candidate`.

    A move sets one parameter to any other value (tile quantization makes
    latency jump, not slope, along BLOCK_SIZE_M: a tile that divides the tokens
    per expert can beat both its neighbours); or moves two of the tiles and
    num_stages one step in opposite directions (keeping shared memory about
    level); or moves one tile and num_warps one step in the same direction
    (a bigger tile wants more warps).
    """
    found: list[Candidate] = []
    for name in PARAM_NAMES:
        for value in values[name]:
            if value != getattr(candidate, name):
                found.append(replace(candidate, **{name: value}))
    for i, first in enumerate(_PAIRED):
        for second in _PAIRED[i + 1 :]:
            a, b = values[first], values[second]
            ia, ib = a.index(getattr(candidate, first)), b.index(getattr(candidate, second))
            for da in (-1, 1):
                ja, jb = ia + da, ib - da
                if 0 <= ja < len(a) and 0 <= jb < len(b):
                    found.append(replace(candidate, **{first: a[ja], second: b[jb]}))
    warps = values["num_warps"]
    iw = warps.index(candidate.num_warps)
    for name in _TILES:
        tile = values[name]
        it = tile.index(getattr(candidate, name))
        for d in (-1, 1):
            if 0 <= it + d < len(tile) and 0 <= iw + d < len(warps):
                found.append(replace(candidate, **{name: tile[it + d], "num_warps": warps[iw + d]}))
    return [c for c in dict.fromkeys(found) if c in space]


def _log_distance(a: Candidate, b: Candidate) -> float:
    return sum(abs(math.log2(getattr(a, n)) - math.log2(getattr(b, n))) for n in PARAM_NAMES)


def nearest_in_space(candidate: Candidate, space: Sequence[Candidate]) -> Candidate:
    """`candidate` itself if in `space`, else the closest member (log2 distance per parameter)."""
    if candidate in space:
        return candidate
    return min(space, key=lambda c: (_log_distance(candidate, c), c))


def search_options(search: str) -> FastSearchOptions:
    """The whole-call search knobs of ``--search fast`` or ``thorough``."""
    return THOROUGH_OPTIONS if search == "thorough" else FastSearchOptions()


def fast_search(
    batch_sizes: Iterable[int],
    space_for: SpaceFor,
    measurer: Measurer,
    problem: TuneProblem,
    limits: DeviceLimits,
    options: FastSearchOptions | None = None,
    on_result: OnResult | None = None,
) -> dict[int, SearchResult]:
    """Find a near-best candidate per batch size while timing a small part of each space.

    Batch sizes are solved in ascending order, each seeded with the best
    configs of the one below (neighbouring batch sizes have similar winners);
    then each is offered the best configs of its neighbours, climbing again
    from any that beats its best so far. Pipelined (the default, see
    `_FastPipeline`), a batch size starts as soon as the one below has
    climbed one round, and the large batch sizes start a second chain, so
    many searches run at once. `on_result` is called as each batch size's
    result becomes final.
    """
    opts = options or FastSearchOptions()
    order = sorted(set(batch_sizes))
    spaces = {m: _space(space_for, m) for m in order}
    heads = chain_heads(order, problem) if opts.pipelined else [0]
    # The workers take each chain's earlier batch sizes first: their leaders start the next.
    timings = {m: _Timings(m, i - max(h for h in heads if h <= i)) for i, m in enumerate(order)}
    searches = {
        m: _Search(timings[m], spaces[m], problem, limits, opts)
        for m in order
        if len(spaces[m]) > opts.exhaustive_below
    }
    pipeline = _FastPipeline(order, spaces, timings, searches, opts, heads, on_result)
    jobs = [pipeline.forward(head, []) for head in heads]
    if opts.pipelined:  # each cost-model pool, in advance, when a worker is idle
        jobs += [pipeline.prefetch(i) for i, m in enumerate(order) if m in searches]
    run_jobs(jobs, measurer)
    missing = [m for m in order if m not in pipeline.results]
    if missing:  # every candidate failed there: say so, once nothing else is measured
        _result(timings[missing[0]], len(spaces[missing[0]]))
    return {m: pipeline.results[m] for m in order}


def chain_heads(order: Sequence[int], problem: TuneProblem) -> list[int]:
    """Indexes in `order` where a pipelined fast search starts a chain of batch sizes: the
    first, and the first with `ROWS_PER_EXPERT_AT_SECOND_HEAD` rows per expert."""
    rows = ROWS_PER_EXPERT_AT_SECOND_HEAD * problem.num_experts
    full = [i for i, m in enumerate(order) if m * problem.top_k >= rows]
    return [0, full[0]] if full and full[0] > 0 else [0]


class _FastPipeline:
    """`fast_search` as jobs: a forward job, then a refine job, per batch size.

    Pipelined: forward(i) times its seed round (the cost model's pool and
    the leaders batch size i-1 had when it handed on), climbs one round,
    starts forward(i+1) with its leaders then (unless i+1 heads a chain of
    its own), climbs on and decides. refine(i) starts once forward(i-1),
    forward(i) and forward(i+1) are done and offers batch size i the
    leaders its neighbours had then. Each job hands on a copy of what it
    read, taken at a fixed point of its own work, so the results depend on
    the timings only, not on the order the jobs run in.

    Not pipelined: forward(i) starts forward(i+1) once it has decided, and
    refine(i) starts once refine(i+1) is done, with the leaders it left: the
    batch sizes one after another, as before.
    """

    def __init__(
        self,
        order: list[int],
        spaces: dict[int, list[Candidate]],
        timings: dict[int, _Timings],
        searches: dict[int, _Search],
        opts: FastSearchOptions,
        heads: list[int],
        on_result: OnResult | None,
    ) -> None:
        self.order, self.spaces, self.timings, self.searches = order, spaces, timings, searches
        self.opts, self.heads, self.on_result = opts, heads, on_result
        self.forward_leaders: dict[int, list[Candidate]] = {}  # by index, once forward(i) is done
        self.refined_leaders: dict[int, list[Candidate]] = {}  # ... once refine(i) is done
        self.refine_started: set[int] = set()
        self.results: dict[int, SearchResult] = {}

    def leaders(self, i: int) -> list[Candidate]:
        return _leaders(self.timings[self.order[i]], self.opts.seeds_per_neighbour)

    def prefetch(self, i: int) -> Job:
        """Ask for batch size i's cost-model pool, which its seed round asks for too, behind
        every other ask (`Ask.prefetch`)."""
        m = self.order[i]
        pool = self.searches[m].pool()
        yield Ask(m, tuple(pool), "quick", len(self.order) + i, prefetch=True)

    def forward(self, i: int, previous: list[Candidate]) -> Job:
        m = self.order[i]
        search = self.searches.get(m)
        pipelined = self.opts.pipelined
        if search is None:
            yield from self.timings[m].measure(self.spaces[m], "full")
        else:
            yield from search.seed(previous)
            first = HANDOFF_ROUNDS if pipelined else self.opts.max_climb_rounds
            yield from search.climb(first)
            if pipelined:
                yield from self._hand_on(i)
            yield from search.climb(self.opts.max_climb_rounds - first)
            yield from search.decide()
        if search is None or not pipelined:
            yield from self._hand_on(i)
        self.forward_leaders[i] = self.leaders(i)
        for j in (i - 1, i, i + 1):
            yield from self._start_refine(j)

    def _hand_on(self, i: int) -> Job:
        if i + 1 < len(self.order) and i + 1 not in self.heads:
            yield Start(self.forward(i + 1, self.leaders(i)))

    def _start_refine(self, i: int) -> Job:
        """Start refine(i) once what it is offered is known (class docstring)."""
        if not 0 <= i < len(self.order) or i in self.refine_started:
            return
        last = i == len(self.order) - 1
        if self.opts.pipelined:
            near = [j for j in (i - 1, i, i + 1) if 0 <= j < len(self.order)]
            if not all(j in self.forward_leaders for j in near):
                return
            offered = [c for j in near if j != i for c in self.forward_leaders[j]]
        else:
            if i not in self.forward_leaders or not (last or i + 1 in self.refined_leaders):
                return
            offered = [] if last else self.refined_leaders[i + 1]
        self.refine_started.add(i)
        yield Start(self.refine(i, list(dict.fromkeys(offered))))

    def refine(self, i: int, offered: list[Candidate]) -> Job:
        m = self.order[i]
        search = self.searches.get(m)
        if search is not None and offered:
            yield from search.refine(offered)
        self.refined_leaders[i] = self.leaders(i)
        if self.timings[m].winner() is not None:
            self.results[m] = _result(self.timings[m], len(self.spaces[m]))
            if self.on_result is not None:
                self.on_result(self.results[m])
        if not self.opts.pipelined:
            yield from self._start_refine(i - 1)


def transfer_search(
    batch_sizes: Iterable[int],
    space_for: SpaceFor,
    measurer: Measurer,
    problem: TuneProblem,
    limits: DeviceLimits,
    seeds_by_batch: Mapping[int, Sequence[Candidate]],
    options: FastSearchOptions | None = None,
    on_result: OnResult | None = None,
) -> dict[int, SearchResult]:
    """Fast search seeded from another kernel's results on the same problem.

    `seeds_by_batch` holds, per batch size, the other kernel's best configs,
    best first. At each batch size, in ascending order, the first
    `transfer_seeds` of them (each mapped to its nearest member of this
    space) and the leaders of the batch size below after its seed round are
    timed at quick fidelity, in place of the cost model's pool; the search
    climbs from the best (`TRANSFER_OPTIONS`: one start, a few finalists) and
    re-times the finalists and every seed that ran at full fidelity. A batch
    size without seeds, or whose seeds all fail here, starts as `fast_search`
    does. Small spaces are timed whole. A batch size starts once the one
    below has timed its seeds, so their climbs overlap; pipelined, every
    batch size's seeds are also asked at once, behind every other ask (they
    are known before any timing), so the chain finds them compiled and timed
    instead of waiting on a compile round per batch size (replayed on the
    recorded H200 default tunes: DeepSeek-V3 TP8 49 -> 38 s, Qwen3-235B TP8
    29 -> 22 s, the same picks). `on_result` is called as each batch size is
    done.
    """
    opts = options or TRANSFER_OPTIONS
    order = sorted(set(batch_sizes))
    spaces = {m: _space(space_for, m) for m in order}
    results: dict[int, SearchResult] = {}
    every: dict[int, _Timings] = {}

    def seeds_at(m: int) -> list[Candidate]:
        """The other kernel's best configs at `m` that the seed round times (and prefetches)."""
        return list(dict.fromkeys(seeds_by_batch.get(m, ())))[: opts.transfer_seeds]

    def job(i: int, previous: list[Candidate]) -> Job:
        m = order[i]
        timings = _Timings(m, i)
        search = None
        if len(spaces[m]) <= opts.exhaustive_below:
            yield from timings.measure(spaces[m], "full")
        else:
            search = _Search(timings, spaces[m], problem, limits, opts)
            seeds = seeds_at(m)
            if seeds:
                mapped = yield from search.transfer_seed(seeds, previous)
            else:
                mapped = []
                yield from search.seed(previous)
        if opts.pipelined:
            yield from hand_on(i, timings)
        if search is not None:
            yield from search.climb()
            yield from search.decide()
            yield from search.confirm_seeds(mapped)
        if not opts.pipelined:
            yield from hand_on(i, timings)
        every[m] = timings
        if timings.winner() is not None:
            results[m] = _result(timings, len(spaces[m]))
            if on_result is not None:
                on_result(results[m])

    def hand_on(i: int, timings: _Timings) -> Job:
        if i + 1 < len(order):
            yield Start(job(i + 1, _leaders(timings, opts.seeds_per_neighbour)))

    def prefetch(i: int) -> Job:
        """Ask for batch size i's transfer seeds, which its seed round asks for too, behind
        every other ask (`Ask.prefetch`): known before any timing, so compiled at once."""
        m = order[i]
        mapped = dict.fromkeys(nearest_in_space(s, spaces[m]) for s in seeds_at(m))
        if mapped and len(spaces[m]) > opts.exhaustive_below:
            yield Ask(m, tuple(mapped), "quick", len(order) + i, prefetch=True)

    jobs = [job(0, [])]
    if opts.pipelined:
        jobs += [prefetch(i) for i in range(1, len(order))]
    run_jobs(jobs, measurer)
    missing = [m for m in order if m not in results]
    if missing:  # every candidate failed there: say so, once nothing else is measured
        _result(every[missing[0]], len(spaces[missing[0]]))
    return {m: results[m] for m in order}


def _leaders(timings: _Timings, count: int) -> list[Candidate]:
    """The best full-fidelity candidates, then the best quick ones, `count` of each at most."""
    leaders = timings.best("full", count)
    return leaders + [c for c in timings.best("quick", count) if c not in leaders]


class _Search:
    """Fast search at one batch size: seed, climb, decide; `refine` re-opens it with new seeds.

    Every step is a `Job` (a generator of asks), run with ``yield from``.
    """

    def __init__(
        self,
        timings: _Timings,
        space: list[Candidate],
        problem: TuneProblem,
        limits: DeviceLimits,
        opts: FastSearchOptions,
    ) -> None:
        self.timings = timings
        self.space = space
        self.problem = problem
        self.limits = limits
        self.opts = opts
        self.members = set(space)
        self.values = values_by_param(space)

    @cached_property
    def ranked(self) -> list[Candidate]:
        """The space, the cost model's fastest first."""
        return rank_candidates(self.problem, self.timings.batch_size, self.space, self.limits)

    def pool(self) -> list[Candidate]:
        """The cost model's favourites, timed first."""
        initial = max(self.opts.initial, math.ceil(self.opts.initial_fraction * len(self.ranked)))
        return self.ranked[:initial]

    def seed(self, seeds: list[Candidate]) -> Job:
        """Time the cost model's pool and `seeds` at quick fidelity (walking down the
        model's ranking while nothing has run)."""
        timings, ranked = self.timings, self.ranked
        pool = self.pool()
        initial = len(pool)
        yield from timings.measure(pool + [nearest_in_space(s, self.space) for s in seeds], "quick")
        # Nothing ran yet (every early candidate failed): walk down the model's ranking.
        next_index = initial
        while not timings.best("quick", 1) and next_index < len(ranked):
            yield from timings.measure(ranked[next_index : next_index + initial], "quick")
            next_index += initial

    def transfer_seed(
        self, seeds: list[Candidate], previous: list[Candidate]
    ) -> Generator[Ask | Start, Answers | None, list[Candidate]]:
        """Time another kernel's best configs (and `previous`) at quick fidelity; if none
        ran, the seed round of `seed` instead. Returns the seeds that ran, to `confirm_seeds`."""
        timings = self.timings
        mapped = list(dict.fromkeys(nearest_in_space(s, self.space) for s in seeds))
        yield from timings.measure(
            mapped + [nearest_in_space(s, self.space) for s in previous], "quick"
        )
        if not timings.best("quick", 1):
            yield from self.seed(previous)
            return []
        quick = timings.by_fidelity["quick"]
        return [c for c in mapped if c in quick and quick[c].ok]

    def confirm_seeds(self, ran: list[Candidate]) -> Job:
        """Re-time at full fidelity the other kernel's seeds that ran, whatever their quick
        rank: they were the best on the other kernel, and quick noise must not drop the
        one that is best here too."""
        yield from self.timings.measure(ran, "full")

    def refine(self, seeds: list[Candidate]) -> Job:
        timings = self.timings
        before = timings.best("quick", 1)
        yield from timings.measure([nearest_in_space(s, self.space) for s in seeds], "quick")
        if timings.best("quick", 1) != before:
            yield from self.climb()
            yield from self.decide()

    def climb(self, rounds: int | None = None) -> Job:
        timings = self.timings
        for _ in range(self.opts.max_climb_rounds if rounds is None else rounds):
            frontier = timings.best("quick", self.opts.starts)
            todo = [
                n
                for c in frontier
                for n in neighbours(c, self.values, self.members)
                if n not in timings.asked["quick"]
            ]
            if not todo:
                break
            yield from timings.measure(todo, "quick")

    def decide(self) -> Job:
        timings, opts = self.timings, self.opts
        ranked_quick = timings.best("quick", opts.max_finalists)
        if not ranked_quick:
            return  # every candidate failed; `_result` says so
        quick = timings.by_fidelity["quick"]
        cutoff = quick[ranked_quick[0]].latency_us * (1 + opts.finalist_margin)
        finalists = [
            c
            for i, c in enumerate(ranked_quick)
            if i < opts.finalists or quick[c].latency_us <= cutoff
        ]
        yield from timings.measure(finalists, "full")


def tma_b_off_round(
    twins: Mapping[int, Sequence[Candidate]], fidelity: Mapping[int, str], measurer: Measurer
) -> None:
    """Time each batch size's TMA-B-off twins (`moetune.tune.search.space.tma_b_off_candidates`)
    at the fidelity its search ended on, every batch size in one run: the store then ranks
    them with the rest, so an off twin is written only where it was timed faster."""

    def job(m: int) -> Job:
        yield Ask(m, tuple(twins[m]), fidelity[m])

    run_jobs([job(m) for m in twins if twins[m]], measurer)
