"""`moetune benchmark`: time tuned config files against the engines' own configs, side by side."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from moetune.commands.options import (
    batch_size_option,
    batch_sizes_of,
    compare_dir_option,
    default_compile_workers,
    engine_option,
    gpus_option,
    kernel_option,
    model_options,
    problem_from_options,
    timeout_option,
    worker_devices,
)
from moetune.engines.launch import BENCHMARK_KERNEL_HELP
from moetune.errors import MoetuneError


class BenchmarkError(MoetuneError):
    """A --config file benchmark refuses to time (--strict)."""


@click.command("benchmark")
@model_options
@click.option(
    "--config",
    "config_files",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    multiple=True,
    help="A vLLM/SGLang tuned config file to time (repeatable). SGLang's <name>_down.json "
    "beside it is paired with it, as SGLang does (up GEMM from the file, down from _down).",
)
@batch_size_option
@gpus_option
@engine_option("Whose fallback config and existing file to compare with (vLLM's fallback always).")
@compare_dir_option("Also look for the engines' existing files in DIR (searched first).")
@timeout_option("Seconds one measurement may take before its worker is killed.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print which config each file gives per batch size, and stop (works without a GPU).",
)
@kernel_option(BENCHMARK_KERNEL_HELP)
@click.option(
    "--strict",
    is_flag=True,
    help="Refuse a --config file whose name says another E, N, GPU, dtype or block shape "
    "than this model's layout (default: warn, and time it as this shape anyway).",
)
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Interleaved rounds: each round times every config once per batch size, back to "
    "back, the same routing draws for all, the order rotated from round to round. With 2 or "
    "more: per batch size the median over the rounds, its 95 % interval, and each speedup "
    "with its interval (a paired bootstrap over the rounds).",
)
@click.option(
    "json_",
    "--json",
    is_flag=True,
    help="Print the results (with --dry-run: the plan) as JSON; notes and warnings go in it.",
)
def benchmark(
    config_files: tuple[Path, ...],
    batch_sizes: tuple[tuple[int, ...], ...],
    gpus: tuple[str, ...] | None,
    engine: str,
    compare_dir: Path | None,
    timeout_s: float,
    dry_run: bool,
    kernel: str,
    strict: bool,
    repeat: int,
    json_: bool,
    **model: Any,
) -> None:
    """Time --config files against the engines' own configs, per batch size.

    The baselines are what the engine runs today for this shape: vLLM's (and
    SGLang's) fallback config, and the file it would load ($VLLM_TUNED_CONFIG_FOLDER,
    $SGLANG_MOE_CONFIG_DIR, the installed engine's configs, or --compare-dir).
    Each cell shows microseconds and the speedup over the vLLM fallback.

    A file is timed as this model's shape: its name (E, N, GPU, dtype, block
    shape) is checked against the layout's, and a file named for another one
    gets a warning (--strict: an error).

    An SGLang file with a _down table beside it is timed as SGLang runs it: the up
    GEMM with the file's config and the down GEMM with the _down table's (TMA where
    an entry asks). Every column is then timed in that split harness.

    --repeat N times N interleaved rounds (A B A B ...) and reports medians with
    their intervals: one timing of a small batch size moves several per cent from
    run to run, so a gain of a few per cent needs the rounds to be believed.

    \b
    Example usage:
        moetune benchmark --model Qwen/Qwen3-30B-A3B --config "E=128,N=768,device_name=NVIDIA_H200.json"
    """
    plan = _bench_plan(
        config_files, model, batch_sizes, engine, compare_dir, kernel, strict, dry_run
    )
    if not json_:  # --json: the notes are in the JSON
        _print_kernels(plan)
    from moetune.commands.terminal import print_wrapped

    for warning in plan.warnings:
        print_wrapped(_stderr(), f"Warning: {warning}", "  ")
    devices = worker_devices(gpus, plan.resolved, dry_run=dry_run)
    facts = plan.facts(repeat)
    if dry_run:
        if json_:
            picks = [
                {
                    "batch_size": m,
                    **{name: _described(plan.picks[m].get(name)) for name in plan.names},
                }
                for m in plan.sizes
            ]
            click.echo(json.dumps({**facts, "dry_run": True, "picks": picks}, indent=2))
        else:
            _print_plan(plan.picks, plan.title, plan.harness)
        return
    rows = _measure(plan, devices, timeout_s, repeat)
    geomeans = _geomeans(plan, rows)
    if json_:
        report = {**facts, "results": rows, "geomean_speedup": geomeans}
        if repeat > 1:
            from moetune.tune.confirm import INTERVAL_METHOD

            report["interval"] = INTERVAL_METHOD
        click.echo(json.dumps(report, indent=2))
        return
    _print_results(plan, rows, geomeans, repeat)


@dataclass(frozen=True)
class BenchPlan:
    """What `benchmark` times: each column's config per batch size, and the kernel (one per
    engine) each column runs on."""

    files: dict[str, Any]  # --config path -> its tuned file
    resolved: Any  # moetune.commands.options.Resolved
    engines: tuple[str, ...]
    problems: dict[str, Any]  # engine -> the problem on that engine's kernel
    sizes: tuple[int, ...]
    baselines: list[Any]  # moetune.tune.baselines.Baseline
    timed_on: dict[str, str]  # column -> the engine whose kernel times it
    picks: dict[int, dict[str, Any]]  # batch size -> column -> its config
    harness: str  # "whole", or "pair" (an SGLang up + down pair is among the columns)
    notes: list[str]
    warnings: list[str]

    @property
    def problem(self) -> Any:
        return self.problems[self.engines[0]]

    @property
    def one_kernel(self) -> bool:
        return len(set(self.problems.values())) == 1

    @property
    def names(self) -> list[str]:
        """The columns: the baselines, then the --config files."""
        return [b.key for b in self.baselines] + list(self.files)

    @property
    def title(self) -> str:
        return f"{self.problem.shape_key()} on {self.resolved.device_name}"

    def kernel_of(self, name: str) -> Any:
        """The problem column `name` is timed on (its engine's kernel)."""
        return self.problems[self.timed_on[name]]

    def baselines_of(self, name: str) -> list[str]:
        """The baselines column `name`'s speedups are taken over: those timed on its kernel."""
        return [b.key for b in self.baselines if self.kernel_of(b.key) == self.kernel_of(name)]

    def references(self) -> dict[str, str]:
        """Each column's reference: the first fallback timed on the same kernel."""
        return {name: self.baselines_of(name)[0] for name in self.names}

    def facts(self, repeat: int) -> dict[str, Any]:
        """The JSON's facts of the run, before any timing."""
        from moetune.engines.launch import kernel_json

        problem, dtype = self.problem, self.problem.dtype
        return {
            "problem": problem.key(),
            "shape_key": problem.shape_key(),
            "device_name": self.resolved.device_name,
            "triton_version": self.resolved.triton_version,
            "kernel": kernel_json(problem.kernel, dtype),
            "kernels": {e: kernel_json(self.problems[e].kernel, dtype) for e in self.engines},
            "timed_on": self.timed_on,
            "harness": self.harness,
            "baselines": [b.to_dict() for b in self.baselines],
            "configs": self.names,
            "notes": self.notes,
            "warnings": self.warnings,
            "repeat": repeat,
        }


def _bench_plan(
    config_files: tuple[Path, ...],
    model: dict[str, Any],
    batch_sizes: tuple[tuple[int, ...], ...],
    engine: str,
    compare_dir: Path | None,
    kernel: str,
    strict: bool,
    dry_run: bool,
) -> BenchPlan:
    """The shape, the columns and what each times per batch size; --strict's refusal."""
    from dataclasses import replace

    from moetune.engines.formats import engines_named
    from moetune.engines.launch import benchmark_kernel, kernel_for
    from moetune.engines.tuned_file import as_pair, load_tuned_file, same_harness
    from moetune.tune.baselines import engine_baselines

    files = {str(path): load_tuned_file(path) for path in config_files}
    resolved = problem_from_options(model, dry_run=dry_run)
    engines = engines_named(engine)
    kernels, kernel_notes = benchmark_kernel(kernel, engines)
    dtype = resolved.problem.dtype
    problems = {e: replace(resolved.problem, kernel=kernel_for(kernels[e], dtype)) for e in engines}
    problem = problems[engines[0]]
    file_engines, file_notes = _file_engines(files, engines, len(set(problems.values())) == 1)
    mismatches = _mismatches(config_files, problem, resolved, model["model"])
    if strict and mismatches:
        more = f" (and {len(mismatches) - 1} more)" if len(mismatches) > 1 else ""
        raise BenchmarkError(
            f"--config {mismatches[0]}{more}; --strict times only files named for this shape"
        )
    sizes = batch_sizes_of(batch_sizes)
    baselines = engine_baselines(
        problem,
        sizes,
        engines,
        resolved.device_name,
        resolved.triton_version,
        compare_dir=compare_dir,
        pair_down_tables=True,
    )
    picks: dict[int, dict[str, Any]] = {}
    for m in sizes:
        picks[m] = {b.key: b.configs[m] for b in baselines if b.configs.get(m) is not None}
        for name, tuned in files.items():
            picks[m][name] = tuned.pick(m)
    # An SGLang up + down pair is timed with the routing outside the graph; then every
    # config is, so the columns stay comparable (`moetune.engines.tuned_file`).
    harness = "whole" if same_harness(p for row in picks.values() for p in row.values()) else "pair"
    if harness == "pair":
        picks = {m: {name: as_pair(p) for name, p in row.items()} for m, row in picks.items()}
    return BenchPlan(
        files=files,
        resolved=resolved,
        engines=engines,
        problems=problems,
        sizes=sizes,
        baselines=baselines,
        timed_on={b.key: b.key.rsplit("_", 1)[0] for b in baselines} | file_engines,
        picks=picks,
        harness=harness,
        notes=list(dict.fromkeys([*resolved.notes, *kernel_notes, *file_notes])),
        warnings=[
            f"--config {mismatch}; timed as this shape anyway (--strict refuses such a file)"
            for mismatch in mismatches
        ],
    )


def _print_kernels(plan: BenchPlan) -> None:
    """The notes, and the kernel each engine's columns are timed on, on stderr."""
    from moetune.commands.terminal import print_wrapped
    from moetune.tune.runner import kernel_description

    err = _stderr()
    for note in plan.notes:
        print_wrapped(err, f"Note: {note}", "  ")
    if plan.one_kernel:
        print_wrapped(err, f"Kernel: {kernel_description(plan.problem)}", "  ")
        return
    for e in plan.engines:
        print_wrapped(
            err,
            f"Kernel of the {_ENGINE_LABEL[e]} columns: {kernel_description(plan.problems[e])}",
            "  ",
        )


def _stderr() -> Any:
    """A rich console on stderr that wraps at the terminal's width (names and paths whole)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def _measure(plan: BenchPlan, devices: Any, timeout_s: float, repeat: int) -> list[dict]:
    """Every column timed at every batch size: one row per batch size (`--repeat`: the
    rounds' medians and intervals)."""
    from moetune.tune.measure.worker import WorkerPool, WorkUnit

    units = [
        WorkUnit(
            kernel_problem,
            m,
            tuple(
                dict.fromkeys(
                    pick
                    for name, pick in plan.picks[m].items()
                    if plan.kernel_of(name) == kernel_problem
                )
            ),
            "full",
        )
        for kernel_problem in dict.fromkeys(plan.problems.values())
        for m in plan.sizes
    ]
    units = [unit for unit in units if unit.candidates]
    warm = [WorkUnit(u.problem, u.batch_size, (c,), "warm") for u in units for c in u.candidates]
    timings: dict[tuple[Any, int, Any], Any] = {}
    rounds: dict[int, Any] = {}
    workers = default_compile_workers(devices)
    with WorkerPool(list(devices), compile_workers=workers, timeout_s=timeout_s) as pool:
        if workers:
            for _ in pool.run(warm):  # compile everything in parallel first; timing decides
                pass
        if repeat > 1:
            rounds = _time_rounds(pool, plan.problems, plan.timed_on, plan.picks, repeat)
        else:
            for unit, outcome in pool.run(units):
                timings[(unit.problem, unit.batch_size, outcome.candidate)] = outcome
    if repeat > 1:
        baselines_of = {name: plan.baselines_of(name) for name in plan.names}
        references = plan.references()
        return [
            _repeated_row(m, plan.names, plan.picks[m], rounds[m], baselines_of, references)
            for m in plan.sizes
        ]
    return [_timed_row(plan, m, timings) for m in plan.sizes]


def _timed_row(plan: BenchPlan, m: int, timings: dict[tuple[Any, int, Any], Any]) -> dict:
    """One batch size's row of one timing per column."""
    from moetune.engines.tuned_file import describe

    row: dict[str, Any] = {"batch_size": m}
    for name in plan.names:
        candidate = plan.picks[m].get(name)
        if candidate is None:
            row[name] = {"config": None, "status": "no runnable config", "latency_us": None}
            continue
        outcome = timings[(plan.kernel_of(name), m, candidate)]
        row[name] = {
            **describe(candidate),
            "status": outcome.status,
            "latency_us": outcome.latency_us,
            "p20_us": outcome.p20_us,
            "p80_us": outcome.p80_us,
            "error": outcome.error,
        }
    return row


def _geomeans(plan: BenchPlan, rows: list[dict]) -> dict[str, dict[str, float | None]]:
    """Each file's geomean speedup over the baselines timed on its own kernel only."""
    from moetune.tune.baselines import geomean_speedup

    return {
        name: {
            key: geomean_speedup(
                [(row[key]["latency_us"], row[name]["latency_us"]) for row in rows]
            )
            for key in plan.baselines_of(name)
        }
        for name in plan.files
    }


def _print_results(plan: BenchPlan, rows: list[dict], geomeans: dict, repeat: int) -> None:
    """The table, the geomean speedups and where each column's config comes from."""
    # Files are columns "file 1", "file 2"...: their names, too long for a column, are
    # listed whole under the table.
    labels = {b.key: b.label for b in plan.baselines}
    labels |= {name: f"file {index}" for index, name in enumerate(plan.files, 1)}
    if repeat > 1:
        _print_repeated(rows, plan.names, labels, plan.title, repeat, plan.references())
    else:
        _print_table(rows, plan.names, labels, plan.title, plan.references())
    if plan.harness == "pair":
        click.echo(HARNESS_NOTE)
    for name, speedups in geomeans.items():
        parts = [
            f"{value:.2f}x over the {labels[key]}"
            for key, value in speedups.items()
            if value is not None
        ]
        click.echo(f"Geomean speedup of {labels[name]}: {'; '.join(parts) or '-'}.")
    for b in plan.baselines:
        click.echo(f"  {b.label}: {b.source}")
    for name in plan.files:
        click.echo(f"  {labels[name]}: {name}")


def _time_rounds(
    pool: Any,
    problems: dict[str, Any],
    timed_on: dict[str, str],
    picks: dict[int, dict[str, Any]],
    repeat: int,
) -> dict[int, Any]:
    """``--repeat``'s interleaved rounds, each kernel's columns on that kernel, gathered
    into one `Confirmation` per batch size (rounds pair up within a kernel only)."""
    from moetune.tune.confirm import Confirmation, time_rounds

    merged: dict[int, dict[str, Any]] = {m: {} for m in picks}
    configs: dict[int, dict[str, Any]] = {m: {} for m in picks}
    for kernel_problem in dict.fromkeys(problems.values()):
        named = {
            m: {
                name: pick
                for name, pick in row.items()
                if pick is not None and problems[timed_on[name]] == kernel_problem
            }
            for m, row in picks.items()
        }
        for m, confirmation in time_rounds(pool, kernel_problem, named, repeat).items():
            merged[m] |= dict(confirmation.timings_us)
            configs[m] |= dict(confirmation.configs)
    return {m: Confirmation(m, merged[m], configs[m]) for m in picks}


def _repeated_row(
    m: int,
    names: list[str],
    picks: dict[str, Any],
    confirmation: Any,
    baselines_of: dict[str, list[str]],
    references: dict[str, str],
) -> dict[str, Any]:
    """One batch size of ``--repeat``: per config its median over the rounds with its
    interval and each round's time; per config that is not a baseline, its speedup over
    each baseline timed on its kernel (baseline median / its median) with the paired
    interval, and over its reference column (`references`)."""
    from moetune.engines.tuned_file import describe

    row: dict[str, Any] = {"batch_size": m}
    for name in names:
        if picks.get(name) is None:
            row[name] = {"config": None, "status": "no runnable config", "latency_us": None}
            continue
        median = confirmation.median(name)
        entry = {
            **describe(picks[name]),
            "status": "ok" if median is not None else "failed in every round",
            "latency_us": None if median is None else median.value,
            "latency_interval_us": None if median is None else [median.low, median.high],
            "rounds_us": list(confirmation.timings_us[name]),
        }
        if name not in baselines_of[name]:
            entry["speedup"] = {
                key: None if (ratio := confirmation.ratio(key, name)) is None else ratio.to_json()
                for key in baselines_of[name]
                if key in confirmation.timings_us
            }
        row[name] = entry
    for name in names:
        reference = references[name]
        if (
            name != reference
            and reference in confirmation.timings_us
            and name in confirmation.timings_us
            and row[name]["latency_us"] is not None
        ):
            ratio = confirmation.ratio(reference, name)
            row[name]["ratio_to_reference"] = None if ratio is None else ratio.to_json()
    return row


def _speedup_over(names: list[str], labels: dict[str, str], references: dict[str, str]) -> str:
    """The tables' words for the columns speedups are taken over (`references`' targets)."""
    over = sorted({references[name] for name in names}, key=names.index)
    said = " or ".join(f"the {labels[name]}" for name in over)
    return said + (", each on its own kernel" if len(over) > 1 else "")


def _print_repeated(
    rows: list[dict[str, Any]],
    names: list[str],
    labels: dict[str, str],
    title: str,
    repeat: int,
    references: dict[str, str],
) -> None:
    """The ``--repeat`` table: median us [interval], and the speedup over its `references`
    column (the first fallback timed on the same kernel) with its interval."""
    from rich.console import Console
    from rich.table import Table

    from moetune.commands.terminal import print_table

    said = _speedup_over(names, labels, references)
    table = Table(
        title=f"{title}: median us of {repeat} interleaved rounds [95 % interval] "
        f"(speedup over {said} [95 % interval])"
    )
    table.add_column("M", justify="right")
    for name in names:
        table.add_column(labels[name], justify="right")
    for row in rows:
        cells = [str(row["batch_size"])]
        for name in names:
            entry = row[name]
            if entry["latency_us"] is None:
                cells.append(entry["status"])
                continue
            low, high = entry["latency_interval_us"]
            cell = f"{entry['latency_us']:.1f} [{low:.1f}-{high:.1f}]"
            ratio = entry.get("ratio_to_reference")
            if ratio is not None:
                cell += f" ({ratio['value']:.3f}x [{ratio['low']:.3f}-{ratio['high']:.3f}])"
            cells.append(cell)
        table.add_row(*cells)
    print_table(Console(highlight=False), table)


_ENGINE_LABEL = {"vllm": "vLLM", "sglang": "SGLang"}


def _file_engines(
    files: dict[str, Any], engines: tuple[str, ...], one_kernel: bool
) -> tuple[dict[str, str], list[str]]:
    """The engine whose kernel each --config file is timed on, and a note for each file
    whose engine cannot be read from it (where the engines' kernels differ).

    SGLang's: a file with a ``_down`` table, or under SGLang's ``triton_<version>`` folder;
    vLLM's: a file with vLLM's ``"triton_version"`` key. Else the first engine's.
    """
    import re

    found: dict[str, str] = {}
    notes: list[str] = []
    for name, tuned in files.items():
        engine = None
        if tuned.down is not None or any(
            re.fullmatch(r"triton_\d+_\d+_\d+", part) for part in Path(name).parts
        ):
            engine = "sglang"
        elif _has_version_key(Path(name)):
            engine = "vllm"
        if engine not in engines:
            if engine is None and not one_kernel:
                notes.append(
                    f"--config {name}: neither engine's by its content or folder (no _down "
                    "table, no triton_version key, not under triton_<version>/): timed on "
                    f"{_ENGINE_LABEL[engines[0]]}'s kernel"
                )
            engine = engines[0]
        found[name] = engine
    return found, notes


def _has_version_key(path: Path) -> bool:
    from moetune.engines.tables import VERSION_KEY

    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(payload, dict) and VERSION_KEY in payload


def _described(pick: Any) -> dict[str, Any]:
    from moetune.engines.tuned_file import describe

    return {"config": None} if pick is None else describe(pick)


def _mismatches(paths: tuple[Path, ...], problem: Any, resolved: Any, model: str) -> list[str]:
    """For each file whose name says another shape, GPU, dtype or block shape than the
    engines' names for `problem` on this device: what differs, in one line."""
    from moetune.engines.names import config_file_fields
    from moetune.tune.output import engine_file_path

    names = [
        engine_file_path(engine, problem, resolved.device_name, resolved.triton_version, ".").name
        for engine in ("vllm", "sglang")
    ]
    wanted = [config_file_fields(name) for name in names]
    found = []
    for path in paths:
        given = config_file_fields(path.name)
        if given is None:
            found.append(
                f"{path.name}: not an engine file name (E=..,N=..,device_name=...json), so its "
                f"shape cannot be checked against {model}, {resolved.split}"
            )
            continue
        best = min(wanted, key=lambda want: sum(given[k] != want[k] for k in given))
        differ = [key for key in given if given[key] != best[key]]
        if differ:
            said = ", ".join(_field(key, given[key]) for key in differ)
            runs = ", ".join(_field(key, best[key]) for key in differ)
            found.append(
                f"{path.name} names {said}, but {model}, {resolved.split} on this machine is {runs}"
            )
    return found


def _field(key: str, value: str) -> str:
    return f"no {key}" if value == "-" else f"{key}={value}"


def _print_table(
    rows: list[dict[str, Any]],
    names: list[str],
    labels: dict[str, str],
    title: str,
    references: dict[str, str],
) -> None:
    """The table; each column's speedup is over its `references` column (the first
    fallback timed on the same kernel)."""
    from rich.console import Console
    from rich.table import Table

    from moetune.commands.terminal import print_table

    said = _speedup_over(names, labels, references)
    table = Table(title=f"{title}: us per call (speedup over {said})")
    table.add_column("M", justify="right")
    for name in names:
        table.add_column(labels[name], justify="right")
    for row in rows:
        cells = [str(row["batch_size"])]
        for name in names:
            entry = row[name]
            reference = references[name]
            base = row[reference]["latency_us"]
            if entry["latency_us"] is None:
                cells.append(entry["status"])
            elif name == reference or base is None:
                cells.append(f"{entry['latency_us']:.1f}")
            else:
                cells.append(f"{entry['latency_us']:.1f} ({base / entry['latency_us']:.2f}x)")
        table.add_row(*cells)
    print_table(Console(highlight=False), table)


HARNESS_NOTE = (
    "Timed as SGLang runs a split file: up and down configs, routing outside the graph "
    "(every column alike)."
)


def _print_plan(picks: dict[int, dict[str, Any]], title: str, harness: str) -> None:
    from rich.console import Console

    from moetune.commands.terminal import print_wrapped

    console = Console(highlight=False, soft_wrap=True)
    print_wrapped(
        console, f"Would time {title}, per batch size (BLOCK M/N/K, GROUP, warps, stages):"
    )

    def shown(name: str) -> str:
        return Path(name).name if name != "default" else "default"

    width = max((len(shown(name)) for configs in picks.values() for name in configs), default=0)
    for m, configs in picks.items():
        # One config a line under its batch size: a file name and its config stay together.
        for number, (name, candidate) in enumerate(configs.items()):
            label = f"M={m}" if not number else ""
            line = f"  {label:<7} {shown(name):<{width}}  {candidate.short()}"
            print_wrapped(console, line, " " * 12)
    if harness == "pair":
        print_wrapped(console, HARNESS_NOTE)
