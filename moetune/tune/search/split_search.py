"""The split tune: up and down GEMMs searched apart, the pair confirmed as a whole call.

Runs after the single-config search (whose winner is what vLLM gets), for the
engines that read a down table (`moetune.engines.formats.ENGINE_FORMATS`). The GEMM
variants are the up GEMM without TMA, the down GEMM without and with TMA, and
with ``--up-tma`` the up GEMM with TMA (SGLang PR #33559). A TMA variant the
device cannot run is recorded ``unsupported`` with the reason, and skipped.

``--search fast`` (the default): `moetune.tune.search.split_fast`, a handful of lone
timings per batch size seeded from the whole-call ranking and the cost model,
stopped where a bound shows the pair cannot beat the single config by more
than the noise.

``--search thorough`` / ``exhaustive`` (what every run did before):

1. search each variant over the same pruned space as the single search, with
   fast search (thorough) or every candidate (exhaustive);
2. per batch size, the fastest config of each GEMM per BLOCK_SIZE_M, all at full
   fidelity; a BLOCK_SIZE_M the other GEMM favours but this one never timed gets
   this GEMM's best config moved to it (`_fill_block_ms`);
3. `choose_pair`: the BLOCK_SIZE_M with the smallest up + down.

Then, either way, the pair and the single winner are timed as whole calls in
the same harness at full fidelity; the pair is kept only when strictly faster
(`decide`), and only after it matched the PyTorch reference.

Every timing goes through the `StoreMeasurer`, keyed by its `Probe`: a rerun
reuses them all, and a probe that crashes or hangs its worker is recorded and
skipped like any candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from moetune.errors import TuneError
from moetune.kernel.config import Candidate
from moetune.kernel.probe import Probe
from moetune.tune.measure.worker import WorkUnit
from moetune.tune.search.split import SplitResult, best_per_block_m, choose_pair, decide
from moetune.tune.search.split_fast import FastSplitOptions, SearchedPair
from moetune.tune.store import Measurement


@dataclass(frozen=True)
class SplitOptions:
    up_tma: bool = False  # also search the up GEMM with TMA (read by SGLang since PR #33559)
    down_tma: bool = True
    fast: FastSplitOptions = FastSplitOptions()  # the knobs of --search fast's split search


def variants(options: SplitOptions) -> list[tuple[str, bool]]:
    """The (GEMM, TMA) variants searched, in order."""
    found = [("up", False), ("down", False)]
    if options.down_tma:
        found.append(("down", True))
    if options.up_tma:
        found.append(("up", True))
    return found


def split_plan_lines(options: SplitOptions, search: str = "fast") -> list[str]:
    names = ", ".join(f"{kind}{' TMA' if tma else ''}" for kind, tma in variants(options))
    if search == "fast":
        how = [
            "             seeded from the best whole-call configs; a batch size stops when the",
            f"             pair cannot gain {100 * options.fast.min_gain:g} %; kept if faster than "
            "the single config as a whole call",
        ]
    else:
        how = [
            f"             {search} search per GEMM, best per BLOCK_SIZE_M, smallest up + down;",
            "             kept if faster than the single config as a whole call",
        ]
    return [f"Split:       SGLang up/down tables: GEMMs timed alone ({names}),", *how]


class ProbeMeasurer:
    """A `Measurer` of plain candidates that times them as `kind` probes (TMA or not)."""

    def __init__(self, inner: Any, kind: str, use_tma: bool) -> None:
        self.inner, self.kind, self.use_tma = inner, kind, use_tma
        self.seen: list[Measurement] = []

    def probe(self, candidate: Candidate) -> Probe:
        return Probe(self.kind, candidate, self.use_tma)

    def measure(
        self, batch_size: int, candidates: Sequence[Candidate], fidelity: str
    ) -> dict[Candidate, Measurement]:
        probes = {self.probe(c): c for c in dict.fromkeys(candidates)}
        got = self.inner.measure(batch_size, list(probes), fidelity)
        self.seen.extend(got.values())
        return {probes[p]: m for p, m in got.items()}


def _best_by_block_m(rows: list[Measurement]) -> dict[int, Measurement]:
    """Per BLOCK_SIZE_M the fastest ok row, full fidelity preferred over quick."""
    best: dict[int, Measurement] = {}
    for row in rows:
        if not row.ok:
            continue
        bm = row.candidate.BLOCK_SIZE_M
        current = best.get(bm)
        rank = (row.fidelity != "full", row.latency_us)
        if current is None or rank < (current.fidelity != "full", current.latency_us):
            best[bm] = row
    return best


def _fill_block_ms(
    adapter: ProbeMeasurer, m: int, rows: list[Measurement], wanted: set[int], kept: set
) -> None:
    """Time this GEMM at the BLOCK_SIZE_Ms in `wanted` it has no timing for (its best config moved)."""
    best = _best_by_block_m(rows)
    if not best:
        return
    top = min(best.values(), key=lambda r: r.latency_us).candidate
    extra = [replace(top, BLOCK_SIZE_M=bm) for bm in sorted(wanted - set(best))]
    extra = [c for c in extra if c in kept]
    if extra:
        adapter.measure(m, extra, "full")


def tune_split(
    plan: Any,
    measurer: Any,
    backend: Any,
    singles: dict[int, Candidate],
    notes: list[str],
    options: SplitOptions | None = None,
    search: Callable[..., Any] | None = None,
    rankings: Mapping[int, Sequence[Candidate]] | None = None,
) -> list[SplitResult]:
    """One `SplitResult` per batch size (module docstring).

    `rankings`: per batch size, the whole-call configs fastest first (the fast
    split search's seeds; the single winner's alone when absent).
    """
    options = options or SplitOptions()
    if plan.request.search == "fast":
        searched = _seeded(plan, measurer, singles, rankings or {}, notes, options)
    else:
        searched = _thorough(plan, measurer, singles, notes, options, search)
    return _confirm(plan, measurer, backend, singles, searched, notes)


def _seeded(
    plan: Any,
    measurer: Any,
    singles: dict[int, Candidate],
    rankings: Mapping[int, Sequence[Candidate]],
    notes: list[str],
    options: SplitOptions,
) -> dict[int, SearchedPair]:
    from moetune.tune.search.split_fast import SeededSplitSearch

    search = SeededSplitSearch(
        measurer, plan.problem, plan.limits, variants(options), options.fast, notes
    )
    batch_sizes = list(plan.request.batch_sizes)

    def confirmed(found: SearchedPair) -> list[Probe]:
        """What `_confirm` times for `found`: the pair and the single config, as whole calls."""
        if found.stopped is not None or found.choice is None:
            return []
        return [Probe.single(singles[found.batch_size]), found.choice.pair()]

    return search.run(
        batch_sizes, lambda m: list(plan.pruning[m].kept), singles, rankings, confirmed
    )


def _thorough(
    plan: Any,
    measurer: Any,
    singles: dict[int, Candidate],
    notes: list[str],
    options: SplitOptions,
    search: Callable[..., Any] | None,
) -> dict[int, SearchedPair]:
    """Steps 1-3 of the thorough search (module docstring)."""
    from moetune.tune.search.strategy import exhaustive_search, fast_search, search_options

    request, problem = plan.request, plan.problem
    batch_sizes = list(request.batch_sizes)

    def space_for(m: int) -> list[Candidate]:
        return list(plan.pruning[m].kept)

    adapters: dict[tuple[str, bool], ProbeMeasurer] = {}
    for kind, tma in variants(options):
        adapter = ProbeMeasurer(measurer, kind, tma)
        if tma:
            first = space_for(batch_sizes[0])[0]
            probe_row = adapter.measure(batch_sizes[0], [first], "quick")[first]
            if probe_row.status == "unsupported":
                notes.append(f"{kind} GEMM with TMA not searched: {probe_row.error}")
                continue
        try:
            if request.search == "exhaustive":
                exhaustive_search(batch_sizes, space_for, adapter)
            else:
                (search or fast_search)(
                    batch_sizes,
                    space_for,
                    adapter,
                    problem,
                    plan.limits,
                    search_options(request.search),
                )
        except TuneError as exc:
            notes.append(f"{kind} GEMM{' with TMA' if tma else ''} search gave up: {exc}")
        adapters[(kind, tma)] = adapter

    searched: dict[int, SearchedPair] = {}
    for m in batch_sizes:
        kept = set(space_for(m))
        rows = {key: [r for r in a.seen if r.batch_size == m] for key, a in adapters.items()}
        favoured = {r.candidate.BLOCK_SIZE_M for key in rows for r in _top(rows[key], 2)}
        for key, adapter in adapters.items():
            _fill_block_ms(adapter, m, rows[key], favoured, kept)
        timings: dict[str, list[tuple[Probe, float]]] = {"up": [], "down": []}
        for (kind, _tma), adapter in adapters.items():
            for row in _best_by_block_m([r for r in adapter.seen if r.batch_size == m]).values():
                probe = adapter.probe(row.candidate)
                if row.fidelity != "full":
                    row = adapter.inner.measure(m, [probe], "full")[probe]
                    if not row.ok:
                        continue
                timings[kind].append((probe, row.latency_us))
        choice = choose_pair(best_per_block_m(timings["up"]), best_per_block_m(timings["down"]))
        searched[m] = SearchedPair(m, choice, None)
    return searched


def _confirm(
    plan: Any,
    measurer: Any,
    backend: Any,
    singles: dict[int, Candidate],
    searched: dict[int, SearchedPair],
    notes: list[str],
) -> list[SplitResult]:
    """Time each pair the search kept against the single config as whole calls; verify winners."""
    batch_sizes = list(plan.request.batch_sizes)
    confirm = {
        m: searched[m].choice.pair()
        if searched[m].stopped is None and searched[m].choice is not None
        else None
        for m in batch_sizes
    }
    verdicts: dict[int, tuple[float | None, float | None]] = {}
    for m in batch_sizes:
        pair = confirm[m]
        if searched[m].stopped is not None:
            verdicts[m] = (None, None)  # nothing to confirm: the single config is written
            continue
        single = Probe.single(singles[m])
        wanted = [single] + ([pair] if pair is not None else [])
        got = measurer.measure(m, wanted, "full")
        single_us = got[single].latency_us if got[single].ok else None
        pair_us = got[pair].latency_us if pair is not None and got[pair].ok else None
        if pair is not None and not got[pair].ok:
            notes.append(
                f"M={m}: split pair {pair.short()} failed as a whole call "
                f"({got[pair].status}: {got[pair].error})"
            )
        verdicts[m] = (pair_us, single_us)

    candidates = {
        m: pair
        for m, pair in confirm.items()
        if pair is not None and pair != Probe.single(singles[m]) and decide(*verdicts[m])
    }
    checked = _verify(backend, plan.problem, candidates, notes)
    results: list[SplitResult] = []
    for m in batch_sizes:
        pair_us, single_us = verdicts[m]
        found = searched[m]
        results.append(
            SplitResult(
                m,
                singles[m],
                single_us,
                found.choice,
                pair_us,
                m in checked,
                checked.get(m),
                stopped=found.stopped,
                reference_us=found.reference_us,
                seeded_us=found.seeded_us,
            )
        )
    return results


def _top(rows: list[Measurement], count: int) -> list[Measurement]:
    ok = sorted((r for r in rows if r.ok), key=lambda r: (r.fidelity != "full", r.latency_us))
    return ok[:count]


def _verify(
    backend: Any, problem: Any, pairs: dict[int, Probe], notes: list[str]
) -> dict[int, float | None]:
    """The batch sizes whose pair matches the PyTorch reference, with its relative RMS error."""
    if not pairs:
        return {}
    units = [WorkUnit(problem, m, (pair,), "verify") for m, pair in pairs.items()]
    passed: dict[int, float | None] = {}
    for unit, outcome in backend.run(units):
        if outcome.status == "ok":
            passed[unit.batch_size] = outcome.rel_rms
        else:
            notes.append(
                f"M={unit.batch_size}: split pair {pairs[unit.batch_size].short()} rejected "
                f"({outcome.status}: {outcome.error}); the single config is written"
            )
    return passed
