"""Search strategies: which candidates to time, at which fidelity, and which one wins.

Strategies talk to the GPU only through a `Measurer`, so they run on CPU in
tests against a synthetic cost model. Three are offered:

- `exhaustive_search` times every candidate at full fidelity (what vLLM's and
  SGLang's tuners do).
- `fast_search` (the default) times a small, well-chosen part of the space
  (about 10 % of a pruned default grid; within 2 % of the best at every batch
  size on the synthetic GPU of ``tests/tune/synthetic.py``):

  1. seed: the candidates `costmodel` ranks fastest, plus the best configs of
     the nearest smaller batch size already solved, timed at quick fidelity;
  2. climb: from the few best so far, time every untimed neighbour (see
     `neighbours`) until the best few have no untimed neighbours left;
  3. decide: re-time the best quick results (and any close to the best) at
     full fidelity; the fastest wins;
  4. refine: going back down the batch sizes, offer each the winners of the
     next larger one, and climb and decide again if one of them is faster.

- `transfer_search` searches a problem already searched on another kernel
  (vLLM's and SGLang's kernels compute the same GEMMs with the same tiles and
  rank configs alike): each batch size starts from the other kernel's best
  full-fidelity configs there instead of the cost model's pool, then climbs
  and decides as fast search does.

Compiling dominates a candidate's cost on the GPU, so `SearchResult.timed`
counts distinct candidates; `measurements` also counts full re-timings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
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
    starts: int = 3  # the climb explores around this many best-so-far candidates
    max_climb_rounds: int = 10
    finalists: int = 10  # best quick results re-timed at full fidelity (at least) ...
    finalist_margin: float = 0.08  # ... and any within this fraction of the best quick one ...
    max_finalists: int = 32  # ... up to this many
    exhaustive_below: int = 40  # spaces this small are timed whole, at full fidelity
    transfer_seeds: int = 8  # transfer_search: the other kernel's best configs timed first

    def __post_init__(self) -> None:
        for name in ("initial", "starts", "max_climb_rounds", "finalists", "transfer_seeds"):
            if getattr(self, name) < 1:
                raise TuneError(f"fast search option {name} must be at least 1")
        if not 0.0 <= self.initial_fraction <= 1.0:
            raise TuneError("fast search option initial_fraction must be within [0, 1]")


# A transfer starts next to the best: it climbs from the best one only and re-times fewer
# finalists (the seeds are re-timed too). About a third of fast search's timings, within
# 1 % of it on the two-kernel synthetic GPU (tests/tune/test_strategy_transfer.py).
TRANSFER_OPTIONS = FastSearchOptions(starts=1, finalists=3, finalist_margin=0.02, max_finalists=6)

SpaceFor = Callable[[int], list[Candidate]]
OnResult = Callable[[SearchResult], None]


class _Timings:
    """Measurements of one batch size, asked of the measurer at most once per fidelity."""

    def __init__(self, measurer: Measurer, batch_size: int) -> None:
        self.measurer = measurer
        self.batch_size = batch_size
        self.by_fidelity: dict[str, dict[Candidate, Measurement]] = {"quick": {}, "full": {}}
        self.asked: dict[str, set[Candidate]] = {"quick": set(), "full": set()}

    def measure(self, candidates: Iterable[Candidate], fidelity: str) -> None:
        todo = [c for c in dict.fromkeys(candidates) if c not in self.asked[fidelity]]
        if not todo:
            return
        self.asked[fidelity].update(todo)
        results = self.measurer.measure(self.batch_size, todo, fidelity)
        wanted = set(todo)
        self.by_fidelity[fidelity].update((c, m) for c, m in results.items() if c in wanted)

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
    results: dict[int, SearchResult] = {}
    for m in batch_sizes:
        space = _space(space_for, m)
        timings = _Timings(measurer, m)
        timings.measure(space, "full")
        results[m] = _result(timings, len(space))
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
    then, in descending order, each is offered the best configs of the one
    above, climbing again from any that beats its best so far. `on_result`
    is called as each batch size's result becomes final (the largest first).
    """
    opts = options or FastSearchOptions()
    order = sorted(set(batch_sizes))
    spaces = {m: _space(space_for, m) for m in order}
    timings = {m: _Timings(measurer, m) for m in order}
    searches = {
        m: _Search(timings[m], spaces[m], problem, limits, opts)
        for m in order
        if len(spaces[m]) > opts.exhaustive_below
    }

    previous: list[Candidate] = []
    for m in order:
        if m in searches:
            searches[m].start(previous)
        else:
            timings[m].measure(spaces[m], "full")
        previous = _leaders(timings[m], opts.seeds_per_neighbour)

    results: dict[int, SearchResult] = {}
    following: list[Candidate] = []
    for m in reversed(order):
        if m in searches and following:
            searches[m].refine(following)
        results[m] = _result(timings[m], len(spaces[m]))
        following = _leaders(timings[m], opts.seeds_per_neighbour)
        if on_result is not None:
            on_result(results[m])
    return {m: results[m] for m in order}


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
    space) and the leaders of the batch size below are timed at quick
    fidelity, in place of the cost model's pool; the search climbs from the
    best (`TRANSFER_OPTIONS`: one start, a few finalists) and re-times the
    finalists and every seed that ran at full fidelity. A batch size without
    seeds, or whose seeds all fail here, starts as `fast_search` does. Small
    spaces are timed whole. `on_result` is called as each batch size is done.
    """
    opts = options or TRANSFER_OPTIONS
    results: dict[int, SearchResult] = {}
    previous: list[Candidate] = []
    for m in sorted(set(batch_sizes)):
        space = _space(space_for, m)
        timings = _Timings(measurer, m)
        if len(space) <= opts.exhaustive_below:
            timings.measure(space, "full")
        else:
            search = _Search(timings, space, problem, limits, opts)
            seeds = list(dict.fromkeys(seeds_by_batch.get(m, ())))[: opts.transfer_seeds]
            if seeds:
                search.transfer(seeds, previous)
            else:
                search.start(previous)
        results[m] = _result(timings, len(space))
        previous = _leaders(timings, opts.seeds_per_neighbour)
        if on_result is not None:
            on_result(results[m])
    return results


def _leaders(timings: _Timings, count: int) -> list[Candidate]:
    """The best full-fidelity candidates, then the best quick ones, `count` of each at most."""
    leaders = timings.best("full", count)
    return leaders + [c for c in timings.best("quick", count) if c not in leaders]


class _Search:
    """Fast search at one batch size: seed, climb, decide; `refine` re-opens it with new seeds."""

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

    def start(self, seeds: list[Candidate]) -> None:
        timings, opts = self.timings, self.opts
        ranked = rank_candidates(self.problem, timings.batch_size, self.space, self.limits)
        initial = max(opts.initial, math.ceil(opts.initial_fraction * len(ranked)))
        pool = ranked[:initial] + [nearest_in_space(s, self.space) for s in seeds]
        timings.measure(pool, "quick")
        # Nothing ran yet (every early candidate failed): walk down the model's ranking.
        next_index = initial
        while not timings.best("quick", 1) and next_index < len(ranked):
            timings.measure(ranked[next_index : next_index + initial], "quick")
            next_index += initial
        self._climb()
        self._decide()

    def transfer(self, seeds: list[Candidate], previous: list[Candidate]) -> None:
        """Seed with another kernel's best configs (and `previous`), climb, decide.

        The seeds that ran are re-timed at full fidelity whatever their quick
        rank: they were the best on the other kernel, and quick noise must not
        drop the one that is best here too. If nothing ran, `start` takes over.
        """
        timings = self.timings
        mapped = list(dict.fromkeys(nearest_in_space(s, self.space) for s in seeds))
        timings.measure(mapped + [nearest_in_space(s, self.space) for s in previous], "quick")
        if not timings.best("quick", 1):
            self.start(previous)
            return
        self._climb()
        self._decide()
        quick = timings.by_fidelity["quick"]
        timings.measure([c for c in mapped if c in quick and quick[c].ok], "full")

    def refine(self, seeds: list[Candidate]) -> None:
        timings = self.timings
        before = timings.best("quick", 1)
        timings.measure([nearest_in_space(s, self.space) for s in seeds], "quick")
        if timings.best("quick", 1) != before:
            self._climb()
            self._decide()

    def _climb(self) -> None:
        timings = self.timings
        for _ in range(self.opts.max_climb_rounds):
            frontier = timings.best("quick", self.opts.starts)
            todo = [
                n
                for c in frontier
                for n in neighbours(c, self.values, self.members)
                if n not in timings.asked["quick"]
            ]
            if not todo:
                break
            timings.measure(todo, "quick")

    def _decide(self) -> None:
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
        timings.measure(finalists, "full")
