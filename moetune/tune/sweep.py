"""A layout sweep: many (TP, EP, dtype) layouts of one model, each distinct per-rank shape tuned once.

`moetune tune --tp 1,2,4 --dtype bf16,fp8_w8a8` asks for six layouts. Each is
sharded (`moetune.extract.layouts`); layouts whose rank runs the same kernel
problem (E, N, K, top-k, dtype, block shape) share one `TunePlan`, so that
problem is searched once and its files serve all of them. Layouts the engines
cannot split are listed with the reason and skipped; only a sweep with no
valid layout at all is an error.

All plans share one results store (``<save-dir>/measurements.jsonl``): the
store keys every measurement by its problem, so shapes never mix, and a rerun
of the same command resumes each shape where it stopped.

`plan_sweep` is pure (plans only); `run_sweep` runs the plans in sequence and
turns Ctrl-C / SIGTERM into `moetune.errors.Interrupted`, whose one line says
how many measurements are saved and where.

Time estimate (`estimate`): every stage the run goes through, at rates measured
on one H200 (16 CPU cores, 14 compile processes, 18 batch sizes); on the default
commands of bench/results/2026-12-04-paired-climb (cold Triton caches) it came
within -0 % to +4 % of the wall time (-1 % to +26 % in the day's first run,
bench/results/2026-12-04-default-tunes):

- start-up, once a run (`STARTUP_S`): the command's imports and plan, the worker
  processes loading torch, Triton and CUDA, the first compiles (the first timing came
  11.6-13.9 s after the start);
- whole-call search (fast, and a transfer): the searches of every batch size run
  side by side (`moetune.tune.search.strategy`), so the 14 compile processes and
  the GPU's timer work together and a search takes the longer of its compiling
  over the processes and its timings on the timer, times a tail factor for the
  rounds that wait on a last slow compile. Fast search times about 10 % of the
  pruned (candidate, M) pairs since it climbs from two starts (replayed on the
  recorded stores: 1,800 of 19,072 on DeepSeek-V3 TP8, 1,889 of 17,984 on
  Qwen3-235B TP8), ``--search thorough`` (three starts) about 12 %; a transfer
  (a second kernel's plan of the same problem, seeded from the first one's
  results) about 40 timings per batch size whatever the space (39-55 in the
  2026-12-04 H200 tunes). Compiling costs CPU seconds per whole-call timing by
  kernel dtype (`COMPILE_S_PER_TIMING`, the median over the recorded H200 searches
  of each, bench/compile_rates.py: bf16 0.36 over 21 searches, fp8 block 0.56, fp8
  per channel 0.71, int8 0.54; int8 w8a16, never recorded, runs in fused_moe_kernel
  and is priced as int8 w8a8); the timer takes about 0.02 s a timing (the median
  gap between a search's rows, 0.015-0.026 s). The tail factors are the measured
  search stages over that bound (2026-12-04, start-up taken out: bf16 0.9-1.2,
  fp8 block 1.0; transfers, replayed, 1.1-1.5). Exhaustive search keeps its
  sequential rate, about 0.06 s per timing (Qwen3-30B TP1: 136 s for 2,113
  timings, bench/results/tune-h200.md);
- baselines: each engine's fallback config and the file it loads today, one
  whole-call timing per batch size each, at 0.06 s (they are timed alongside the
  search, so most of this is spent inside it);
- split search (engines that read a down table, `moetune.tune.search.split_search`):
  0.035 s per lone-GEMM timing and 0.043 s per whole call with split configs (the
  pair confirmations), the rates of the three 2026-12-04 default tunes (2,555 and 108
  of them, bench/split_rates.py), its waits included: the batch sizes run side by side
  and each round asks every GEMM variant at once, so the stage is bound by the timer.
  ``--search fast`` times about 17 lone GEMMs per GEMM variant per batch size: 14.6-16.7
  in those tunes, before the climb's paired round (`FastSplitOptions.paired_steps`);
  15.4-16.9 with it, replayed on their stores over each plan's space
  (bench/results/2026-12-04-paired-climb). ``--search thorough`` times each variant
  about 0.8 times as often as the whole search timed whole calls (0.95 on the int8_w8a8
  store, 0.62 on GLM-4.5-Air TP4: 4,217 lone rows for 2,279 whole ones over three
  variants);
  exhaustive times every pruned pair per variant;
- fixed, per plan (`SECONDS_PER_PLAN`): the check against the reference, ceilings,
  files (0.6-3.2 s measured);
- long calls: those rates hold while one call is shorter than a replay
  (`moetune.tune.measure.timing.TARGET_REPLAY_US`, 2 ms: the graph then holds several
  calls). A longer call (a large M on a large shape) is replayed alone, so a
  timing at that M takes at least its calls: the compile call, the sizing call and
  the full fidelity's warm-up and timed replays (25 in all), each about 2x the
  roofline floor at the H200's measured ceilings (the median whole call of the
  recorded Qwen3-30B search at M = 4096 took 786 us over a 400 us floor,
  examples/h200-2026-12-01). No default batch size of a released model is long
  enough for that; M = 1,048,576 on Qwen3-30B is (about 5 s a timing).

It is an estimate for an H200-class machine: fewer CPU cores compile slower,
and a search that needs more rounds takes longer.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from moetune.dtypes import QuantChoice, quant_details
from moetune.dtypes import compile_family as dtype_compile_family
from moetune.engines.launch import KernelRef, kernel_for
from moetune.errors import Interrupted, MoetuneError, Terminated, TuneError
from moetune.extract.layouts import Layout, LayoutShard, ResolvedLayouts, SkippedLayout
from moetune.fileio import open_input
from moetune.tune.measure.measurer import Backend
from moetune.tune.output import skipped_engines
from moetune.tune.problem import TuneProblem
from moetune.tune.request import UNIFORM_ROUTING, SweepRequest
from moetune.tune.runner import (
    TunePlan,
    TuneRequest,
    TuneSummary,
    kernel_label,
    make_backend,
    make_plan,
    plan_json,
    plan_lines,
    summary_json,
)
from moetune.tune.signals import STOP_SIGNALS

# See the module docstring for where these come from.
SECONDS_PER_TIMED = 0.06  # one whole-call timing, one after another (baselines, exhaustive)
STARTUP_S = 15.0  # once a run: the command starts, its workers load torch, Triton and CUDA
SECONDS_PER_PLAN = 4.0  # each plan: the check against the reference, ceilings, files
FAST_SEARCH_SHARE = 0.10  # of the pruned pairs, timed by the whole-call fast search
THOROUGH_SEARCH_SHARE = 0.12  # ... by ``--search thorough`` (the climb from three starts)
# Whole-call searches run their batch sizes side by side: compile processes and the timer.
H200_COMPILE_WORKERS = 14  # 16 cores, less the timer and the main process
TIMER_S_PER_TIMING = 0.02  # the timer's seconds per whole-call timing
# CPU seconds of compiling per whole-call timing, by kernel dtype family (`compile_family`:
# quant_rules.yaml's ``kernels:`` rows name theirs; int8_w8a16, unrecorded, runs in
# fused_moe_kernel and is priced as int8_w8a8). wna16: the current int4 kernel's store
# (kernel_rev=2); the first revision took 2.5.
COMPILE_S_PER_TIMING = {
    "bf16": 0.36,
    "fp8": 0.34,
    "fp8_block": 0.56,
    "fp8_channel": 0.71,
    "int8_w8a8": 0.54,
    "wna16": 0.83,
}
SEARCH_TAIL = {"fast": 1.1, "fp8_block": 1.05, "transfer": 1.5}  # wall over the bound
TRANSFER_PER_BATCH = 40  # whole-call timings per batch size of a transfer search
SECONDS_PER_LONE = 0.035  # one lone-GEMM timing of the split search, its waits included
SECONDS_PER_PAIR = 0.043  # one whole call with split configs (pair or single, confirming)
FAST_SPLIT_LONE = 17  # lone timings per GEMM variant and batch size, --search fast
THOROUGH_SPLIT_SHARE = 0.8  # lone timings per GEMM variant / whole-search timings, thorough
BASELINES_PER_ENGINE = 2  # its fallback config and the file it would load today
CALL_OVER_FLOOR = 2.0  # a searched call's time over its roofline floor (module docstring)
# The H200's ceilings the long-call time is priced at: the HBM spec, and the matmul peaks
# measured there (bf16 769 TFLOP/s, BENCHMARKS.md; fp8 1394-1440 and int8 932-950).
H200_READ_BYTES_PER_S = 4.8e12
H200_PEAK_FLOPS = {"bf16": 7.7e14, "fp8": 1.4e15, "int8": 9.4e14}
ESTIMATE_NOTE = (
    "an estimate from the H200 rates of BENCHMARKS.md's Tune time and the runs it cites; "
    "other machines differ"
)


def problem_of(shard: LayoutShard, quant: QuantChoice | None = None) -> TuneProblem:
    """The kernel problem one rank of this layout runs (`quant`: the user's group size or
    per-channel scales over the checkpoint's quantization)."""
    kernel = shard.kernel_dtype
    dtype = kernel.name
    return TuneProblem.from_sharded(shard.sharded, dtype, **quant_details(kernel, dtype, quant))


@dataclass(frozen=True)
class ShapeGroup:
    """One distinct per-rank problem and the layouts that run it."""

    problem: TuneProblem
    layouts: tuple[Layout, ...]
    notes: tuple[str, ...] = ()

    def labels(self) -> list[str]:
        return [layout.label() for layout in self.layouts]


def group_layouts(
    shards: Sequence[LayoutShard], quant: QuantChoice | None = None
) -> list[ShapeGroup]:
    """Layouts grouped by their problem, in the order each problem first appears."""
    groups: dict[TuneProblem, list[LayoutShard]] = {}
    for shard in shards:
        groups.setdefault(problem_of(shard, quant), []).append(shard)
    return [
        ShapeGroup(
            problem,
            tuple(s.layout for s in members),
            tuple(dict.fromkeys(note for s in members for note in s.notes)),
        )
        for problem, members in groups.items()
    ]


@dataclass(frozen=True)
class Estimate:
    """Expected wall time of one plan, and what it is made of."""

    seconds: float
    pairs: int  # (candidate, batch size) pairs left after pruning
    timed: int  # whole-call timings the search is expected to take
    split: bool = False  # an SGLang split search runs (its share is in `seconds`)
    lone: int = 0  # lone-GEMM timings the split search is expected to take
    stages: tuple[tuple[str, float], ...] = ()  # (stage, seconds), in the order they run
    # Batch size -> least seconds of one timing there, where its calls outlast the rates.
    long_timing_s: Mapping[int, float] = field(default_factory=dict)
    # Seconds of the search stage each of its whole-call timings stands for (progress bar).
    search_rate: float = SECONDS_PER_TIMED

    def stage_seconds(self, name: str) -> float:
        return dict(self.stages).get(name, 0.0)

    def timing_seconds(self, rate: float, batch_size: int | None = None) -> float:
        """Seconds of one timing at `rate` and `batch_size` (its calls' time where longer)."""
        return max(rate, self.long_timing_s.get(batch_size, 0.0)) if batch_size else rate


def long_timing_seconds(problem: TuneProblem, batch_size: int) -> float:
    """Least seconds of one whole-call timing at `batch_size` on an H200: its calls' time."""
    from moetune.roofline import moe_roofline, peak_kind
    from moetune.tune.measure.timing import FIDELITIES

    full = FIDELITIES["full"]
    calls = 2 + full.warmup + full.replays  # compile, size the graph, then one call a replay
    roof = moe_roofline(
        batch_size,
        problem.num_experts,
        problem.intermediate_size,
        problem.hidden_size,
        problem.top_k,
        problem.dtype,
        problem.engine_block_shape,
        per_channel=problem.per_channel,
    )
    peak = H200_PEAK_FLOPS[peak_kind(problem.dtype)]
    return calls * CALL_OVER_FLOOR * roof.floor_seconds(H200_READ_BYTES_PER_S, peak)


def compile_family(problem: TuneProblem) -> str:
    """The kernel dtype family whose compile rate prices `problem` (`COMPILE_S_PER_TIMING`):
    its quant_rules.yaml ``kernels:`` row's ``compile_family`` (`moetune.dtypes.compile_family`)."""
    return dtype_compile_family(
        problem.dtype, block_shape=problem.block_shape, per_channel=problem.per_channel
    )


def search_seconds(
    problem: TuneProblem, timed_per_m: Mapping[int, float], long: Mapping[int, float], tail: float
) -> float:
    """A whole-call search's wall on an H200: compiling over the compile processes or timing on
    the timer, whichever is longer (a long call's timing takes its calls' time), times `tail`."""
    family = compile_family(problem)
    compiling = sum(timed_per_m.values()) * COMPILE_S_PER_TIMING[family] / H200_COMPILE_WORKERS
    timing = sum(n * max(TIMER_S_PER_TIMING, long.get(m, 0.0)) for m, n in timed_per_m.items())
    return tail * max(compiling, timing)


def split_variant_count(plan: TunePlan) -> int:
    """The GEMM variants the split search times (TMA ones the shape rules out left out)."""
    from moetune.tune.search.split_fast import tma_rule_out
    from moetune.tune.search.split_search import SplitOptions, variants

    found = variants(SplitOptions(up_tma=plan.request.up_tma))
    return sum(1 for kind, tma in found if not tma or tma_rule_out(plan.problem, kind) is None)


def search_share(search: str) -> float:
    """The share of the pruned (candidate, batch size) pairs a whole-call search times."""
    return {"exhaustive": 1.0, "thorough": THOROUGH_SEARCH_SHARE}.get(search, FAST_SEARCH_SHARE)


def estimate(plan: TunePlan, *, first: bool = True) -> Estimate:
    """Expected wall time of one plan on an H200-class machine (module docstring); `first`:
    the run's first plan, which pays the start-up of the worker processes."""
    from moetune.tune.search.split import split_engines

    request = plan.request
    batch_sizes = len(request.batch_sizes)
    kept = {m: len(report.kept) for m, report in plan.pruning.items()}
    pairs = sum(kept.values())
    exhaustive = request.search == "exhaustive"
    share = search_share(request.search)
    timed_per_m = {m: share * count for m, count in kept.items()}
    if plan.seeded_from is not None:  # a transfer: about as many timings per batch size
        timed_per_m = {m: min(TRANSFER_PER_BATCH, count) for m, count in kept.items()}
        timed = sum(timed_per_m.values())
    else:
        timed = math.ceil(pairs * share)  # exhaustive: every pair (share 1)
    baselines = BASELINES_PER_ENGINE * len(request.engines) * batch_sizes
    split = bool(split_engines(request.engines))
    lone = confirms = 0
    lone_per_m: dict[int, float] = {}
    if split:
        gemms = split_variant_count(plan)
        if exhaustive:
            lone = pairs * gemms
            lone_per_m = {m: kept.get(m, 0) * gemms for m in request.batch_sizes}
        elif request.search == "thorough":
            lone = math.ceil(THOROUGH_SPLIT_SHARE * timed * gemms)
            lone_per_m = {
                m: THOROUGH_SPLIT_SHARE * share * kept.get(m, 0) * gemms
                for m in request.batch_sizes
            }
        else:
            lone = FAST_SPLIT_LONE * gemms * batch_sizes
            lone_per_m = dict.fromkeys(request.batch_sizes, FAST_SPLIT_LONE * gemms)
        confirms = 2 * batch_sizes  # the pair and the single config, as whole calls
    # Where a batch size's calls outlast the rates, its timings take their calls' time.
    long = {m: long_timing_seconds(plan.problem, m) for m in request.batch_sizes}

    def beyond(rate: float, count: Callable[[int], float]) -> float:
        return sum(count(m) * max(0.0, long[m] - rate) for m in request.batch_sizes)

    per_engine = BASELINES_PER_ENGINE * len(request.engines)
    if exhaustive:
        search_s = SECONDS_PER_TIMED * timed + beyond(
            SECONDS_PER_TIMED, lambda m: timed_per_m.get(m, 0)
        )
    else:
        if plan.seeded_from is not None:
            tail = SEARCH_TAIL["transfer"]
        else:
            tail = SEARCH_TAIL.get(compile_family(plan.problem), SEARCH_TAIL["fast"])
        search_s = search_seconds(plan.problem, timed_per_m, long, tail)
    stages = (
        ("start-up", STARTUP_S if first else 0.0),
        ("search", search_s),
        (
            "baselines",
            SECONDS_PER_TIMED * baselines + beyond(SECONDS_PER_TIMED, lambda m: per_engine),
        ),
        (
            "split",
            SECONDS_PER_LONE * lone
            + SECONDS_PER_PAIR * confirms
            + (
                beyond(SECONDS_PER_LONE, lambda m: lone_per_m.get(m, 0))
                + beyond(SECONDS_PER_PAIR, lambda m: 2)
                if split
                else 0.0
            ),
        ),
        ("fixed", SECONDS_PER_PLAN),
    )
    seconds = sum(value for _, value in stages)
    rate = search_s / timed if timed else SECONDS_PER_TIMED
    return Estimate(seconds, pairs, timed, split, lone, stages, long, rate)


STAGE_LABELS = {
    "start-up": "start-up",
    "search": "search",
    "baselines": "baselines",
    "split": "split",
    "fixed": "checks/files",
}


def _estimate_line(est: Estimate | None, seconds: float, suffix: str = "") -> str:
    """The plan's estimate line; with `est`, its stages (those that take time) summed."""
    parts = ""
    if est is not None:
        shown = [
            f"{STAGE_LABELS[name]} {format_duration(value) if value >= 0.5 else '<1 s'}"
            for name, value in est.stages
            if value
        ]
        parts = " = " + " + ".join(shown)
    return f"Estimate:    ~{format_duration(seconds)}{suffix}{parts} ({ESTIMATE_NOTE})"


@dataclass(frozen=True)
class SweepPlan:
    model: str
    source: str  # where the config came from
    layouts: tuple[Layout, ...]  # as asked, in order
    groups: tuple[ShapeGroup, ...]
    plans: tuple[TunePlan, ...]  # one per group, same order
    skipped: tuple[SkippedLayout, ...]
    is_sweep: bool  # the command line gave a list (the output is the sweep's)

    @property
    def store_path(self) -> Path:
        return self.plans[0].store_path

    def estimates(self) -> list[Estimate]:
        """Each plan's estimate; the first pays the run's start-up (one worker pool serves all)."""
        return [estimate(plan, first=index == 0) for index, plan in enumerate(self.plans)]

    def estimate_s(self) -> float:
        return sum(e.seconds for e in self.estimates())

    def shape_numbers(self) -> list[int]:
        """Each plan's shape, numbered from 1: the plans of one shape on several kernels
        share a number."""
        numbers: dict[str, int] = {}
        return [numbers.setdefault(group.problem.key(), len(numbers) + 1) for group in self.groups]

    def plan_tag(self, index: int) -> str:
        """Plan `index`'s short name, e.g. ``shape 2/3``, or ``shape 2/3 (SGLang)`` where a
        shape has a plan per kernel (each engine's file on its own kernel)."""
        from moetune.engines.launch import ENGINE_LABELS

        numbers = self.shape_numbers()
        tag = f"shape {numbers[index]}/{max(numbers)}"
        if len(set(numbers)) < len(numbers):
            engines = self.plans[index].request.engines
            tag += f" ({'/'.join(ENGINE_LABELS[e] for e in engines)})"
        return tag

    def shape_of(self, layout: Layout) -> int | None:
        """Index of the group serving `layout`, None if it was skipped."""
        for index, group in enumerate(self.groups):
            if layout in group.layouts:
                return index
        return None


def plan_sweep(request: SweepRequest, resolved: ResolvedLayouts) -> SweepPlan:
    """One `TunePlan` per distinct problem of `request`'s layouts, as `resolved` shards them.

    The request's routing dump completes each shape's problem; a shape it
    refuses (a `MoetuneError`) is skipped with the reason. A layout whose files
    would overwrite another shape's files (bf16 and fp16 share the engines' file
    names), or whose kernel the tuner cannot time (GPTQ int4...), is skipped,
    with the reason. A single layout that fails raises its own error.
    `request.kernels` maps each engine to the kernel its file is timed on (None or
    absent: moetune's twin); engines on different kernels get one plan each, run in
    order; with ``search="fast"`` each plan after the first is seeded from the
    first one's results (a transfer search, `TunePlan.seeded_from`).
    """
    adapt = _routing_adapter(request.routing)
    is_sweep = request.is_sweep
    layouts = list(resolved.layouts or request.layouts)  # as resolved: dtype auto named, each once
    skipped = list(resolved.skipped)
    shards = []
    for shard in resolved.shards:
        refusal = shard.kernel_dtype.tune_refusal()  # a kernel the tuner cannot time
        if refusal:
            skipped.append(SkippedLayout(shard.layout, refusal))
        else:
            shards.append(shard)
    groups: list[ShapeGroup] = []
    plans: list[TunePlan] = []
    owners: dict[Path, ShapeGroup] = {}
    for group in group_layouts(shards, request.quant):
        if adapt is not None:
            try:
                group = replace(group, problem=adapt(group.problem))
            except MoetuneError as exc:
                skipped.extend(SkippedLayout(layout, str(exc)) for layout in group.layouts)
                continue
        labels = ", ".join(group.labels())
        # A sweep names the config source once, above the shapes.
        source = labels if is_sweep else f"{resolved.loaded.description}, {labels}"
        refused = skipped_engines(group.problem)  # e.g. vLLM has no int8_w8a8 file name
        asked = request.engines
        engines = tuple(e for e in asked if e not in refused)
        if not engines:
            reason = refused[asked[0]]
            skipped.extend(SkippedLayout(layout, reason) for layout in group.layouts)
            continue
        if refused:
            notes = tuple(refused[e] for e in asked if e in refused)
            group = replace(group, notes=group.notes + notes)
        group_plans = [
            make_plan(
                plan_request(request, replace(group.problem, kernel=kernel), source, on_kernel),
                request.limits,
            )
            for kernel, on_kernel in _by_kernel(engines, request.kernels, group.problem.dtype)
        ]
        if request.search == "fast":
            # The same problem on another kernel: searched from the first kernel's results.
            first = group_plans[0].problem
            group_plans[1:] = [replace(plan, seeded_from=first) for plan in group_plans[1:]]
        files = [path for plan in group_plans for path in plan.files]
        clash = next((owners[path] for path in files if path in owners), None)
        if clash is not None:
            skipped.extend(
                SkippedLayout(
                    layout,
                    f"its files have the same names as {clash.labels()[0]}'s "
                    f"({clash.problem.shape_key()}); tune it with another --save-dir",
                )
                for layout in group.layouts
            )
            continue
        owners.update(dict.fromkeys(files, group))
        for plan in group_plans:
            groups.append(group)
            plans.append(plan)
    if not plans:
        if not is_sweep and len(skipped) == 1:
            raise TuneError(skipped[0].reason)  # one layout: its own error, as before sweeps
        reasons = "; ".join(f"{s.layout.label()}: {s.reason}" for s in skipped)
        raise TuneError(f"no layout can be tuned: {reasons}")
    order = {layout: index for index, layout in enumerate(layouts)}
    skipped.sort(key=lambda s: order.get(s.layout, len(order)))
    return SweepPlan(
        model=request.model,
        source=resolved.loaded.description,
        layouts=tuple(layouts),
        groups=tuple(groups),
        plans=tuple(plans),
        skipped=tuple(skipped),
        is_sweep=is_sweep,
    )


# The fields of one plan's `TuneRequest` that a `SweepRequest` holds for every plan.
_CARRIED = tuple(
    f.name for f in fields(TuneRequest) if f.name not in ("problem", "source", "engines")
)


def plan_request(
    request: SweepRequest, problem: TuneProblem, source: str, engines: tuple[str, ...]
) -> TuneRequest:
    """One plan's `TuneRequest`: `problem` on `engines`, the rest as `request` asks."""
    carried = {name: getattr(request, name) for name in _CARRIED}
    return TuneRequest(problem=problem, source=source, engines=engines, **carried)


def _routing_adapter(routing: str) -> Callable[[TuneProblem], TuneProblem] | None:
    """None for uniform routing; else the function giving each shape the dump to replay."""
    if routing == UNIFORM_ROUTING:
        return None
    from moetune.tune.measure.routing_dump import with_routing

    return lambda problem: with_routing(problem, routing)


def _by_kernel(
    engines: Sequence[str], kernels: Mapping[str, KernelRef | None], dtype: str
) -> list[tuple[KernelRef | None, tuple[str, ...]]]:
    """The engines grouped by the kernel their `dtype` files are timed on, in `engines`' order."""
    grouped: dict[KernelRef | None, list[str]] = {}
    for engine in engines:
        grouped.setdefault(kernel_for(kernels.get(engine), dtype), []).append(engine)
    return [(kernel, tuple(names)) for kernel, names in grouped.items()]


def format_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def sweep_lines(sweep: SweepPlan, compare: Callable[[TunePlan], str] | None = None) -> list[str]:
    """The plan as printed before any work (a single layout: the plain plan plus two lines).

    `compare(plan)` names the baselines a plan will time (its ``Compare:`` line).
    """
    estimates = sweep.estimates()

    def compare_lines(plan: TunePlan) -> list[str]:
        return [f"Compare:     {compare(plan)}"] if compare is not None else []

    if not sweep.is_sweep:  # one layout: its plan, or one per kernel timed
        lines: list[str] = []
        for plan, est in zip(sweep.plans, estimates, strict=True):
            lines += ([""] if lines else []) + plan_lines(plan)
            lines.append(_estimate_line(est, est.seconds))
            lines += compare_lines(plan)
        if len(sweep.plans) > 1:  # one per kernel: they run one after another
            lines += ["", _estimate_line(None, sweep.estimate_s(), " in all")]
        return lines
    reason = {s.layout: s.reason for s in sweep.skipped}
    width = max(len(layout.label()) for layout in sweep.layouts)
    # A shape timed on two kernels (each engine's file on its own) has a plan per kernel.
    numbers = sweep.shape_numbers()
    shapes = len(set(numbers))
    per_kernel = (
        f" ({len(sweep.plans)} plans: one per kernel timed)" if shapes < len(numbers) else ""
    )
    lines = [
        f"Model:       {sweep.model}  ({sweep.source})",
        f"Layouts:     {len(sweep.layouts)} asked, {len(sweep.layouts) - len(sweep.skipped)} "
        f"valid, {shapes} distinct per-rank shape(s) to tune{per_kernel}, "
        f"{len(sweep.skipped)} skipped",
    ]
    for layout in sweep.layouts:
        index = sweep.shape_of(layout)
        if index is None:
            lines.append(f"  {layout.label():<{width}}  skipped: {reason[layout]}")
        else:
            key = sweep.groups[index].problem.shape_key()
            lines.append(f"  {layout.label():<{width}}  -> shape {numbers[index]}: {key}")
    lines.append(_estimate_line(None, sweep.estimate_s(), " in all"))
    lines.append(f"Results:     {sweep.store_path} (one resumable store for every shape)")
    for index, (group, plan, est) in enumerate(
        zip(sweep.groups, sweep.plans, estimates, strict=True)
    ):
        on = f" on {kernel_label(plan.problem)}" if per_kernel else ""
        lines.append("")
        lines.append(
            f"Shape {numbers[index]}/{shapes}{on}: serves {', '.join(group.labels())}; "
            f"~{format_duration(est.seconds)} ({est.pairs} pruned pairs, ~{est.timed} timed)"
        )
        lines.extend(f"  {line}" for line in plan_lines(plan) if not line.startswith("Results:"))
        lines.extend(f"  {line}" for line in compare_lines(plan))
    return lines


def _layout_json(layout: Layout) -> dict[str, Any]:
    return {
        "layout": layout.label(),
        "tp": layout.tp,
        "ep": layout.ep,
        "ep_size": layout.ep_size,
        "dtype": layout.dtype,
    }


def _shape_extra(sweep: SweepPlan, index: int, est: Estimate) -> dict[str, Any]:
    return {
        "layouts": sweep.groups[index].labels(),
        "estimate_s": round(est.seconds, 1),
        "estimate_pairs": est.pairs,
        "estimate_timed": est.timed,
        "estimate_stages_s": {name: round(value, 1) for name, value in est.stages},
        "estimate_lone": est.lone,
    }


def sweep_json(sweep: SweepPlan) -> dict[str, Any]:
    """A single layout: the plan's JSON plus its layouts and estimate; a sweep: every shape."""
    estimates = sweep.estimates()  # once: each plan's, the first with the run's start-up
    if not sweep.is_sweep and len(sweep.plans) == 1:
        return {**plan_json(sweep.plans[0]), **_shape_extra(sweep, 0, estimates[0])}
    reason = {s.layout: s.reason for s in sweep.skipped}
    layouts = []
    for layout in sweep.layouts:
        index = sweep.shape_of(layout)
        layouts.append(
            {
                **_layout_json(layout),
                "shape": None if index is None else sweep.groups[index].problem.shape_key(),
                "skipped": reason.get(layout),
            }
        )
    return {
        "model": sweep.model,
        "config_source": sweep.source,
        "layouts": layouts,
        "store": str(sweep.store_path),
        "estimate_s": round(sum(est.seconds for est in estimates), 1),
        "estimate_note": ESTIMATE_NOTE,
        "shapes": [
            {**plan_json(plan), **_shape_extra(sweep, index, est)}
            for index, (plan, est) in enumerate(zip(sweep.plans, estimates, strict=True))
        ],
    }


@dataclass
class SweepSummary:
    sweep: SweepPlan
    summaries: list[TuneSummary] = field(default_factory=list)

    def served(self) -> list[tuple[Path, list[str]]]:
        """Every written file and the layouts it serves."""
        return [
            (path, group.labels())
            for group, summary in zip(self.sweep.groups, self.summaries, strict=False)
            for path in summary.files
        ]


def sweep_summary_json(result: SweepSummary) -> dict[str, Any]:
    sweep = result.sweep
    if not sweep.is_sweep and len(result.summaries) == 1:
        return {**summary_json(result.summaries[0]), "layouts": sweep.groups[0].labels()}
    plan = sweep_json(sweep)
    return {
        "model": sweep.model,
        "layouts": plan["layouts"],
        "store": plan["store"],
        "wall_s": round(sum(s.wall_s for s in result.summaries), 3),
        "measured": sum(s.measured for s in result.summaries),
        "reused": sum(s.reused for s in result.summaries),
        "shapes": [
            {**summary_json(summary), "layouts": sweep.groups[index].labels()}
            for index, summary in enumerate(result.summaries)
        ],
        "files": [{"path": str(path), "layouts": labels} for path, labels in result.served()],
    }


def _count_lines(path: Path) -> int:
    """Lines in the store; 0 when it cannot be read (no FIFO read: the store refuses it)."""
    try:
        with open_input(path, limit=None) as handle:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
    except OSError:
        return 0


def run_sweep(
    sweep: SweepPlan,
    run_one: Callable[[int, TunePlan, Backend], TuneSummary],
    backend: Backend | None = None,
) -> SweepSummary:
    """Run every plan in order with `run_one(index, plan, backend)`; Ctrl-C/SIGTERM -> `Interrupted`.

    One backend (worker processes) serves every shape, so workers start once.
    By the time `Interrupted` is raised the workers are gone and every
    measurement taken is in the store.
    """
    result = SweepSummary(sweep)
    before = _count_lines(sweep.store_path)
    try:
        backend = backend or make_backend(sweep.plans[0].request)
        try:
            for index, plan in enumerate(sweep.plans):
                result.summaries.append(run_one(index, plan, backend))
        finally:
            backend.close()
    except (KeyboardInterrupt, Terminated) as exc:
        for signum in STOP_SIGNALS:  # on the way out: no second traceback
            signal.signal(signum, signal.SIG_IGN)
        signum = exc.signum if isinstance(exc, Terminated) else signal.SIGINT
        raise Interrupted(signum, interrupted_line(sweep, signum, before, result)) from None
    return result


def interrupted_line(
    sweep: SweepPlan, signum: int, before: int, result: SweepSummary | None = None
) -> str:
    """The one line a stopped run prints: what is saved, where, and how to resume."""
    saved = _count_lines(sweep.store_path)
    done = ""
    if sweep.is_sweep and result is not None:
        plans = "shapes" if len(set(sweep.shape_numbers())) == len(sweep.plans) else "plans"
        done = f"{len(result.summaries)} of {len(sweep.plans)} {plans} finished; "
    head = "Interrupted" if signum == signal.SIGINT else "Terminated"
    noun = "measurement" if saved == 1 else "measurements"
    return (
        f"{head}: {done}{saved} {noun} saved in {sweep.store_path} "
        f"({saved - before} from this run); rerun the same command to resume"
    )
