"""`moetune tune`: tune the fused-MoE kernel for a model on this machine's GPUs."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from moetune.commands.options import (
    ENGINE_CHOICES,
    Machine,
    batch_size_option,
    batch_sizes_of,
    check_gpu_visible,
    compare_dir_option,
    complete_routing,
    default_compile_workers,
    engine_option,
    flag_worded,
    gpus_option,
    kernel_option,
    layouts_from_options,
    machine_from_options,
    model_options,
    quant_choice,
    timeout_option,
    vllm_release_option,
    worker_devices,
)
from moetune.commands.terminal import print_lines, print_table, say
from moetune.commands.texts import FLOOR_HELP, SEARCH_HELP
from moetune.engines.launch import KERNEL_HELP
from moetune.tune.confirm import DEFAULT_ROUNDS
from moetune.tune.request import SweepRequest
from moetune.tune.results_dir import RESULTS_ROOT

SEARCHES = ("fast", "thorough", "exhaustive")


@click.command("tune", epilog=FLOOR_HELP)
@model_options(sweep=True)
@batch_size_option
@click.option(
    "--save-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the config files and the resumable results store go (a different file "
    "already there is kept as <file>.bak-<UTC time>). "
    f"Default: ./{RESULTS_ROOT}/<model-slug>/ (a Hub id org/name becomes org__name).",
)
@engine_option("Which engine's file(s) to write.")
@click.option(
    "--search",
    type=click.Choice(SEARCHES),
    default="fast",
    show_default=True,
    help=SEARCH_HELP,
)
@click.option(
    "--space",
    "space_file",
    type=click.Path(exists=True, dir_okay=False),
    help="JSON/YAML file of the configs to search: a grid or a list (docs/search-space.md; "
    "default: vLLM's and SGLang's 1,920-config grid).",
)
@click.option(
    "--confirm-rounds",
    type=click.IntRange(min=0),
    default=DEFAULT_ROUNDS,
    show_default=True,
    help="After the search, time the configs to write and every engine baseline again over "
    "N interleaved rounds: the summary's times and speedups come from them, and at a batch "
    "size where the tuned config is not faster beyond the noise (95 % interval) each file "
    "keeps the engine's own config. 0: no confirmation (times and files from the search).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and stop (works without a GPU).")
@gpus_option
@click.option(
    "--backend",
    type=click.Choice(("local", "ray")),
    default="local",
    show_default=True,
    help="local: one worker process per GPU; ray: Ray actors (in the checkout: "
    "pip install -e '.[ray]').",
)
@click.option(
    "--compile-workers",
    type=click.IntRange(min=0),
    help="Processes compiling candidates in parallel (default: spare CPU cores, at most 16).",
)
@timeout_option(
    "Seconds one candidate may take before its worker is killed and it is recorded as hung."
)
@click.option(
    "--routing",
    default="uniform",
    shell_complete=complete_routing,
    show_default=True,
    help="uniform: random routing; or PATH: a dump of real topk_ids to replay "
    "(SGLang's --topk-ids-dir folder, or a [tokens, top_k] .pt/.npy; see docs/routing.md).",
)
@click.option(
    "--up-tma",
    is_flag=True,
    help="SGLang split tune: also try TMA on the up GEMM (read by SGLang since PR #33559).",
)
@click.option("--overwrite", is_flag=True, help="Measure again what the results store already has.")
@compare_dir_option(
    "Also compare with the tuned files in DIR (searched before the engines' own folders)."
)
@click.option(
    "--install",
    type=click.Choice(ENGINE_CHOICES),
    help="After the check against the reference, copy the files where the engine reads them: "
    "$VLLM_TUNED_CONFIG_FOLDER / $SGLANG_MOE_CONFIG_DIR if set, else the installed engine's "
    "configs folder.",
)
@click.option(
    "--install-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Install into DIR instead (prints the export line the engine then needs).",
)
@click.option(
    "--overwrite-installed",
    is_flag=True,
    help="With --install: replace a different existing file (a .bak-<time> copy is kept).",
)
@kernel_option(KERNEL_HELP)
@vllm_release_option(
    "The vLLM release the vLLM file is written for (default: the installed vLLM's, else the "
    "newest moetune knows): 0.34.0 on reads USE_TMA, which is then tuned on its kernel; a "
    "file for 0.33.0 never carries it."
)
@click.option(
    "--vllm-deepgemm",
    is_flag=True,
    help="The vLLM server runs DeepGEMM's E8M0 scales (DeepGEMM installed; vLLM's default "
    "then): also tune vLLM 0.34's <name>_down.json, read only on that path (fp8 block "
    "[128,128], sm90, hidden size >= 4096; the plan says whether it applies).",
)
@click.option("json_", "--json", is_flag=True, help="Print the plan and results as JSON.")
def tune(json_: bool, dry_run: bool, **options: Any) -> None:
    """Tune the fused-MoE kernel for a model and write vLLM/SGLang config files.

    Lists in --tp, --ep-size and --dtype sweep layouts: every combination is
    sharded, layouts whose ranks run the same shape share one tune, and layouts
    that cannot split are listed and skipped. Ctrl-C (or SIGTERM) stops the run
    with one line saying what is saved; rerun the same command to resume.

    \b
    Example usage:
        moetune tune --model Qwen/Qwen3-30B-A3B --tp 1
        moetune tune --model mistralai/Mixtral-8x7B-v0.1 --tp 2 --batch-size 64 --dry-run
        moetune tune --model Qwen/Qwen3-30B-A3B --tp 1,2,4 --dtype bf16,fp8_w8a8 --dry-run
        moetune tune --model Qwen/Qwen3-30B-A3B --tp 1 --install vllm

    The summary compares the written config, per batch size, with what the engine
    runs without it (vLLM's and SGLang's fallback configs) and with the file it
    would load today ($VLLM_TUNED_CONFIG_FOLDER, $SGLANG_MOE_CONFIG_DIR, the
    installed engine's configs, or --compare-dir), all timed in the same run.
    It is kept in <save-dir>/summary.json: `moetune report <save-dir>` shows it
    again later, with plots.
    """
    from rich.console import Console

    from moetune.tune.output import check_outputs
    from moetune.tune.sweep import sweep_json

    # --json: stdout holds only the JSON (the plan's notes included), stderr only progress.
    out = Console(quiet=json_, highlight=False)
    err = Console(stderr=True, highlight=False)
    checked = preflight(options, dry_run=dry_run)
    workers = None if dry_run else _start_workers(checked, options)
    sweep = _plan(tune_request(options, checked), checked)
    check_outputs(sweep.plans, checked.targets)  # no write through a symlink, before the work
    notes = [note for group in sweep.groups for note in group.notes] + checked.machine.notes
    notes = list(dict.fromkeys(notes + checked.kernel_notes))
    _print_plan(sweep, notes, checked.targets, out, err, json_=json_)
    if dry_run:
        if json_:
            click.echo(json.dumps({**sweep_json(sweep), "notes": notes}, indent=2))
        return
    result = _run_with_progress(sweep, err, workers)
    _print_results(result, checked, notes, out, options, json_=json_)


@dataclass(frozen=True)
class Checked:
    """What `preflight` found: the options resolved into values, before any plan."""

    layouts: tuple[Any, ...]  # moetune.extract.layouts.Layout, as asked
    resolved: Any  # moetune.extract.layouts.ResolvedLayouts
    space: tuple[Any, ...]
    space_source: str
    save_dir: Path
    engines: tuple[str, ...]
    kernels: dict[str, Any]
    kernel_notes: list[str]
    vllm_release: str | None
    vllm_release_note: str
    targets: list[Any]  # moetune.engines.install targets of --install
    machine: Machine
    devices: tuple[str | None, ...]


def preflight(options: dict[str, Any], *, dry_run: bool) -> Checked:
    """Every check that needs no plan, before the plan is made or printed: the options, the
    search space, the install targets, a GPU to time on, the model's config, the save dir
    (taken for the run) and the machine. torch is imported last, so that a bad value, a
    missing GPU or a save dir another run holds is one line within about a second. A check
    added here runs before any plan is printed."""
    from moetune.engines.formats import engines_named
    from moetune.engines.launch import resolve_kernels
    from moetune.engines.names import installed_triton_version
    from moetune.extract.layouts import resolve_layouts
    from moetune.tune.results_dir import default_save_dir

    layouts = tuple(layouts_from_options(options))
    space, space_source = _search_space(options["space_file"])
    engines = engines_named(options["engine"])
    kernels, kernel_notes = resolve_kernels(options["kernel"], engines)
    release, release_note = _vllm_file_release(options["vllm_release"], engines)
    triton_version = installed_triton_version() or "unknown"
    targets = _install_targets(options["install"], options["install_dir"], engines, triton_version)
    check_gpu_visible(options["gpus"], dry_run=dry_run)
    resolved = resolve_layouts(  # the model's config, read (a Hub id: fetched) and sharded
        str(options["model"]),
        list(layouts),
        revision=options.get("revision"),
        mappings=options.get("mappings"),
        replace_mappings=bool(options.get("replace_mappings")),
        allow_huge_shape=bool(options.get("allow_huge_shape")),
    )
    save_dir = (options["save_dir"] or default_save_dir(str(options["model"]))).absolute()
    if not dry_run:  # one run at a time per folder, from here to the end of the command
        click.get_current_context().with_resource(_holding(save_dir))
    machine = machine_from_options(options, dry_run=dry_run)  # imports torch: seconds
    devices = worker_devices(options["gpus"], machine, dry_run=dry_run)
    return Checked(
        layouts=layouts,
        resolved=resolved,
        space=space,
        space_source=space_source,
        save_dir=save_dir,
        engines=engines,
        kernels=dict(kernels),
        kernel_notes=list(kernel_notes),
        vllm_release=release,
        vllm_release_note=release_note,
        targets=targets,
        machine=machine,
        devices=tuple(devices),
    )


def tune_request(options: dict[str, Any], checked: Checked) -> SweepRequest:
    """The request the tuner takes: the command's options as values (no flag goes down)."""
    compile_workers = options["compile_workers"]
    if compile_workers is None:
        compile_workers = default_compile_workers(checked.devices)
    machine = checked.machine
    return SweepRequest(
        model=str(options["model"]),
        layouts=checked.layouts,
        batch_sizes=batch_sizes_of(options["batch_sizes"]),
        space=checked.space,
        save_dir=checked.save_dir,
        limits=machine.limits,
        revision=options.get("revision"),
        mappings=options.get("mappings"),
        replace_mappings=bool(options.get("replace_mappings")),
        allow_huge_shape=bool(options.get("allow_huge_shape")),
        quant=quant_choice(options),
        is_sweep=len(checked.layouts) > 1,
        kernels=checked.kernels,
        routing=options["routing"],
        engines=checked.engines,
        search=options["search"],
        device_name=machine.device_name,
        triton_version=machine.triton_version,
        devices=checked.devices,
        backend=options["backend"],
        compile_workers=compile_workers,
        timeout_s=options["timeout_s"],
        overwrite=options["overwrite"],
        space_source=checked.space_source,
        up_tma=options["up_tma"],
        compare_dir=options["compare_dir"],
        confirm_rounds=options["confirm_rounds"],
        vllm_release=checked.vllm_release,
        vllm_release_note=checked.vllm_release_note,
        vllm_deepgemm=options["vllm_deepgemm"],
    )


def _plan(request: SweepRequest, checked: Checked) -> Any:
    """The sweep's plans; a quantization choice the dtype refuses is said in its flag's words."""
    from moetune.dtypes import QuantChoiceError
    from moetune.tune.sweep import plan_sweep

    try:
        return plan_sweep(request, checked.resolved)
    except QuantChoiceError as exc:
        raise flag_worded(exc) from None


def _search_space(space_file: str | None) -> tuple[tuple[Any, ...], str]:
    """--space's configs, checked (docs/search-space.md), else the engines' default grid."""
    from moetune.tune.output import check_space
    from moetune.tune.search.space import default_space, load_space

    if not space_file:
        return tuple(default_space()), "vLLM/SGLang default grid"
    return tuple(check_space(load_space(space_file), space_file)), space_file


@contextlib.contextmanager
def _holding(save_dir: Path) -> Iterator[None]:
    """The save dir's lock for the run; a save dir it created is removed again if the
    command wrote nothing there (a plan that failed leaves no empty folder)."""
    from moetune.tune.dir_lock import save_dir_lock

    created = not save_dir.exists()
    try:
        with save_dir_lock(save_dir):
            yield
    finally:
        if created:
            with contextlib.suppress(OSError):
                save_dir.rmdir()  # only if empty


def _start_workers(checked: Checked, options: dict[str, Any]) -> Any:
    """The local worker processes, started now so that they load torch, Triton and CUDA
    while the plan is made; closed however the command ends (click closes its context).
    None for Ray (the run makes its backend)."""
    if options["backend"] != "local":
        return None
    from moetune.tune.measure.worker import WorkerPool

    compile_workers = options["compile_workers"]
    if compile_workers is None:
        compile_workers = default_compile_workers(checked.devices)
    workers = WorkerPool(
        list(checked.devices), compile_workers=compile_workers, timeout_s=options["timeout_s"]
    )
    click.get_current_context().call_on_close(workers.close)
    workers.start()
    return workers


def _print_plan(sweep, notes, targets, out, err, *, json_: bool) -> None:  # noqa: ANN001
    """The plan, as printed before any work (its notes on stderr; --json: in the JSON)."""
    from moetune.tune.sweep import sweep_lines

    if not json_:
        for note in notes:
            say(err, f"Note: {note}")
    print_lines(out, sweep_lines(sweep, compare=lambda plan: _compare_line(plan.request)))
    print_lines(
        out,
        (f"Install:     {t.engine} -> {t.folder} ({t.source})" for t in targets),
    )


def _print_results(result, checked, notes, out, options, *, json_: bool) -> None:  # noqa: ANN001
    """The summaries, the files each serves, what was installed (--json: one JSON document)."""
    from moetune.tune.sweep import sweep_summary_json

    if not json_:
        for group, summary in zip(result.sweep.groups, result.summaries, strict=False):
            _print_summary(summary, out)
            out.print(f"Serves: {', '.join(group.labels())}", markup=False)
        if result.sweep.is_sweep:
            _print_served(result, out)
        for note in checked.kernel_notes:  # each fallback to a twin, said again under the results
            say(out, f"Note: {note}")
    installed, exports = [], []
    for summary in result.summaries:
        done, needed = _install(checked.targets, summary, options["overwrite_installed"], out)
        installed += done
        exports += [line for line in needed if line not in exports]
    if json_:
        report = sweep_summary_json(result)
        report["notes"] = list(dict.fromkeys([*notes, *report.get("notes", [])]))
        report["installed"] = installed
        report["exports"] = exports
        click.echo(json.dumps(report, indent=2))


def _vllm_file_release(choice: str | None, engines: tuple[str, ...]) -> tuple[str | None, str]:
    """The release the vLLM file is for and why, for the plan (`moetune.engines.vllm.target_release`):
    --vllm-release, else the installed vLLM's, else the newest known."""
    from moetune.engines import vllm

    release, note = vllm.target_release(choice)
    if "vllm" not in engines:
        return release, ""
    if note is not None:
        return release, "vLLM is not installed: the newest known; --vllm-release chooses another"
    return release, "--vllm-release" if choice else "the installed vLLM's release"


def _compare_line(request) -> str:  # noqa: ANN001
    """The engine baselines the run will time (files: the path each engine would load)."""
    from moetune.tune.baselines import engine_baselines

    baselines = engine_baselines(
        request.problem,
        request.batch_sizes,
        request.engines,
        request.device_name,
        request.triton_version,
        compare_dir=request.compare_dir,
        vllm_release=request.vllm_release,
    )
    parts = [b.label if not b.key.endswith("_file") else f"{b.label} {b.source}" for b in baselines]
    if not any(b.key.endswith("_file") for b in baselines):
        parts.append("no existing engine file found")
    return ", ".join(parts)


def _headline(summary) -> str:  # noqa: ANN001
    """One line: geomean speedup over the engines' fallback and over the existing files."""
    parts = []
    for baseline in summary.baselines:
        speedup = summary.geomean_speedup(baseline.key)
        if speedup is not None:
            parts.append(f"{speedup:.2f}x over the {baseline.label}")
    if not any(b.key.endswith("_file") for b in summary.baselines):
        parts.append("no existing engine file to compare with (see `moetune check`)")
    return "Geomean speedup: " + ("; ".join(parts) if parts else "no baseline timed") + "."


def _install_targets(install, install_dir, engines, triton_version):  # noqa: ANN001, ANN202
    """Resolve and check the install folders before any tuning (fail fast)."""
    from moetune.engines.formats import engine_format, engines_named
    from moetune.engines.install import check_writable, install_target

    if install is None:
        if install_dir is not None:
            raise click.UsageError("--install-dir needs --install vllm|sglang|both")
        return []
    wanted = engines_named(install)
    missing = [name for name in wanted if name not in engines]
    if missing:
        raise click.UsageError(
            f"--install {install} needs --engine to write the {', '.join(missing)} file too"
        )
    targets = []
    for name in wanted:
        if engine_format(name).version_folder and triton_version == "unknown":
            raise click.UsageError(
                f"--install {name}: Triton is not installed, so the configs/triton_X_Y_Z folder "
                f"{engine_format(name).label} reads is unknown"
            )
        target = install_target(name, triton_version, install_dir)
        check_writable(target)
        targets.append(target)
    return targets


def _install(targets, summary, overwrite, console):  # noqa: ANN001, ANN202
    from moetune.engines.install import engine_files, install_files
    from moetune.tune.output import engine_file_path

    installed, exports = [], []
    for target in targets:
        request = summary.plan.request
        if target.engine not in request.engines:  # this shape wrote no file for that engine
            continue
        main = engine_file_path(
            target.engine,
            request.problem,
            request.device_name,
            request.triton_version,
            request.save_dir,
        )
        files = engine_files(target.engine, main, summary.files)
        for done in install_files(target, files, overwrite=overwrite):
            installed.append(
                {
                    "engine": target.engine,
                    "source": str(done.source),
                    "target": str(done.target),
                    "status": done.status,
                    "backup": None if done.backup is None else str(done.backup),
                }
            )
            backup = f" (backup: {done.backup})" if done.backup else ""
            console.print(
                f"{done.status.capitalize()} for {target.engine} ({target.source}): "
                f"{done.target}{backup}",
                markup=False,
                soft_wrap=True,
            )
        if target.export:
            exports.append(target.export)
            console.print(
                f"To use it: {target.export}  ({target.export_effect})",
                markup=False,
                soft_wrap=True,
            )
    return installed, exports


def _run_with_progress(sweep, console, backend=None):  # noqa: ANN001, ANN202 - rich stays lazy
    """Run every plan of `sweep` under one progress bar (one total, one ETA), on `backend`
    (None: the plans' own, `moetune.tune.runner.make_backend`)."""
    from moetune.commands.progress import counts_text, tune_progress
    from moetune.tune.runner import run_tune
    from moetune.tune.sweep import run_sweep
    from moetune.tune.work_meter import SweepMeter

    meters = SweepMeter(sweep.estimates())  # the estimate's seconds, every stage of every plan
    with tune_progress(console) as progress:
        task = progress.add_task("tuning", total=meters.total, status="")
        counts = {"measured": 0, "stored": 0, "failed": 0}
        label = [""]

        def show(description):  # noqa: ANN001, ANN202
            progress.update(
                task,
                total=meters.total,
                completed=meters.done,
                description=f"{label[0]}{description}",
                status=counts_text(counts["measured"], counts["stored"], counts["failed"]),
            )

        def run_one(index, plan, backend):  # noqa: ANN001, ANN202
            meter = meters.start(index)
            label[0] = f"{sweep.plan_tag(index)} " if len(sweep.plans) > 1 else ""

            def on_stage(name):  # noqa: ANN001, ANN202
                meter.stage(name)
                show(f"tuning: {name}")

            def on_measurement(m, reused):  # noqa: ANN001, ANN202
                counts["stored" if reused else "measured"] += 1
                counts["failed"] += m.status != "ok"
                meter.measured(m.kind, m.batch_size)
                show(f"tuning: {meter.current} M={m.batch_size}")

            return run_tune(plan, progress=on_measurement, backend=backend, stage=on_stage)

        result = run_sweep(sweep, run_one, backend)
        meters.finish()
        label[0] = ""
        show("tuned")
    return result


def _print_summary(summary, console) -> None:  # noqa: ANN001
    from rich.table import Table

    from moetune.tune.runner import kernel_description

    table = Table(title=f"{summary.plan.problem.shape_key()} on {summary.plan.request.device_name}")
    table.add_column("M", justify="right")
    table.add_column("config (BLOCK M/N/K, GROUP, warps, stages)")
    table.add_column("us", justify="right")
    for baseline in summary.baselines:
        table.add_column(f"{baseline.label} us (speedup)", justify="right")
    table.add_column("of roofline", justify="right")
    for row in summary.rows:
        cells = [
            str(row.batch_size),
            row.config.short() + (f" (#{row.verified_rank + 1})" if row.verified_rank else ""),
            f"{row.confirmed_us:.1f}",
        ]
        for baseline in summary.baselines:
            cells.append(_baseline_cell(row, baseline.key))
        cells.append(
            "-" if row.roofline_fraction is None else f"{100 * row.roofline_fraction:.0f} %"
        )
        table.add_row(*cells)
    print_table(console, table)
    console.print(_times_line(summary), markup=False, soft_wrap=True)
    console.print(
        f"Kernel: {kernel_description(summary.plan.problem)}", markup=False, soft_wrap=True
    )
    console.print(_headline(summary), markup=False, soft_wrap=True)
    for baseline in summary.baselines:
        console.print(f"  {baseline.label}: {baseline.source}", markup=False, soft_wrap=True)
    if summary.ceilings is not None:
        console.print(summary.ceilings.describe(summary.plan.problem.dtype), markup=False)
    for note in summary.notes:
        say(console, f"Note: {note}")
    console.print(
        f"Measured {summary.measured} candidates ({summary.reused} reused from the store) "
        f"in {summary.wall_s:.1f} s.",
        markup=False,
    )
    if summary.split:
        from moetune.tune.search.split_report import split_table

        print_table(console, split_table(summary.split))
    console.print("Wrote:", markup=False)
    for path in summary.files:  # a path per line, never wrapped: it copies whole
        console.print(f"  {path}", markup=False, soft_wrap=True)


def _baseline_cell(row, key: str) -> str:  # noqa: ANN001
    """A baseline's time and the speedup of what its engine's file holds, with the
    confirmation's interval (``*``: that file keeps the engine's own config here)."""
    base, speedup = row.baseline_time(key), row.speedup_over(key)
    if base is None or speedup is None:
        return "-"
    span = row.speedup_interval(key)
    kept = "*" if row.written_for(key.split("_", 1)[0]) != "tuned" else ""
    if span is None:
        return f"{base:.1f} ({speedup:.2f}x){kept}"
    return f"{base:.1f} ({speedup:.2f}x [{span.low:.2f}-{span.high:.2f}]){kept}"


def _times_line(summary) -> str:  # noqa: ANN001
    """Where the table's times come from."""
    rounds = summary.plan.request.confirm_rounds
    if not rounds or not any(row.confirmation for row in summary.rows):
        return "Times: the search's own timings (no confirmation round: --confirm-rounds 0)."
    kept = sum(d.kept_engine_config for row in summary.rows for d in row.decisions)
    marked = (
        f"; * marks the {kept} batch size(s) where a file keeps the engine's config" if kept else ""
    )
    return (
        f"Times: medians of {rounds} interleaved confirmation rounds; speedups of what each "
        f"engine's file holds, [95 % interval]{marked}."
    )


def _print_served(result, console) -> None:  # noqa: ANN001
    from rich.table import Table

    save_dir = result.sweep.plans[0].request.save_dir
    console.print("Files written, and the layouts each one serves, in:", markup=False)
    console.print(f"  {save_dir}", markup=False, soft_wrap=True)
    table = Table()
    table.add_column("file", no_wrap=True)
    table.add_column("layouts")
    for path, labels in result.served():
        table.add_row(str(path.relative_to(save_dir)), ", ".join(labels))
    print_table(console, table)
