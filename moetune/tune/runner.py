"""One tuning run from plan to files: what `moetune tune` does, as functions.

plan      shape, batch sizes, candidates left after each pruning rule, the
          files it will write (pure; `--dry-run` stops after printing it)
search    exhaustive or fast search over a `StoreMeasurer` (resumable),
          with a progress bar on stderr (``--search thorough``: the whole
          call as fast search did before it climbed from two starts, and
          the split search per GEMM as widely as the whole call); a plan
          seeded from another kernel's plan of the same problem (`seeded_from`)
          runs a transfer search from that plan's stored results instead
baseline  the engines' own configs at every batch size, same harness ("full"):
          vLLM's/SGLang's fallback and the file each would load today
          (`moetune.tune.baselines`)
verify    each winner against the PyTorch reference; a wrong one is never
          written, the next best is checked instead
split     for SGLang's up/down tables: the up and down GEMMs searched apart,
          a pair written only where it is faster as a whole call
          (`moetune.tune.search.split_search`)
confirm   the verified configs, the runners-up within the noise of them and every
          baseline timed again, interleaved over ``confirm_rounds`` rounds
          (`moetune.tune.confirm`); the finalist of lowest median is the tuned config,
          and each engine's file keeps
          the engine's own config at a batch size where the tuned one is not faster
          beyond the noise, and the summary's times and speedups are these
write     the vLLM and SGLang files, atomically, schema-validated
summary   per batch size: config, latency, speedup over each baseline,
          fraction of the roofline floor (read bandwidth and the dtype's
          matmul peak, measured on this GPU: `moetune.tune.measure.ceilings`), kept
          in <save-dir>/summary.json for `moetune report`
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moetune.device import DeviceLimits
from moetune.errors import TuneError
from moetune.kernel.config import Candidate
from moetune.roofline import moe_roofline
from moetune.tune.confirm import DEFAULT_ROUNDS, TUNED, Confirmation, Decision, Interval
from moetune.tune.measure.measurer import Backend, RunContext, StoreMeasurer
from moetune.tune.measure.routing_load import beats_floor_note, floor_hits
from moetune.tune.measure.worker import WorkUnit
from moetune.tune.problem import TuneProblem
from moetune.tune.search.space import (
    MEASURED_RULES,
    PRUNE_RULES,
    PruneReport,
    prune,
    prune_rules,
    swap_ab_candidates,
)
from moetune.tune.store import STORE_FILENAME, Measurement, ResultStore

ENGINES = ("vllm", "sglang")
# How many runners-up are checked against the reference before a batch size is given up.
MAX_VERIFY_TRIES = 5


@dataclass(frozen=True)
class TuneRequest:
    """Everything a run needs, resolved from the command line."""

    problem: TuneProblem
    batch_sizes: tuple[int, ...]
    space: tuple[Candidate, ...]
    save_dir: Path
    engines: tuple[str, ...] = ENGINES
    search: str = "fast"
    device_name: str = "cpu"
    triton_version: str = "unknown"
    devices: tuple[str | None, ...] = (None,)
    backend: str = "local"
    compile_workers: int = 0
    timeout_s: float = 120.0
    overwrite: bool = False
    source: str = ""  # where the shape came from, for the plan
    space_source: str = "default grid"
    up_tma: bool = False  # split tune: also search the up GEMM with TMA
    compare_dir: Path | None = None  # a folder of existing files to compare against
    confirm_rounds: int = DEFAULT_ROUNDS  # the confirmation's rounds; 0: no confirmation
    # The vLLM release the vLLM file is for (None: the newest moetune knows) and, when it
    # is not simply the installed one's, why (`moetune.engines.vllm.target_release`).
    vllm_release: str | None = None
    vllm_release_note: str | None = None
    # The vLLM server runs DeepGEMM's E8M0 scales: vLLM 0.34's _down.json is tuned where
    # it reads it (`moetune.tune.search.split_vllm`).
    vllm_deepgemm: bool = False

    @property
    def on_gpu(self) -> bool:
        """Whether the run times on GPUs (local devices, or Ray's), not under the interpreter."""
        return any(d is not None for d in self.devices) or self.backend == "ray"


@dataclass(frozen=True)
class TunePlan:
    request: TuneRequest
    limits: DeviceLimits
    pruning: dict[int, PruneReport]
    files: tuple[Path, ...]
    store_path: Path
    # The same problem on another kernel, tuned first into the same store: this plan's
    # whole-call search starts from its results (`moetune.tune.search.strategy.transfer_search`).
    seeded_from: TuneProblem | None = None

    @property
    def problem(self) -> TuneProblem:
        return self.request.problem


@dataclass(frozen=True)
class BatchResult:
    """One row of the summary."""

    batch_size: int
    config: Candidate
    latency_us: float
    floor_us: float | None
    verified_rank: int  # 0: the measured best; k: the k-th runner-up (the ones above were wrong)
    rel_rms: float | None
    baseline_us: dict[str, float | None] = field(default_factory=dict)  # by Baseline.key
    experts_hit: float | None = None  # the floor's count from a replayed dump; None: uniform
    # The confirmation round at this batch size and what each engine's file got from it.
    confirmation: Confirmation | None = None
    decisions: tuple[Decision, ...] = ()

    @property
    def search_us(self) -> float:
        """The search's own timing of the config (`latency_us` before any confirmation)."""
        return self.latency_us

    @property
    def confirmed_us(self) -> float:
        """The tuned config's time: the confirmation's median, else the search's timing."""
        median = None if self.confirmation is None else self.confirmation.median(TUNED)
        return self.latency_us if median is None else median.value

    def baseline_time(self, key: str) -> float | None:
        """A baseline's time: the confirmation's median, else the search-time timing."""
        if self.confirmation is not None:
            median = self.confirmation.median(key)
            return None if median is None else median.value
        return self.baseline_us.get(key)

    def speedup_interval(self, key: str) -> Interval | None:
        """The speedup of the baseline's engine's file over the baseline, from the
        confirmation (None without one, or where the baseline was not timed)."""
        if self.confirmation is None:
            return None
        from moetune.tune.confirm import written_speedup

        return written_speedup(self.confirmation, self.decisions, key)

    def speedup_over(self, key: str) -> float | None:
        """Baseline time over the written config's time (None: baseline not timed): from the
        confirmation when there is one (what the engine's file holds at this batch size)."""
        if self.confirmation is not None:
            found = self.speedup_interval(key)
            return None if found is None else found.value
        base = self.baseline_us.get(key)
        return None if base is None else base / self.latency_us

    def written_for(self, engine: str) -> str:
        """What `engine`'s file holds here: `TUNED`, or the baseline key whose config it kept."""
        return next((d.written for d in self.decisions if d.engine == engine), TUNED)

    @property
    def roofline_fraction(self) -> float | None:
        """floor / latency, at most 1: a call that beats the floor is reported at 100 %
        and the summary carries a note that one of the floor's assumptions did not hold."""
        if self.floor_us is None:
            return None
        return min(1.0, self.floor_us / self.confirmed_us)


@dataclass
class TuneSummary:
    plan: TunePlan
    rows: list[BatchResult] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    measured: int = 0
    reused: int = 0
    ceilings: Any = None
    compile: dict[str, float] = field(default_factory=dict)
    split: list[Any] = field(default_factory=list)  # a search.split.SplitResult per batch size
    vllm_down: list[Any] = field(default_factory=list)  # the same, for vLLM's _down.json
    baselines: list[Any] = field(default_factory=list)  # moetune.tune.baselines.Baseline
    # (stage, when it began as a Unix time, seconds until the next one or the end), in order.
    stages: list[tuple[str, float, float]] = field(default_factory=list)

    def geomean_speedup(self, key: str) -> float | None:
        from moetune.tune.baselines import geomean_speedup

        return geomean_speedup([(row.speedup_over(key), 1.0) for row in self.rows])

    def to_json(self) -> dict[str, Any]:
        """What `tune --json` prints for this shape (`summary_json`)."""
        return summary_json(self)


def planned_files(
    problem: TuneProblem,
    device_name: str,
    triton_version: str,
    save_dir: Path,
    engines: Sequence[str],
) -> tuple[Path, ...]:
    """The paths `write_engine_files` writes, known before any work."""
    from moetune.tune.output import engine_file_paths

    return tuple(
        path
        for engine in engines
        for path in engine_file_paths(engine, problem, device_name, triton_version, save_dir)
    )


def make_plan(request: TuneRequest, limits: DeviceLimits) -> TunePlan:
    if not request.space:
        raise TuneError("the search space is empty")
    space = [*request.space, *swap_ab_candidates(request.space, request.problem, limits)]
    rules = prune_rules(request.search)  # fast: the measured rules too
    pruning = {m: prune(space, request.problem, m, limits, rules) for m in request.batch_sizes}
    empty = [m for m, report in pruning.items() if not report.kept]
    if empty:
        raise TuneError(_nothing_left(pruning[empty[0]], empty[0], request.space_source))
    files = planned_files(
        request.problem,
        request.device_name,
        request.triton_version,
        request.save_dir,
        request.engines,
    )
    return TunePlan(request, limits, pruning, files, request.save_dir / STORE_FILENAME)


def _nothing_left(report: PruneReport, batch_size: int, space_source: str) -> str:
    """Why pruning kept nothing: the rule that removed the last candidates, in its own words."""
    last = [name for name, count in report.removed.items() if count][-1]
    rule = dict(PRUNE_RULES + MEASURED_RULES)[last].__doc__.strip().splitlines()[0].rstrip(".")
    return (
        f"pruning left no candidate at batch size {batch_size}: rule {last} removed the last "
        f"{report.removed[last]} ({rule}); no config of the search space ({space_source}) "
        "can run this problem"
    )


def plan_lines(plan: TunePlan) -> list[str]:
    """The plan as printed before any work."""
    request, problem = plan.request, plan.problem
    lines = [
        f"Shape:       {problem.shape_key()}" + (f"  ({request.source})" if request.source else ""),
        f"Device:      {request.device_name}, Triton {request.triton_version}, "
        f"pruned for {plan.limits.name}",
        f"Kernel:      {kernel_description(problem)}",
        _search_line(plan),
        *_seeded_lines(plan),
        f"Batch sizes: {', '.join(map(str, request.batch_sizes))}",
        "Candidates after pruning (removed per rule):",
    ]
    for m, report in plan.pruning.items():
        removed = ", ".join(f"{rule} {count}" for rule, count in report.removed.items() if count)
        lines.append(
            f"  M={m:<5} {len(report.kept):>5} kept" + (f"  ({removed})" if removed else "")
        )
    lines.extend(_split_and_routing_lines(plan))
    lines.extend(_confirm_lines(request.confirm_rounds))
    lines.extend(_vllm_file_lines(plan))
    lines.extend(_vllm_down_lines(plan))
    lines.append(f"Results:     {plan.store_path} (resumable)")
    lines.append("Will write:")
    lines.extend(f"  {path}" for path in plan.files)
    return lines


def _search_line(plan: TunePlan) -> str:
    """What the search starts from: the space, and the swapped fp8 kernel's 8-row twins
    (`swap_ab_candidates`) where pruning starts from more, so the removal counts of each
    batch size add up to the number stated here."""
    request = plan.request
    given = len(request.space)
    report = next(iter(plan.pruning.values()))
    pruned_from = len(report.kept) + report.total_removed
    line = f"Search:      {request.search} over {pruned_from} candidates ({request.space_source}"
    if pruned_from == given:
        return line + ")"
    return (
        f"{line}: {given}, and {pruned_from - given} BLOCK_SIZE_M=8 twins of its 16-row "
        "tiles for the fp8 kernel that swaps A and B)"
    )


def _confirm_lines(rounds: int) -> list[str]:
    """The plan's word on the confirmation round (`moetune.tune.confirm`)."""
    if not rounds:
        return ["Confirm:     off (--confirm-rounds 0): times and files from the search"]
    return [
        f"Confirm:     {rounds} interleaved rounds of the configs to write and the engines' own;",
        "             a file keeps the engine's config where the tuned one is not faster",
        "             beyond the noise (95 % interval)",
    ]


def kernel_description(problem: TuneProblem) -> str:
    """The kernel the tune times: an engine's own (see `moetune.engines.launch`), or a twin."""
    from moetune.engines.launch import describe_kernel

    return describe_kernel(problem.kernel, problem.dtype)


def kernel_label(problem: TuneProblem) -> str:
    """A short name of the kernel a problem is timed on, e.g. ``the vLLM 0.33.0 kernel``."""
    from moetune.engines.launch import label_kernel

    return label_kernel(problem.kernel)


def _seeded_lines(plan: TunePlan) -> list[str]:
    if plan.seeded_from is None:
        return []
    return [
        f"             seeded from {kernel_label(plan.seeded_from)}'s results (transfer), "
        "then a local climb"
    ]


def _split_and_routing_lines(plan: TunePlan) -> list[str]:
    from moetune.tune.search.split import split_engines
    from moetune.tune.search.split_search import SplitOptions, split_plan_lines

    problem = plan.problem
    routing = problem.routing or "uniform random (fresh per replay)"
    lines = [f"Routing:     {routing}"]
    if split_engines(plan.request.engines):
        options = SplitOptions(up_tma=plan.request.up_tma)
        lines.extend(split_plan_lines(options, plan.request.search))
    return lines


def _vllm_file_lines(plan: TunePlan) -> list[str]:
    """The release the vLLM file is for, in one line, and whether TMA-B off is tried."""
    from moetune.tune.output import vllm_file_release
    from moetune.tune.search.space import TMA_B_OFF_TOP, tma_b_kernel

    request = plan.request
    if "vllm" not in request.engines:
        return []
    release = vllm_file_release(request.vllm_release)
    why = request.vllm_release_note or (
        "--vllm-release" if request.vllm_release else "the newest release moetune knows"
    )
    lines = [f"vLLM file:   for vLLM {release} ({why})"]
    if tma_b_kernel(plan.problem, release) is None:
        return lines
    if request.on_gpu:
        lines.append(
            f"             USE_TMA: the {TMA_B_OFF_TOP} fastest per batch size re-timed with "
            "TMA-B off; false only where faster"
        )
    else:
        lines.append("             USE_TMA: not tuned on the CPU (the interpreter has no TMA-B)")
    return lines


def _vllm_down_lines(plan: TunePlan) -> list[str]:
    from moetune.tune.search.split_vllm import down_plan_lines

    return down_plan_lines(plan)


def plan_json(plan: TunePlan) -> dict[str, Any]:
    from moetune.engines.launch import kernel_json

    return {
        "problem": plan.problem.key(),
        "shape_key": plan.problem.shape_key(),
        "device_name": plan.request.device_name,
        "triton_version": plan.request.triton_version,
        "kernel": kernel_json(plan.problem.kernel, plan.problem.dtype),
        "search": plan.request.search,
        "seeded_from": None if plan.seeded_from is None else plan.seeded_from.key(),
        "space_size": len(plan.request.space),
        "batch_sizes": list(plan.request.batch_sizes),
        "pruning": {
            str(m): {"kept": len(r.kept), "removed": dict(r.removed)}
            for m, r in plan.pruning.items()
        },
        "store": str(plan.store_path),
        "files": [str(path) for path in plan.files],
        "routing": plan.problem.routing or "uniform",
        "split": bool(_split_engines(plan)),
        "confirm_rounds": plan.request.confirm_rounds,
        "vllm_release": _vllm_release_json(plan),
        "vllm_down": _vllm_down_json(plan),
    }


def _vllm_down_json(plan: TunePlan) -> dict[str, Any] | None:
    from moetune.tune.search.split_vllm import plan_json as down_json

    return down_json(plan)


def _vllm_release_json(plan: TunePlan) -> str | None:
    from moetune.tune.output import vllm_file_release

    if "vllm" not in plan.request.engines:
        return None
    return vllm_file_release(plan.request.vllm_release)


def _split_engines(plan: TunePlan) -> tuple[str, ...]:
    from moetune.tune.search.split import split_engines

    return split_engines(plan.request.engines)


def make_backend(request: TuneRequest) -> Backend:
    if request.backend == "ray":
        from moetune.tune.measure.ray_backend import RayBackend

        return RayBackend(
            num_gpus=sum(1 for d in request.devices if d is not None),
            timeout_s=request.timeout_s,
        )
    from moetune.tune.measure.worker import WorkerPool

    return WorkerPool(
        list(request.devices),
        compile_workers=request.compile_workers,
        timeout_s=request.timeout_s,
    )


def default_candidate(problem: TuneProblem, batch_size: int) -> Candidate:
    from moetune.kernel.config import default_config

    config = default_config(
        batch_size,
        problem.num_experts,
        problem.intermediate_size,
        problem.hidden_size,
        problem.top_k,
        problem.dtype,
        problem.block_shape,
    )
    return Candidate.from_config(config)


def ranked(
    store: ResultStore, context: RunContext, batch_size: int, fidelity: str
) -> list[Measurement]:
    """Every ok measurement of this batch size at `fidelity`, fastest first."""
    key = context.problem.key()
    latest: dict[Candidate, Measurement] = {}
    for m in store.all():
        if (
            m.problem_key == key
            and m.batch_size == batch_size
            and m.fidelity == fidelity
            and m.kind == "whole"
            and m.device_name == context.device_name
            and m.triton_version == context.triton_version
        ):
            latest[m.candidate] = m
    ok = [m for m in latest.values() if m.status == "ok" and m.latency_us is not None]
    return sorted(ok, key=lambda m: m.latency_us)


def other_kernels_note(
    store: ResultStore, context: RunContext, seeded_from: TuneProblem | None = None
) -> str | None:
    """One line where the store holds this shape's timings on other kernels only (none is
    reused: the key names the kernel); None where it holds some of this kernel's, or none.
    The kernel a transfer is seeded from is not another kernel's leftovers: it is used."""
    from moetune.tune.problem import split_key

    key = context.problem.key()
    shape = context.problem.shape_key()
    used = {key} | ({seeded_from.key()} if seeded_from is not None else set())
    others: dict[str, int] = {}
    for m in store.all():
        if m.device_name != context.device_name or m.triton_version != context.triton_version:
            continue
        if m.problem_key == key:
            return None
        found, tag = split_key(m.problem_key)
        if found == shape and m.problem_key not in used:
            name = tag or "an unnamed kernel (written before store keys named the kernel)"
            others[name] = others.get(name, 0) + 1
    if not others:
        return None
    listed = "; ".join(f"{count} on {tag}" for tag, count in others.items())
    return (
        f"{store.path} holds timings of this shape on other kernels only ({listed}): none is "
        f"reused, this run times {kernel_tag_of(context.problem)}"
    )


def kernel_tag_of(problem: TuneProblem) -> str:
    from moetune.engines.launch import kernel_tag

    return kernel_tag(problem.kernel, problem.dtype)


def transfer_seeds(
    store: ResultStore, context: RunContext, source: TuneProblem, batch_sizes: Sequence[int]
) -> dict[int, list[Candidate]]:
    """Per batch size, `source`'s full-fidelity configs in `store`, fastest first.

    `source` is this problem on the kernel tuned first (its search's finalists
    and the engine baselines timed on it); a batch size it has no result for
    gets none, and the transfer search starts there as fast search does. vLLM 0.34's
    TMA-B switch does not carry over (`_time_tma_b_off` re-times it on its own kernel).
    """
    on_source = RunContext(source, context.device_name, context.triton_version)
    return {
        m: list(
            dict.fromkeys(
                row.candidate.with_tma_b(True) for row in ranked(store, on_source, m, "full")
            )
        )
        for m in batch_sizes
    }


def verify_winners(
    backend: Backend,
    problem: TuneProblem,
    choices: dict[int, list[Measurement]],
    notes: list[str],
) -> dict[int, tuple[Measurement, int, float | None]]:
    """The first of each batch size's ranked measurements that matches the reference.

    Returns batch size -> (measurement, its rank, relative RMS error). All batch
    sizes are checked together; those whose pick failed move to their next one.
    """
    rank = dict.fromkeys(choices, 0)
    verified: dict[int, tuple[Measurement, int, float | None]] = {}
    while True:
        todo = {
            m: choices[m][rank[m]]
            for m in choices
            if m not in verified and rank[m] < min(len(choices[m]), MAX_VERIFY_TRIES)
        }
        if not todo:
            break
        units = [WorkUnit(problem, m, (pick.candidate,), "verify") for m, pick in todo.items()]
        for unit, outcome in backend.run(units):
            m = unit.batch_size
            if outcome.status == "ok":
                verified[m] = (todo[m], rank[m], outcome.rel_rms)
            else:
                notes.append(
                    f"M={m}: {todo[m].candidate.short()} rejected ({outcome.status}: "
                    f"{outcome.error}); checking the next best"
                )
                rank[m] += 1
    missing = sorted(set(choices) - set(verified))
    if missing:
        raise TuneError(
            f"no candidate passed the check against the PyTorch reference at batch size(s) "
            f"{', '.join(map(str, missing))}; nothing was written"
        )
    return verified


def _time_tma_b_off(
    plan: TunePlan, store: ResultStore, context: RunContext, measurer: Any, found: dict
) -> None:
    """vLLM 0.34's USE_TMA as a tuning dimension: each batch size's fastest configs re-timed
    with TMA-B off (`moetune.tune.search.space.tma_b_off_candidates`), where it applies."""
    from moetune.tune.output import vllm_file_release
    from moetune.tune.search.space import tma_b_off_candidates
    from moetune.tune.search.strategy import tma_b_off_round

    if "vllm" not in plan.request.engines or not plan.request.on_gpu:
        return  # the interpreter launches no TMA-B: off would time the same launch
    release = vllm_file_release(plan.request.vllm_release)
    fidelity = {m: result.best.fidelity for m, result in found.items()}
    twins = {
        m: tma_b_off_candidates(
            [row.candidate for row in ranked(store, context, m, fidelity[m])],
            plan.problem,
            plan.limits,
            release,
        )
        for m in found
    }
    tma_b_off_round(twins, fidelity, measurer)


STAGES = ("search", "baselines", "verify", "split", "confirm", "ceilings", "files")


class _Stages:
    """The stages a run enters, each with when it began: (name, Unix time, perf_counter)."""

    def __init__(self, stage: Callable[[str], None] | None) -> None:
        # "prepare": the baselines' files read, the store opened.
        self.begun: list[tuple[str, float, float]] = [("prepare", time.time(), time.perf_counter())]
        self.stage = stage

    @property
    def started(self) -> float:
        return self.begun[0][2]

    def enter(self, name: str) -> None:
        self.begun.append((name, time.time(), time.perf_counter()))
        if self.stage is not None:
            self.stage(name)

    def spans(self, ended: float) -> list[tuple[str, float, float]]:
        """(stage, when it began, seconds until the next one or `ended`), in order."""
        ends = [at for _, _, at in self.begun[1:]] + [ended]
        return [
            (name, when, end - at) for (name, when, at), end in zip(self.begun, ends, strict=True)
        ]


def run_tune(
    plan: TunePlan,
    *,
    progress: Callable[[Measurement, bool], None] | None = None,
    backend: Backend | None = None,
    stage: Callable[[str], None] | None = None,
) -> TuneSummary:
    """Search, baseline, verify and write; see the module docstring.

    `progress` is called with every measurement (and whether the store had it),
    `stage` with each name of `STAGES` as that stage begins.
    """
    stages = _Stages(stage)
    request = plan.request
    summary = TuneSummary(plan)
    store, context = _prepare(plan, summary)
    owned = backend is None  # a backend passed in (a sweep's, shared by its shapes) stays open
    backend = backend or make_backend(request)
    try:
        measurer = StoreMeasurer(
            context, backend, store, overwrite=request.overwrite, on_measurement=progress
        )
        found, baseline_us = _search_and_baselines(plan, summary, store, context, measurer, stages)
        choices = _choices(found, store, context)
        verified, runners_up, confirmations = _verify_split_confirm(
            plan, summary, measurer, backend, choices, stages
        )
        if request.on_gpu:
            stages.enter("ceilings")
            summary.ceilings = _ceilings(backend, summary.notes)
    finally:
        if owned:
            backend.close()
    summary.rows = _rows(plan, summary, verified, runners_up, confirmations, baseline_us)
    summary.notes.extend(kept_notes(summary.rows, summary.baselines))
    stages.enter("files")
    summary.files = _write_files(plan, summary)
    summary.measured = measurer.timed
    summary.compile = {
        "warmed": measurer.warm_count,
        "compile_s": round(measurer.warm_compile_s, 3),
        "wall_s": round(measurer.warm_wall_s, 3),
        "workers": backend.compile_workers,
    }
    summary.reused = measurer.reused
    ended = time.perf_counter()
    summary.wall_s = ended - stages.started
    summary.stages = stages.spans(ended)
    _record_summary(summary)
    return summary


def _prepare(plan: TunePlan, summary: TuneSummary) -> tuple[ResultStore, RunContext]:
    """The engine baselines (into `summary`), the store (checked writable now, not after
    the first measurement) and the run's context; a note where the store holds this shape
    on other kernels only."""
    from moetune.tune.baselines import engine_baselines

    request, problem = plan.request, plan.problem
    summary.baselines = engine_baselines(
        problem,
        request.batch_sizes,
        request.engines,
        request.device_name,
        request.triton_version,
        compare_dir=request.compare_dir,
        notes=summary.notes,
        vllm_release=request.vllm_release,
    )
    store = ResultStore(plan.store_path, within=request.save_dir)
    store.check_writable()  # a read-only store fails now, not after the first measurement
    context = RunContext(problem, request.device_name, request.triton_version)
    skipped = other_kernels_note(store, context, plan.seeded_from)
    if skipped:
        summary.notes.append(skipped)
    return store, context


def _search_and_baselines(
    plan: TunePlan,
    summary: TuneSummary,
    store: ResultStore,
    context: RunContext,
    measurer: StoreMeasurer,
    stages: _Stages,
) -> tuple[dict[int, Any], dict[int, dict[str, float | None]]]:
    """The whole-call search (exhaustive, a transfer, or fast), vLLM 0.34's TMA-B off round,
    then the baselines' timings: (each batch size's search result, its baselines' times)."""
    from moetune.tune.baselines import prefetch_baselines, time_baselines
    from moetune.tune.search.strategy import (
        exhaustive_search,
        fast_search,
        search_options,
        transfer_search,
    )

    request, problem = plan.request, plan.problem

    def space_for(batch_size: int) -> list[Candidate]:
        return list(plan.pruning[batch_size].kept)

    # The baselines are known now: timed alongside the search, in its idle time.
    prefetch_baselines(measurer, summary.baselines, request.batch_sizes)
    stages.enter("search")
    if request.search == "exhaustive":
        found = exhaustive_search(request.batch_sizes, space_for, measurer)
    elif plan.seeded_from is not None:
        seeds = transfer_seeds(store, context, plan.seeded_from, request.batch_sizes)
        found = transfer_search(
            request.batch_sizes, space_for, measurer, problem, plan.limits, seeds
        )
    else:
        found = fast_search(
            request.batch_sizes,
            space_for,
            measurer,
            problem,
            plan.limits,
            search_options(request.search),
        )
    _time_tma_b_off(plan, store, context, measurer, found)
    stages.enter("baselines")
    baseline_us = time_baselines(measurer, summary.baselines, request.batch_sizes, summary.notes)
    return found, baseline_us


def _choices(
    found: dict[int, Any], store: ResultStore, context: RunContext
) -> dict[int, list[Measurement]]:
    """Per batch size, the candidates to verify, fastest first."""
    choices = {}
    for m, result in found.items():
        # Every full-fidelity timing of this batch size competes, the engine baselines'
        # too: the written config is never one measured slower than an engine's own.
        best = result.best
        ranking = ranked(store, context, m, best.fidelity)
        choices[m] = ranking if best in ranking else [best, *ranking]
    return choices


def _verify_split_confirm(
    plan: TunePlan,
    summary: TuneSummary,
    measurer: StoreMeasurer,
    backend: Backend,
    choices: dict[int, list[Measurement]],
    stages: _Stages,
) -> tuple[dict, dict, dict[int, Confirmation]]:
    """Each batch size's pick checked against the reference, SGLang's split search (into
    `summary.split`), and the confirmation round: (verified, runners-up, confirmations)."""
    request, problem = plan.request, plan.problem
    stages.enter("verify")
    verified = verify_winners(backend, problem, choices, summary.notes)
    if _split_engines(plan):
        from moetune.tune.search.split_search import SplitOptions, tune_split

        stages.enter("split")
        singles = {m: verified[m][0].candidate for m in request.batch_sizes}
        options = SplitOptions(up_tma=request.up_tma)
        rankings = {m: [row.candidate for row in choices[m]] for m in choices}
        summary.split = tune_split(
            plan, measurer, backend, singles, summary.notes, options, rankings=rankings
        )
    if _tunes_vllm_down(plan):
        if not _split_engines(plan):
            stages.enter("split")
        summary.vllm_down = _tune_vllm_down(plan, measurer, backend, verified, choices, summary)
    confirmations: dict[int, Confirmation] = {}
    runners_up: dict[int, dict[Candidate, tuple[Measurement, int, float | None]]] = {}
    if request.confirm_rounds > 0:
        stages.enter("confirm")
        runners_up = verify_finalists(backend, problem, choices, verified)
        confirmations = confirm_round(
            backend,
            plan,
            {m: verified[m][0].candidate for m in verified},
            summary.baselines,
            {m: list(found) for m, found in runners_up.items()},
        )
    return verified, runners_up, confirmations


def _rows(
    plan: TunePlan,
    summary: TuneSummary,
    verified: dict,
    runners_up: dict,
    confirmations: dict[int, Confirmation],
    baseline_us: dict[int, dict[str, float | None]],
) -> list[BatchResult]:
    """The summary's row per batch size: the confirmation's choice among the finalists,
    its roofline floor (a note where the time beats it) and what each engine's file holds."""
    from moetune.tune.confirm import choose_finalist, decide

    request, problem = plan.request, plan.problem
    # A replayed dump: the floor counts the experts its timed windows hit (None: unreadable).
    hits = floor_hits(problem, request.batch_sizes, summary.notes) if summary.ceilings else {}
    rows = []
    for m in request.batch_sizes:
        pick, rank, rel_rms = verified[m]
        confirmation = confirmations.get(m)
        if confirmation is not None:
            confirmation = choose_finalist(confirmation)
            if confirmation.configs[TUNED] != pick.candidate:  # a runner-up's median is lower
                pick, rank, rel_rms = runners_up[m][confirmation.configs[TUNED]]
        floor_us = None
        if summary.ceilings is not None and hits is not None:
            floor_us = _floor_us(problem, m, hits.get(m), summary.ceilings)
            if pick.latency_us < floor_us:
                summary.notes.append(
                    beats_floor_note(m, pick.latency_us, floor_us, summary.ceilings, problem)
                )
        rows.append(
            BatchResult(
                m,
                pick.candidate,
                pick.latency_us,
                floor_us,
                rank,
                rel_rms,
                baseline_us[m],
                experts_hit=(hits or {}).get(m),
                confirmation=confirmation,
                decisions=()
                if confirmation is None
                else tuple(decide(confirmation, request.engines)),
            )
        )
    return rows


def _floor_us(problem: TuneProblem, m: int, experts_hit: float | None, ceilings: Any) -> float:
    """The roofline floor of one call at batch size `m` on the measured ceilings, in us."""
    roof = moe_roofline(
        m,
        problem.num_experts,
        problem.intermediate_size,
        problem.hidden_size,
        problem.top_k,
        problem.dtype,
        problem.engine_block_shape,
        experts_hit=experts_hit,
        per_channel=problem.per_channel,
    )
    return 1e6 * ceilings.floor_seconds(roof, problem.dtype)


def _write_files(plan: TunePlan, summary: TuneSummary) -> list[Path]:
    """Each engine's file(s) of what its rows hold, atomically, schema-validated."""
    from moetune.tune.output import write_engine_files

    request = plan.request
    files: list[Path] = []
    for engine in request.engines:
        results, split = written_configs(engine, summary.rows, summary.baselines, summary.split)
        files += write_engine_files(
            results,
            plan.problem,
            request.device_name,
            request.triton_version,
            request.save_dir,
            (engine,),
            split=split or None,
            notes=summary.notes,
            vllm_release=request.vllm_release,
        )
        if engine == "vllm" and summary.vllm_down:
            from moetune.tune.output import engine_file_path
            from moetune.tune.search.split_vllm import settle, write_down_file

            summary.vllm_down = settle(results, summary.vllm_down)

            main = engine_file_path(
                engine, plan.problem, request.device_name, request.triton_version, request.save_dir
            )
            files += write_down_file(
                results, summary.vllm_down, main, request.triton_version, summary.notes
            )
    return files


def _tunes_vllm_down(plan: TunePlan) -> bool:
    from moetune.tune.search.split_vllm import tunes_down_file

    return tunes_down_file(plan)


def _tune_vllm_down(
    plan: TunePlan,
    measurer: Any,
    backend: Backend,
    verified: dict,
    choices: dict,
    summary: TuneSummary,
) -> list[Any]:
    """vLLM 0.34's down pair where this tune searches it (`moetune.tune.search.split_vllm`)."""
    from moetune.tune.search.split_vllm import tune_down_file

    singles = {m: verified[m][0].candidate for m in plan.request.batch_sizes}
    rankings = {m: [row.candidate for row in choices[m]] for m in choices}
    return tune_down_file(plan, measurer, backend, singles, summary.notes, rankings)


def verify_finalists(
    backend: Backend,
    problem: TuneProblem,
    choices: dict[int, list[Measurement]],
    verified: dict[int, tuple[Measurement, int, float | None]],
) -> dict[int, dict[Candidate, tuple[Measurement, int, float | None]]]:
    """Per batch size, the search's runners-up within the noise of its pick
    (`moetune.tune.confirm.finalists`) that match the reference, each as (its measurement,
    its rank, relative RMS error), in rank order."""
    from moetune.tune.confirm import finalists

    found: dict[int, dict[Candidate, tuple[Measurement, int, float | None]]] = {}
    rows: dict[tuple[int, Candidate], tuple[Measurement, int]] = {}
    units = []
    for m, (pick, _, _) in verified.items():
        ranking = [(row.candidate, row.latency_us) for row in choices[m]]
        for candidate in finalists(ranking, pick.candidate):
            rank = next(i for i, row in enumerate(choices[m]) if row.candidate == candidate)
            rows[(m, candidate)] = (choices[m][rank], rank)
            units.append(WorkUnit(problem, m, (candidate,), "verify"))
    outcomes = {(u.batch_size, o.candidate): o for u, o in backend.run(units)} if units else {}
    for (m, candidate), (measurement, rank) in rows.items():
        outcome = outcomes.get((m, candidate))
        if outcome is not None and outcome.status == "ok":
            found.setdefault(m, {})[candidate] = (measurement, rank, outcome.rel_rms)
    return found


def confirm_round(
    backend: Backend,
    plan: TunePlan,
    tuned: dict[int, Candidate],
    baselines: Sequence[Any],
    runners_up: dict[int, list[Candidate]] | None = None,
) -> dict[int, Confirmation]:
    """The confirmation: at each batch size the tuned config, the runners-up within the
    noise of it and every baseline's config, timed over ``plan.request.confirm_rounds``
    interleaved rounds (`moetune.tune.confirm`)."""
    from moetune.tune.confirm import FINALIST, time_rounds

    named: dict[int, dict[str, Any]] = {}
    for m, config in tuned.items():
        named[m] = {TUNED: config}
        for index, other in enumerate((runners_up or {}).get(m, []), start=2):
            named[m][f"{FINALIST} {index}"] = other
        for baseline in baselines:
            if baseline.configs.get(m) is not None:
                named[m][baseline.key] = baseline.configs[m]
    return time_rounds(backend, plan.problem, named, plan.request.confirm_rounds)


def written_configs(
    engine: str, rows: Sequence[BatchResult], baselines: Sequence[Any], split: Sequence[Any]
) -> tuple[dict[int, Candidate], list[Any]]:
    """`engine`'s file's configs per batch size, and its split results: the tuned ones (the
    confirmation's choice among the finalists), except where the confirmation kept the
    engine's own config (then that config, in both tables of an engine that reads a down
    table)."""
    from dataclasses import replace

    configs = {b.key: b.configs for b in baselines}
    results: dict[int, Candidate] = {}
    kept: dict[int, Candidate] = {}
    for row in rows:
        written = row.written_for(engine)
        results[row.batch_size] = (
            row.config if written == TUNED else configs[written][row.batch_size]
        )
        if written != TUNED:
            kept[row.batch_size] = results[row.batch_size]
    pairs = []
    for result in split:
        if result.batch_size in kept:
            result = replace(result, single=kept[result.batch_size], split=False)
        elif not result.split and result.single != results.get(result.batch_size, result.single):
            # The confirmation chose a runner-up over the config the split search started from.
            result = replace(result, single=results[result.batch_size])
        pairs.append(result)
    return results, pairs


def kept_notes(rows: Sequence[BatchResult], baselines: Sequence[Any]) -> list[str]:
    """One line per batch size and engine whose file keeps the engine's own config."""
    from moetune.engines.formats import engine_label

    sources = {b.key: (b.label, b.source) for b in baselines}
    notes = []
    for row in rows:
        for decision in row.decisions:
            if not decision.kept_engine_config:
                continue
            label, source = sources[decision.written]
            ratio = "" if decision.ratio is None else f": {decision.ratio.short()}"
            owner = (
                f"from {source}, a file moetune does not own"
                if decision.written.endswith("_file")
                else f"{source}"
            )
            notes.append(
                f"M={row.batch_size}: the {engine_label(decision.engine)} file keeps the "
                f"{label}'s config {row.confirmation.configs[decision.written].short()} ({owner}); "
                f"the tuned {row.config.short()} was not faster beyond the noise{ratio}"
            )
    return notes


def _record_summary(summary: TuneSummary) -> None:
    """Keep the summary in the save dir for `moetune report`; a failure only adds a note."""
    from moetune.tune.summary_file import record_summary

    try:
        record_summary(summary)
    except OSError as exc:
        summary.notes.append(f"could not keep the summary for `moetune report`: {exc}")


def _ceilings(backend: Backend, notes: list[str]) -> Any:
    try:
        return backend.measure_ceilings()
    except Exception as exc:  # noqa: BLE001 - a missing roofline must not lose a finished tune
        notes.append(f"could not measure bandwidth and matmul rate: {exc}")
        return None


def _median(row: BatchResult, name: str) -> Interval | None:
    return None if row.confirmation is None else row.confirmation.median(name)


def _interval(found: Interval | None) -> list[float] | None:
    """[low, high] of an interval, for the JSON (None: no confirmation)."""
    return None if found is None else [found.low, found.high]


def _confirmation_json(summary: TuneSummary) -> dict[str, Any] | None:
    """How the summary's times and speedups were confirmed (None: they are the search's)."""
    from moetune.tune.confirm import INTERVAL_METHOD

    rounds = max((r.confirmation.rounds for r in summary.rows if r.confirmation), default=0)
    if not rounds:
        return None
    kept = sum(d.kept_engine_config for row in summary.rows for d in row.decisions)
    return {"rounds": rounds, "interval": INTERVAL_METHOD, "engine_configs_kept": kept}


def summary_json(summary: TuneSummary) -> dict[str, Any]:
    ceilings = summary.ceilings
    engines = summary.plan.request.engines
    return {
        "plan": plan_json(summary.plan),
        "wall_s": round(summary.wall_s, 3),
        "measured": summary.measured,
        "reused": summary.reused,
        "parallel_compile": summary.compile,
        "ceilings": None if ceilings is None else ceilings.to_json(summary.plan.problem.dtype),
        "confirmation": _confirmation_json(summary),
        "results": [
            {
                "batch_size": row.batch_size,
                "config": row.config.as_config(),
                "latency_us": row.confirmed_us,
                "latency_interval_us": _interval(_median(row, TUNED)),
                "search_latency_us": row.search_us,
                "written": {engine: row.written_for(engine) for engine in engines},
                "baselines": {
                    b.key: {
                        "config": None
                        if b.configs.get(row.batch_size) is None
                        else b.configs[row.batch_size].as_config(),
                        "latency_us": row.baseline_time(b.key),
                        "latency_interval_us": _interval(_median(row, b.key)),
                        "search_latency_us": row.baseline_us.get(b.key),
                        "speedup": row.speedup_over(b.key),
                        "speedup_interval": _interval(row.speedup_interval(b.key)),
                    }
                    for b in summary.baselines
                },
                "floor_us": row.floor_us,
                "roofline_fraction": row.roofline_fraction,
                "floor_experts_hit": row.experts_hit,
                "verified_rank": row.verified_rank,
                "rel_rms": row.rel_rms,
                "confirmation": None if row.confirmation is None else row.confirmation.to_json(),
            }
            for row in summary.rows
        ],
        "stages": [
            {"stage": name, "started_at": round(when, 3), "seconds": round(seconds, 3)}
            for name, when, seconds in summary.stages
        ],
        "split": [_split_json(result) for result in summary.split],
        "vllm_down": [_split_json(result) for result in summary.vllm_down],
        "baselines": [b.to_dict() for b in summary.baselines],
        "geomean_speedup": {b.key: summary.geomean_speedup(b.key) for b in summary.baselines},
        "files": [str(path) for path in summary.files],
        "notes": summary.notes,
    }


def _split_json(result: Any) -> dict[str, Any]:
    choice = result.choice
    return {
        "batch_size": result.batch_size,
        "written": "split" if result.split else "single",
        "up": result.up_entry(),
        "down": result.down_entry(),
        "pair_us": result.pair_us,
        "single_us": result.single_us,
        "speedup_over_single": result.speedup,
        "estimate_us": None if choice is None else choice.estimate_us,
        "up_plus_down_by_block_m": None
        if choice is None
        else {str(bm): us for bm, us in choice.sums.items()},
        "rel_rms": result.rel_rms,
        "stopped": result.stopped,
        "single_up_plus_down_us": result.reference_us,
    }


def visible_devices(gpus: str | None) -> tuple[str | None, ...]:
    """CUDA_VISIBLE_DEVICES values for the workers: `--gpus`, else every visible GPU, else CPU
    (always the CPU under the Triton interpreter: `moetune.device.interpreter_requested`)."""
    from moetune.device import interpreter_requested

    if interpreter_requested():
        return (None,)
    if gpus:
        return tuple(part.strip() for part in gpus.split(",") if part.strip())
    try:
        import torch
    except ImportError:
        return (None,)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        return (None,)
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
    if inherited:
        return tuple(part.strip() for part in inherited.split(",") if part.strip())[:count]
    return tuple(str(i) for i in range(count))
