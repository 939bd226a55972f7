"""`moetune benchmark`: time tuned config files against the engines' own configs, side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from moetune.commands.options import (
    MAX_TIMEOUT_S,
    GpuList,
    Seconds,
    batch_size_option,
    batch_sizes_of,
    default_compile_workers,
    model_options,
    problem_from_options,
    worker_devices,
)
from moetune.engines.launch import BENCHMARK_KERNEL_HELP, KERNEL_CHOICES


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
@click.option(
    "--gpus", type=GpuList(), help="Comma-separated GPU ids to use (default: every visible GPU)."
)
@click.option(
    "--engine",
    type=click.Choice(("vllm", "sglang", "both")),
    default="both",
    show_default=True,
    help="Whose fallback config and existing file to compare with (vLLM's fallback always).",
)
@click.option(
    "--compare-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Also look for the engines' existing files in DIR (searched first).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=Seconds(min=1, max=MAX_TIMEOUT_S),
    default=120.0,
    show_default=True,
    help="Seconds one measurement may take before its worker is killed.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print which config each file gives per batch size, and stop (works without a GPU).",
)
@click.option(
    "--kernel",
    type=click.Choice(KERNEL_CHOICES),
    default="auto",
    show_default=True,
    help=BENCHMARK_KERNEL_HELP,
)
@click.option("json_", "--json", is_flag=True, help="Print the results as JSON.")
def benchmark(
    config_files: tuple[Path, ...],
    batch_sizes: tuple[tuple[int, ...], ...],
    gpus: tuple[str, ...] | None,
    engine: str,
    compare_dir: Path | None,
    timeout_s: float,
    dry_run: bool,
    kernel: str,
    json_: bool,
    **model: Any,
) -> None:
    """Time --config files against the engines' own configs, per batch size.

    The baselines are what the engine runs today for this shape: vLLM's (and
    SGLang's) fallback config, and the file it would load ($VLLM_TUNED_CONFIG_FOLDER,
    $SGLANG_MOE_CONFIG_DIR, the installed engine's configs, or --compare-dir).
    Each cell shows microseconds and the speedup over the vLLM fallback.

    An SGLang file with a _down table beside it is timed as SGLang runs it: the up
    GEMM with the file's config and the down GEMM with the _down table's (TMA where
    an entry asks). Every column is then timed in that split harness.

    \b
    Example usage:
        moetune benchmark --model Qwen/Qwen3-30B-A3B --config "E=128,N=768,device_name=NVIDIA_H200.json"
    """
    from dataclasses import replace

    from moetune.engines.launch import benchmark_kernel
    from moetune.tune.baselines import engine_baselines, geomean_speedup
    from moetune.tune.runner import kernel_description
    from moetune.tune.tuned_file import as_pair, describe, load_tuned_file, same_harness
    from moetune.tune.worker import WorkerPool, WorkUnit

    files = {str(path): load_tuned_file(path) for path in config_files}
    resolved = problem_from_options(model, dry_run=dry_run)
    for note in resolved.notes:
        click.echo(f"Note: {note}", err=True)
    engines = ("vllm", "sglang") if engine == "both" else (engine,)
    timed_on, kernel_notes = benchmark_kernel(kernel, engines)
    for note in kernel_notes:
        click.echo(f"Note: {note}", err=True)
    problem = replace(resolved.problem, kernel=timed_on)
    click.echo(f"Kernel: {kernel_description(problem)}", err=True)
    sizes = batch_sizes_of(batch_sizes)
    devices = worker_devices(gpus, resolved, dry_run=dry_run)

    baselines = engine_baselines(
        problem,
        sizes,
        engines,
        resolved.device_name,
        resolved.triton_version,
        compare_dir=compare_dir,
        pair_down_tables=True,
    )
    names = [b.key for b in baselines] + list(files)
    picks: dict[int, dict[str, Any]] = {}
    for m in sizes:
        picks[m] = {b.key: b.configs[m] for b in baselines if b.configs.get(m) is not None}
        for name, tuned in files.items():
            picks[m][name] = tuned.pick(m)
    # An SGLang up + down pair is timed with the routing outside the graph; then every
    # config is, so the columns stay comparable (`moetune.tune.tuned_file`).
    harness = "whole" if same_harness(p for row in picks.values() for p in row.values()) else "pair"
    if harness == "pair":
        picks = {m: {name: as_pair(p) for name, p in row.items()} for m, row in picks.items()}
    if dry_run:
        _print_plan(picks, f"{problem.key()} on {resolved.device_name}", harness)
        return
    units = [WorkUnit(problem, m, tuple(dict.fromkeys(picks[m].values())), "full") for m in sizes]
    warm = [WorkUnit(problem, u.batch_size, (c,), "warm") for u in units for c in u.candidates]
    timings: dict[tuple[int, Any], Any] = {}
    workers = default_compile_workers(devices)
    with WorkerPool(list(devices), compile_workers=workers, timeout_s=timeout_s) as pool:
        if workers:
            for _ in pool.run(warm):  # compile everything in parallel first; timing decides
                pass
        for unit, outcome in pool.run(units):
            timings[(unit.batch_size, outcome.candidate)] = outcome

    rows = []
    for m in sizes:
        row: dict[str, Any] = {"batch_size": m}
        for name in names:
            candidate = picks[m].get(name)
            if candidate is None:
                row[name] = {"config": None, "status": "no runnable config", "latency_us": None}
                continue
            outcome = timings[(m, candidate)]
            row[name] = {
                **describe(candidate),
                "status": outcome.status,
                "latency_us": outcome.latency_us,
                "p20_us": outcome.p20_us,
                "p80_us": outcome.p80_us,
                "error": outcome.error,
            }
        rows.append(row)
    geomeans = {
        name: {
            b.key: geomean_speedup(
                [(row[b.key]["latency_us"], row[name]["latency_us"]) for row in rows]
            )
            for b in baselines
        }
        for name in files
    }
    if json_:
        report = {
            "problem": problem.key(),
            "device_name": resolved.device_name,
            "triton_version": resolved.triton_version,
            "kernel": None if problem.kernel is None else problem.kernel.as_json(),
            "harness": harness,
            "baselines": [b.to_dict() for b in baselines],
            "configs": names,
            "results": rows,
            "geomean_speedup": geomeans,
        }
        click.echo(json.dumps(report, indent=2))
        return
    labels = {b.key: b.label for b in baselines}
    _print_table(rows, names, labels, f"{problem.key()} on {resolved.device_name}")
    if harness == "pair":
        click.echo(HARNESS_NOTE)
    for name, speedups in geomeans.items():
        parts = [
            f"{value:.2f}x over the {labels[key]}"
            for key, value in speedups.items()
            if value is not None
        ]
        click.echo(f"Geomean speedup of {Path(name).name}: {'; '.join(parts) or '-'}.")
    for b in baselines:
        click.echo(f"  {b.label}: {b.source}")


def _print_table(
    rows: list[dict[str, Any]], names: list[str], labels: dict[str, str], title: str
) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{title}: us per call (speedup over the vLLM fallback)")
    table.add_column("M", justify="right")
    for name in names:
        table.add_column(labels.get(name, Path(name).name), justify="right", overflow="fold")
    for row in rows:
        base = row["vllm_fallback"]["latency_us"]
        cells = [str(row["batch_size"])]
        for name in names:
            entry = row[name]
            if entry["latency_us"] is None:
                cells.append(entry["status"])
            elif name == "vllm_fallback" or base is None:
                cells.append(f"{entry['latency_us']:.1f}")
            else:
                cells.append(f"{entry['latency_us']:.1f} ({base / entry['latency_us']:.2f}x)")
        table.add_row(*cells)
    Console(highlight=False).print(table)


HARNESS_NOTE = (
    "Timed as SGLang runs a split file: up and down configs, routing outside the graph "
    "(every column alike)."
)


def _print_plan(picks: dict[int, dict[str, Any]], title: str, harness: str) -> None:
    click.echo(f"Would time {title}, per batch size (BLOCK M/N/K, GROUP, warps, stages):")
    for m, configs in picks.items():
        cells = ", ".join(
            f"{Path(name).name if name != 'default' else 'default'} {candidate.short()}"
            for name, candidate in configs.items()
        )
        click.echo(f"  M={m:<5d} {cells}")
    if harness == "pair":
        click.echo(HARNESS_NOTE)
