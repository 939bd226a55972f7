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

The plan's time estimate is `moetune.tune.estimate`'s (its rates are data:
``moetune/data/estimate_rates.yaml``); this module prints it with the plan.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from moetune.dtypes import QuantChoice, quant_details
from moetune.engines.launch import KernelRef, kernel_for
from moetune.errors import Interrupted, MoetuneError, Terminated, TuneError
from moetune.extract.layouts import Layout, LayoutShard, ResolvedLayouts, SkippedLayout
from moetune.fileio import open_input
from moetune.tune.estimate import Estimate, Rates, cpu_hint, estimate_note, estimate_s, estimates
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


STAGE_LABELS = {
    "start-up": "start-up",
    "search": "search",
    "baselines": "baselines",
    "split": "split",
    "confirm": "confirm",
    "fixed": "checks/files",
}


def _estimate_line(est: Estimate, seconds: float, suffix: str = "", stages: bool = True) -> str:
    """The estimate line: `seconds`, with `stages` `est`'s stages (those that take time)
    summed, and what the estimate is for (`estimate_note`)."""
    parts = ""
    if stages:
        shown = [
            f"{STAGE_LABELS[name]} {format_duration(value) if value >= 0.5 else '<1 s'}"
            for name, value in est.stages
            if value
        ]
        parts = " = " + " + ".join(shown)
    return f"Estimate:    ~{format_duration(seconds)}{suffix}{parts} ({estimate_note(est)})"


def _hint_lines(ests: Sequence[Estimate]) -> list[str]:
    """Under the estimate, on the CPU interpreter: a full-size tune takes hours there."""
    return [f"{'':13}{line}" for line in cpu_hint(ests)]


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

    def estimates(self, rates: Rates | None = None) -> list[Estimate]:
        """Each plan's estimate; the first pays the run's start-up (one worker pool serves all).
        `rates`: instead of the device's (`moetune.tune.estimate.device_rates`)."""
        return estimates(self.plans, rates)

    def estimate_s(self, rates: Rates | None = None) -> float:
        return estimate_s(self.plans, rates)

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
    ests = sweep.estimates()

    def compare_lines(plan: TunePlan) -> list[str]:
        return [f"Compare:     {compare(plan)}"] if compare is not None else []

    if not sweep.is_sweep:  # one layout: its plan, or one per kernel timed
        lines: list[str] = []
        for plan, est in zip(sweep.plans, ests, strict=True):
            lines += ([""] if lines else []) + plan_lines(plan)
            lines.append(_estimate_line(est, est.seconds))
            lines += _hint_lines(ests) if len(sweep.plans) == 1 else []
            lines += compare_lines(plan)
        if len(sweep.plans) > 1:  # one per kernel: they run one after another
            lines += ["", _estimate_line(ests[0], sweep.estimate_s(), " in all", stages=False)]
            lines += _hint_lines(ests)
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
    lines.append(_estimate_line(ests[0], sum(e.seconds for e in ests), " in all", stages=False))
    lines += _hint_lines(ests)
    lines.append(f"Results:     {sweep.store_path} (one resumable store for every shape)")
    for index, (group, plan, est) in enumerate(zip(sweep.groups, sweep.plans, ests, strict=True)):
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
        "estimate_confirm": est.confirms,
        "estimate_rates": est.rates.gpu,
        "estimate_basis": est.basis,
        "estimate_note": estimate_note(est),
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
        "estimate_note": estimate_note(estimates[0]),
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
