"""The default split search: a few seeded lone-GEMM timings per batch size, and a stop rule.

The single-config search has already ranked whole calls at every batch size,
and a whole call is its up GEMM plus its down GEMM plus a small fixed cost.
So the configs that win each GEMM alone are, nearly always, among the best
whole-call configs (on the recorded H200 stores the chosen up config ranks in
the top 3 of the whole-call ranking at most batch sizes). Per batch size, in
ascending order:

1. reference: the single config's up and down GEMMs timed alone (no TMA);
   their sum is what the split pair has to beat;
2. seeds: the best `whole_seeds` whole-call configs of the space, the
   previous batch size's pair, and the `model_seeds` configs the cost model
   ranks fastest for each GEMM alone; every variant (up, down, down with TMA)
   times its seeds at full fidelity. TMA candidates that the shape's TMA
   alignment rules out (`tma_rule_out`) are dropped before any compile;
3. bound: with the best up + down the seeds found, a climb is assumed to find
   at most `headroom` more. If even then the pair cannot beat the reference by
   `min_gain` (the noise of a whole-call timing), the batch size stops here:
   the single config is written and nothing else is timed. On the recorded
   H200 stores the climb found nothing at all 37 batch sizes whose seeds gained
   under 0.5 %, and up to 2 % only where they gained more (`bench/replay_split.py`);
4. climb: otherwise each variant steps from its best config at the chosen
   BLOCK_SIZE_M, one parameter one step at a time, until nothing improves.
   Where that stalls, the chosen pair's GEMMs with a long reduction (K for up,
   N for down; `paired_min_reduction`) try once BLOCK_SIZE_K one step with
   BLOCK_SIZE_N or num_stages one step the other way (`paired_neighbours`): a
   deeper K tile pays in shared memory, so it tends to win only with a
   narrower N tile or fewer stages, two steps that one-step moves cannot take
   (the recorded Qwen3-235B TP8 thorough tune's up GEMMs at M = 4 and 256).
   If one wins, the one-step climb goes on from it;
5. the pair of the smallest up + down is confirmed as a whole call (by the
   caller) only when it beats the reference by `min_gain`.

Timings are answered by the caller's measurer (the results store first), so
this search resumes and isolates faults like every other one.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from moetune.device import DeviceLimits
from moetune.dtypes import DTYPES
from moetune.errors import TuneError
from moetune.kernel.config import Candidate
from moetune.kernel.probe import Probe
from moetune.tune.search.costmodel import rank_for_gemm
from moetune.tune.search.space import PARAM_NAMES, values_by_param
from moetune.tune.search.split import PairChoice, best_per_block_m, choose_pair
from moetune.tune.search.strategy import Answers, Ask, Job, Start, run_jobs
from moetune.tune.store import Measurement

Variant = tuple[str, bool]  # (GEMM, TMA)


@dataclass(frozen=True)
class FastSplitOptions:
    """Knobs of the seeded split search (see the module docstring)."""

    whole_seeds: int = 4  # the best whole-call configs at this batch size
    model_seeds: int = 2  # per GEMM, the cost model's favourites for it alone
    min_gain: float = 0.01  # a pair must beat the single's up + down by this share
    headroom: float = 0.005  # what a climb may add where the seeds gained little
    max_climb_rounds: int = 4
    # Once the one-step climb stalls: BLOCK_SIZE_K traded against BLOCK_SIZE_N or num_stages,
    # on the chosen pair's GEMMs (step 4). False: the one-step climb alone, as before.
    paired_steps: bool = True
    # ... on a GEMM whose reduction (K for up, N for down) is at least this long: four of the
    # deepest K tiles (256). Shorter, the K loop runs a few iterations and a deeper tile has
    # little to save; replayed, the down GEMMs' paired moves (reduction 192) found nothing.
    paired_min_reduction: int = 1024
    # The batch sizes' independent timings asked side by side (`SeededSplitSearch`); False:
    # one batch size after another, as before (for comparisons). The same pairs either way.
    pipelined: bool = True

    def __post_init__(self) -> None:
        if self.whole_seeds < 1:
            raise TuneError("split search option whole_seeds must be at least 1")
        for name in ("model_seeds", "max_climb_rounds", "paired_min_reduction"):
            if getattr(self, name) < 0:
                raise TuneError(f"split search option {name} must be at least 0")
        for name in ("min_gain", "headroom"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise TuneError(f"split search option {name} must be within [0, 1)")


@dataclass(frozen=True)
class SearchedPair:
    """One batch size's outcome of the split search, before the whole-call confirmation."""

    batch_size: int
    choice: PairChoice | None
    reference_us: float | None  # the single config's up + down, each timed alone (no TMA)
    stopped: str | None = None  # why no pair is confirmed; None: confirm `choice`
    lone_timings: int = 0  # lone-GEMM timings this batch size asked for
    seeded_us: float | None = None  # the best up + down after the seeds, before any climb

    @property
    def gain(self) -> float | None:
        """1 - (best up + down) / reference: what the pair saves, timed alone."""
        if self.choice is None or not self.reference_us:
            return None
        return 1.0 - self.choice.estimate_us / self.reference_us


def _tma_operands(problem: Any, gemm: str, bm: int, bn: int, bk: int) -> list[tuple]:
    """(name, shape, strides, element bytes, box) of each operand `gemm` reads through TMA."""
    spec = DTYPES[problem.dtype]
    e, n, k = problem.num_experts, problem.intermediate_size, problem.hidden_size
    w_bytes, a_bytes = spec.weight_bytes, spec.activation_bytes
    if gemm == "up":  # w1 [E, 2N, K]; the tokens are gathered, not read through TMA
        return [("w1", (e, 2 * n, k), (2 * n * k, k, 1), w_bytes, (1, bn, bk))]
    # down: the sorted activation [rows, N] and w2 [E, K, N]
    return [
        ("A", (bm, n), (n, 1), a_bytes, (bm, bk)),
        ("w2", (e, k, n), (k * n, n, 1), w_bytes, (1, bn, bk)),
    ]


def tma_rule_out(problem: Any, gemm: str, candidate: Candidate | None = None) -> str | None:
    """Why TMA cannot run `gemm` of `problem` (with `candidate`'s boxes), or None.

    Checked on the shapes alone, before anything is compiled: the quantization,
    the 16-byte row strides of the operands read through descriptors (`candidate`
    None: these shape rules only) and the boxes (powers of two up to 256, an
    inner side of 16 bytes at least), `moetune.kernel.tma`'s rules.
    """
    from moetune.kernel.tma import SplitConfigError, check_tma_operand, check_tma_quant

    quant = DTYPES[problem.dtype].quant_dtype
    try:
        check_tma_quant(quant, problem.block_shape)
        tiles = (
            (16, 16, 16)
            if candidate is None
            else (candidate.BLOCK_SIZE_M, candidate.BLOCK_SIZE_N, candidate.BLOCK_SIZE_K)
        )
        for name, shape, strides, size, box in _tma_operands(problem, gemm, *tiles):
            if size != int(size):
                return f"{problem.dtype} packs its {name} elements below a byte"
            if candidate is None:
                box = (16,) * len(box)  # a box every rule accepts
            check_tma_operand(name, shape, strides, int(size), 0, box)
    except SplitConfigError as exc:
        return str(exc)
    return None


def step_neighbours(
    candidate: Candidate, values: Mapping[str, list[int]], space: set[Candidate]
) -> list[Candidate]:
    """Members of `space` one step away along one parameter, BLOCK_SIZE_M kept."""
    found = []
    for name in PARAM_NAMES:
        if name == "BLOCK_SIZE_M":
            continue
        options = values[name]
        here = getattr(candidate, name)
        if here not in options:
            continue
        index = options.index(here)
        for step in (-1, 1):
            if 0 <= index + step < len(options):
                moved = replace(candidate, **{name: options[index + step]})
                if moved in space:
                    found.append(moved)
    return found


# What a deeper K tile gives back in the paired round: each moves the other way.
TRADED_FOR_BLOCK_K = ("BLOCK_SIZE_N", "num_stages")


def paired_neighbours(
    candidate: Candidate,
    values: Mapping[str, list[int]],
    space: set[Candidate],
) -> list[Candidate]:
    """Members of `space` with BLOCK_SIZE_K one step deeper and BLOCK_SIZE_N or num_stages one
    step lower, or K one step shallower and N or stages one step higher; BLOCK_SIZE_M kept.

    These moves keep the shared memory about the same (a K tile twice as deep with an N tile
    half as wide holds the same weights; with one stage fewer, a pipeline about as deep), so
    where the one-step climb stalls on shared memory they are the two steps it cannot take.
    """
    k_values = values["BLOCK_SIZE_K"]
    if candidate.BLOCK_SIZE_K not in k_values:
        return []
    k_index = k_values.index(candidate.BLOCK_SIZE_K)
    found = []
    for k_step in (1, -1):
        if not 0 <= k_index + k_step < len(k_values):
            continue
        for name in TRADED_FOR_BLOCK_K:
            options, value = values[name], getattr(candidate, name)
            if value not in options or not 0 <= options.index(value) - k_step < len(options):
                continue
            moved = replace(
                candidate,
                BLOCK_SIZE_K=k_values[k_index + k_step],
                **{name: options[options.index(value) - k_step]},
            )
            if moved in space:
                found.append(moved)
    return found


def _pct(share: float) -> str:
    return f"{100 * share:.1f} %".replace(".0 %", " %")


MeasureFn = Callable[[int, Sequence[Probe], str], dict[Probe, Measurement]]
# The chain's asks go first; a prefetch for batch size index i waits behind them at 1 + i.
CHAIN_PRIORITY = 0


class _Measure:
    """A plain measure function as a `Measurer` (asked one ask at a time by `run_jobs`)."""

    def __init__(self, measure: MeasureFn) -> None:
        self.measure = measure


@dataclass
class _Timings:
    """Lone-GEMM latencies of one batch size, per variant; None: it failed."""

    by_variant: dict[Variant, dict[Candidate, float | None]] = field(default_factory=dict)
    asked: int = 0

    def best(self, variant: Variant) -> list[tuple[Candidate, float]]:
        rows = self.by_variant.get(variant, {})
        return sorted(((c, t) for c, t in rows.items() if t is not None), key=lambda r: r[1])

    def choice(self) -> PairChoice | None:
        timings: dict[str, list[tuple[Probe, float]]] = {"up": [], "down": []}
        for (kind, tma), rows in self.by_variant.items():
            timings[kind].extend((Probe(kind, c, tma), t) for c, t in rows.items() if t is not None)
        return choose_pair(best_per_block_m(timings["up"]), best_per_block_m(timings["down"]))


class SeededSplitSearch:
    """Steps 1-5 of the module docstring over every batch size, in ascending order.

    The steps are jobs (`moetune.tune.search.strategy.Job`) run by `run_jobs`. A batch
    size's search needs the pair of the one below (a seed), so the batch sizes still
    decide one after another (a chain), exactly as before. Pipelined
    (`FastSplitOptions.pipelined`), the timings that do not depend on the batch size
    below (the single config and the whole-call and cost-model seeds, TMA once the
    first batch size ran it) are asked of every batch size at once, as prefetches
    behind the chain's asks, and each batch size's whole-call confirmation (the pair
    and the single config, `confirm`) as soon as its search is done. A streaming
    measurer keeps them in the results store, where the chain's and the
    confirmation's own asks find them: the same questions, answered by the same
    timings, so the same pairs; a measurer without a store skips the prefetches.
    """

    def __init__(
        self,
        measure: MeasureFn | Any,
        problem: Any,
        limits: DeviceLimits,
        variants: Sequence[Variant],
        options: FastSplitOptions | None = None,
        notes: list[str] | None = None,
        fixed: Sequence[Variant] = (),
    ) -> None:
        # `fixed`: variants that time the single config alone, neither seeded nor climbed
        # (vLLM's down file: its up GEMM runs the main file's entry, `split_vllm`).
        # A measurer (`measure`, and `measure_stream` to run the batch sizes side by side),
        # or a bare measure function.
        self.measurer = measure if hasattr(measure, "measure") else _Measure(measure)
        self.problem = problem
        self.limits = limits
        self.variants = list(variants)
        self.fixed = frozenset(fixed)
        self.options = options or FastSplitOptions()
        self.notes = notes if notes is not None else []
        self.dropped: dict[Variant, str] = {}  # variants given up, with the reason
        self.supported: set[Variant] = set()  # variants that have run here
        self._ranked: dict[tuple[int, str], list[Candidate]] = {}

    def run(
        self,
        batch_sizes: Sequence[int],
        space_for: Callable[[int], list[Candidate]],
        singles: Mapping[int, Candidate],
        rankings: Mapping[int, Sequence[Candidate]],
        confirm: Callable[[SearchedPair], Sequence[Probe]] | None = None,
    ) -> dict[int, SearchedPair]:
        """`confirm(found)`: the whole-call probes the caller will time for a batch size's
        outcome, prefetched once it is known (pipelined only)."""
        for kind, tma in self.variants:
            reason = tma_rule_out(self.problem, kind) if tma else None
            if reason is not None:  # the dtype or a stride: no config can use TMA
                self._drop((kind, tma), reason)
        order = sorted(batch_sizes)
        spaces = {m: list(space_for(m)) or [singles[m]] for m in order}
        results: dict[int, SearchedPair] = {}
        pipelined = self.options.pipelined

        def chain(i: int, previous: SearchedPair | None) -> Job:
            m = order[i]
            first_tma = pipelined and i == 0
            after = self._prefetch_tma(order, spaces, singles, rankings) if first_tma else None
            found = yield from self._one(
                m, spaces[m], singles[m], list(rankings.get(m, ())), previous, after
            )
            results[m] = found
            if pipelined and confirm is not None:
                wanted = tuple(confirm(found))
                if wanted:
                    yield Start(self._ask_ahead(Ask(m, wanted, "full", 1 + i, prefetch=True)))
            if i + 1 < len(order):
                yield Start(chain(i + 1, found))

        jobs = [chain(0, None)] if order else []
        if pipelined:
            jobs += [
                self._prefetch(i, order, spaces, singles, rankings, tma=False)
                for i in range(len(order))
            ]
        run_jobs(jobs, self.measurer)
        return {m: results[m] for m in batch_sizes}

    def _independent(
        self,
        m: int,
        space: list[Candidate],
        single: Candidate,
        ranking: list[Candidate],
        variant: Variant,
    ) -> list[Probe]:
        """What `variant` times at `m` whatever the batch size below found: the single
        config and the seeds but the previous pair (TMA: those its boxes allow)."""
        kind, tma = variant
        ranking = _seed_ranking(space, single, ranking)
        wanted = [single]
        if variant not in self.fixed:
            wanted += self._seeds(m, space, ranking, None, kind)
        if tma:
            wanted = [c for c in wanted if tma_rule_out(self.problem, kind, c) is None]
        return [Probe(kind, c, tma) for c in dict.fromkeys(wanted)]

    def _prefetch(
        self,
        i: int,
        order: list[int],
        spaces: dict[int, list[Candidate]],
        singles: Mapping[int, Candidate],
        rankings: Mapping[int, Sequence[Candidate]],
        tma: bool,
    ) -> Job:
        m = order[i]
        ranking = list(rankings.get(m, ()))
        probes = [
            p
            for variant in self._live()
            if variant[1] == tma and (not tma or variant in self.supported)
            for p in self._independent(m, spaces[m], singles[m], ranking, variant)
        ]
        if probes:
            yield from self._ask_ahead(Ask(m, tuple(probes), "full", 1 + i, prefetch=True))

    def _prefetch_tma(
        self,
        order: list[int],
        spaces: dict[int, list[Candidate]],
        singles: Mapping[int, Candidate],
        rankings: Mapping[int, Sequence[Candidate]],
    ) -> Job:
        """Once the first batch size has run its TMA variants, prefetch theirs elsewhere."""
        for i in range(1, len(order)):
            yield Start(self._prefetch(i, order, spaces, singles, rankings, tma=True))

    @staticmethod
    def _ask_ahead(ask: Ask) -> Job:
        yield ask

    def _drop(self, variant: Variant, reason: str) -> None:
        if variant in self.dropped:
            return
        kind, tma = variant
        self.dropped[variant] = reason
        self.notes.append(f"{kind} GEMM{' with TMA' if tma else ''} not searched: {reason}")

    def _live(self) -> list[Variant]:
        return [v for v in self.variants if v not in self.dropped]

    def _time(self, m: int, timings: _Timings, wanted: Mapping[Variant, list[Candidate]]) -> Job:
        """Time the untimed of `wanted[variant]` as that variant alone (full fidelity), every
        variant in one ask: they are independent, so asking them together changes no question
        and waits for one answer, not one per variant.

        A TMA variant's first timing runs alone: a device without TMA answers
        ``unsupported`` once, and the variant is dropped for every batch size.
        """
        first: dict[Probe, tuple[Variant, Candidate]] = {}
        rest: dict[Probe, tuple[Variant, Candidate]] = {}
        for variant, candidates in wanted.items():
            if variant in self.dropped:
                continue
            kind, tma = variant
            rows = timings.by_variant.setdefault(variant, {})
            todo = [c for c in dict.fromkeys(candidates) if c not in rows]
            if tma:
                todo = [c for c in todo if tma_rule_out(self.problem, kind, c) is None]
            if tma and variant not in self.supported and todo:
                first[Probe(kind, todo[0], tma)] = (variant, todo[0])
                todo = todo[1:]
            rest.update((Probe(kind, c, tma), (variant, c)) for c in todo)
        for batch in (first, rest):
            batch = {p: vc for p, vc in batch.items() if vc[0] not in self.dropped}
            if not batch:
                continue
            got = (yield Ask(m, tuple(batch), "full", CHAIN_PRIORITY)) or {}
            timings.asked += len(batch)
            for probe, (variant, candidate) in batch.items():
                if variant in self.dropped:
                    continue
                row = got.get(probe)
                if row is not None and row.status == "unsupported" and variant[1]:
                    self._drop(variant, row.error or "unsupported on this device")
                    timings.by_variant.pop(variant, None)
                    continue
                timings.by_variant[variant][candidate] = (
                    row.latency_us if row is not None and row.ok else None
                )
                self.supported.add(variant)

    def _seeds(
        self,
        m: int,
        space: list[Candidate],
        ranking: list[Candidate],
        previous: SearchedPair | None,
        kind: str,
    ) -> list[Candidate]:
        from moetune.tune.search.strategy import nearest_in_space

        opts = self.options
        seeds = list(ranking[: opts.whole_seeds])
        if previous is not None and previous.choice is not None:
            probe = previous.choice.up if kind == "up" else previous.choice.down
            seeds.append(nearest_in_space(probe.candidate, space))
        if opts.model_seeds:
            if (m, kind) not in self._ranked:
                self._ranked[(m, kind)] = rank_for_gemm(self.problem, m, space, self.limits, kind)
            seeds.extend(self._ranked[(m, kind)][: opts.model_seeds])
        return list(dict.fromkeys(seeds))

    def _one(
        self,
        m: int,
        space: list[Candidate],
        single: Candidate,
        ranking: list[Candidate],
        previous: SearchedPair | None,
        after_seeds: Job | None = None,
    ) -> Generator[Ask | Start, Answers | None, SearchedPair]:
        """Steps 1-5 at batch size `m`; `after_seeds` starts once the seeds are timed."""
        opts = self.options
        timings = _Timings()
        ranking = _seed_ranking(space, single, ranking)
        seeds = {
            variant: [single]
            + (
                []
                if variant in self.fixed
                else self._seeds(m, space, ranking, previous, variant[0])
            )
            for variant in self._live()
        }
        yield from self._time(m, timings, seeds)
        if after_seeds is not None:
            yield Start(after_seeds)
        up_ref = timings.by_variant.get(("up", False), {}).get(single)
        down_ref = timings.by_variant.get(("down", False), {}).get(single)
        reference = up_ref + down_ref if up_ref is not None and down_ref is not None else None

        choice = timings.choice()
        seeded = None if choice is None else choice.estimate_us

        def result(stopped: str | None) -> SearchedPair:
            return SearchedPair(m, timings.choice(), reference, stopped, timings.asked, seeded)

        if choice is None:
            return result("no BLOCK_SIZE_M has both GEMMs timed")
        if reference is not None:
            bound = 1.0 - choice.estimate_us * (1.0 - opts.headroom) / reference
            if bound < opts.min_gain:
                return result(f"pair can gain {_pct(bound)} at most, under {_pct(opts.min_gain)}")
        yield from self._climb(m, space, timings)
        choice = timings.choice()
        if choice is None:
            return result("no BLOCK_SIZE_M has both GEMMs timed")
        if reference is not None:
            gain = 1.0 - choice.estimate_us / reference
            if gain < opts.min_gain:
                return result(f"pair gains {_pct(gain)} alone, under {_pct(opts.min_gain)}")
        return result(None)

    def _climb(self, m: int, space: list[Candidate], timings: _Timings) -> Job:
        """Step 4: the one-step climb; where it stalls, one paired round on the chosen pair's
        GEMMs, and the one-step climb again from what that found."""
        members = set(space)
        values = values_by_param(space)

        def one_step(candidate: Candidate) -> list[Candidate]:
            return step_neighbours(candidate, values, members)

        yield from self._step_rounds(m, timings, one_step, self.options.max_climb_rounds)
        stalled = timings.choice()
        if not self.options.paired_steps or stalled is None:
            return

        def paired(candidate: Candidate) -> list[Candidate]:
            return paired_neighbours(candidate, values, members)

        reduction = {"up": self.problem.hidden_size, "down": self.problem.intermediate_size}
        chosen = {
            (probe.kind, probe.use_tma)
            for probe in (stalled.up, stalled.down)
            if reduction[probe.kind] >= self.options.paired_min_reduction
            and (probe.kind, probe.use_tma) not in self.fixed
        }
        if chosen and (yield from self._step_rounds(m, timings, paired, 1, chosen)):
            yield from self._step_rounds(m, timings, one_step, self.options.max_climb_rounds)

    def _step_rounds(
        self,
        m: int,
        timings: _Timings,
        moves: Callable[[Candidate], list[Candidate]],
        rounds: int,
        only: set[Variant] | None = None,
    ) -> Generator[Ask | Start, Answers | None, bool]:
        """Up to `rounds` rounds: each variant (of `only`, if given) times `moves` of its best
        config at the chosen BLOCK_SIZE_M, while the pair improves. True: it improved."""
        improved = False
        for _ in range(rounds):
            choice = timings.choice()
            if choice is None:
                return improved
            asked = timings.asked
            steps = {}
            for variant in self._live():
                if (only is not None and variant not in only) or variant in self.fixed:
                    continue
                at_block_m = [
                    c for c, _ in timings.best(variant) if c.BLOCK_SIZE_M == choice.block_m
                ]
                if at_block_m:
                    steps[variant] = moves(at_block_m[0])
            yield from self._time(m, timings, steps)
            after = timings.choice()
            if timings.asked == asked or after is None or after.estimate_us >= choice.estimate_us:
                return improved
            improved = True
        return improved


def _seed_ranking(
    space: list[Candidate], single: Candidate, ranking: list[Candidate]
) -> list[Candidate]:
    """The whole-call ranking's members of `space` but the single config (which is timed anyway)."""
    members = set(space)
    return [c for c in ranking if c in members and c != single]
