"""`moetune check`: does each engine already have a tuned file for this model, GPU and layout?"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import click

from moetune.commands.options import (
    compare_dir_option,
    complete_vllm_release,
    engine_option,
    model_options,
)

# A Triton release as SGLang names its folders after it: 3.4.0, 3.5.0rc1, 3.3.1+git3b1c9b2b.
TRITON_VERSION = re.compile(r"\d+\.\d+\.\d+(?:[.+-]?[0-9A-Za-z]+)*")
# Exit status when an engine has no usable file, missing or invalid (0: every engine has
# one). Listed in moetune/cli.py.
EXIT_MISSING = 4


def check_triton_version(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> str | None:
    """Click callback of --triton-version: a release number, as `pip show triton` prints it."""
    if value is not None and not TRITON_VERSION.fullmatch(value.strip()):
        raise click.BadParameter(
            f"{value!r} is not a Triton version (X.Y.Z, as `pip show triton` prints it, "
            "e.g. 3.4.0)",
            ctx,
            param,
        )
    return None if value is None else value.strip()


@click.command("check")
@model_options
@engine_option("Which engine's lookup to check.")
@click.option(
    "--triton-version",
    callback=check_triton_version,
    help="Triton version SGLang's folder is named after (default: the installed triton's, "
    "read from package metadata).",
)
@compare_dir_option(
    "Also look in DIR, before the engines' own folders (a flat folder of tuned files)."
)
@click.option(
    "--compare-only",
    is_flag=True,
    help="Look only in --compare-dir (ignore the env vars and installed engines).",
)
@click.option(
    "--vllm-release",
    metavar="X.Y.Z",
    shell_complete=complete_vllm_release,
    help="The vLLM release whose rules the vLLM file is checked by (default: the installed "
    "vLLM's, else the newest moetune knows): which entry keys it accepts, whether it reads "
    "a _down file.",
)
@click.option("json_", "--json", is_flag=True, help="Print JSON for scripts instead of text.")
def check(
    engine: str,
    triton_version: str | None,
    vllm_release: str | None,
    compare_dir: Path | None,
    compare_only: bool,
    json_: bool,
    **model: Any,
) -> None:
    """Show which tuned file each engine would load for a model, and its fallback.

    For vLLM and SGLang: the exact file name, the folders the engine searches in
    its order ($VLLM_TUNED_CONFIG_FOLDER, $SGLANG_MOE_CONFIG_DIR, the installed
    engine's configs; SGLang also tries other configs/triton_X_Y_Z folders, newest
    first, and a _down file for the second GEMM), whether the file is there, the
    engine's fallback config otherwise, and the `moetune tune` command that fills
    the gap. Needs no GPU and never imports torch, triton or the engines.

    A file that is there but is no table the engine reads (not JSON, a key that
    is not a batch size, a value out of range...) is shown as INVALID, with the
    file, the key and what is wrong.

    Each engine's default MoE backend for the checkpoint, layout and GPU family
    (Hopper, Blackwell) is named, for the installed release, else the current
    one. Where it reads no tuned Triton file (Marlin, FlashInfer, CUTLASS...),
    the engine needs none: nothing to tune.

    \b
    Exit status: 0 every engine has a usable file or reads none; 4 an engine's
    file is missing or INVALID (a missing SGLang _down file alone does not count:
    SGLang reuses the up config; an invalid one does).

    \b
    Examples:
        moetune check --model Qwen/Qwen3-30B-A3B --tp 1 --device-name "NVIDIA H200"
        moetune check --model deepseek-ai/DeepSeek-V3 --tp 8 --engine sglang --json
    """
    _check_usage(model, compare_dir, compare_only=compare_only)
    from moetune.engines.check import check_engines
    from moetune.engines.formats import engines_named
    from moetune.engines.names import installed_triton_version

    report = _report(model)
    triton_source = "--triton-version"
    if triton_version is None:
        triton_version = installed_triton_version()
        triton_source = "installed" if triton_version else "triton is not installed"
    engines = engines_named(engine)
    checks = check_engines(
        report,
        engines,
        triton_version,
        dict(model, vllm_release=vllm_release),
        compare_dir=compare_dir,
        compare_only=compare_only,
    )
    checks = [_follow_backend(report, item, model) for item in checks]
    present = all(item.present for item in checks)
    if json_:
        document = _check_json(report, checks, triton_version, triton_source)
        click.echo(json.dumps(document, indent=2))
    else:
        _print(report, checks, triton_version, triton_source)
    if not present:
        raise click.exceptions.Exit(EXIT_MISSING)


def _check_usage(model: dict[str, Any], compare_dir: Path | None, *, compare_only: bool) -> None:
    """The option combinations `check` refuses (usage errors, exit 2)."""
    if model.get("ep") and model.get("ep_size") is not None:
        raise click.UsageError("--ep (vLLM) and --ep-size (SGLang) both set the EP size; pass one")
    if compare_only and compare_dir is None:
        raise click.UsageError("--compare-only needs --compare-dir DIR")
    if model.get("replace_mappings") and not model.get("mappings"):
        if not os.environ.get("MOETUNE_MAPPINGS"):
            raise click.UsageError(
                "--replace-mappings needs --mappings FILE (or $MOETUNE_MAPPINGS)"
            )


def _report(model: dict[str, Any]) -> Any:
    """The model's extraction report for the layout the options name (no torch)."""
    from moetune.extract.report import build_report

    return build_report(
        model["model"],
        tp=model["tp"],
        ep=model["ep"],
        ep_size=model.get("ep_size"),
        dtype=model["dtype"],
        device_name=model.get("device_name"),
        revision=model.get("revision"),
        mappings=model.get("mappings"),
        replace_mappings=model.get("replace_mappings", False),
        allow_huge_shape=model.get("allow_huge_shape", False),
    )


def _check_json(
    report: Any, checks: list, triton_version: str | None, triton_source: str
) -> dict[str, Any]:
    """What `check --json` prints."""
    local = report.sharded
    return {
        "model": report.model,
        "tp_size": local.tp_size,
        "ep_size": local.ep_size,
        "local_experts": local.local_experts,
        "local_intermediate_size": local.intermediate_size,
        "hidden_size": local.hidden_size,
        "top_k": local.top_k,
        "engine_dtype": report.kernel_dtype.engine_dtype,
        "block_shape": None
        if report.kernel_dtype.block_shape is None
        else list(report.kernel_dtype.block_shape),
        "device_name": report.device.name,
        "device_name_source": report.device.source,
        "triton_version": triton_version,
        "triton_version_source": triton_source,
        "gpu_family": report.gpu_family,
        "all_present": all(item.present for item in checks),
        "nothing_to_tune": not any(item.needs_file for item in checks),
        "engines": [
            {**item.to_dict(), "backend": _backend_dict(report, item.engine)} for item in checks
        ],
        "notes": list(report.notes),
    }


def _follow_backend(report: Any, item: Any, options: dict[str, Any]) -> Any:
    """`item` with no file needed where the engine's default backend for these experts on
    this GPU reads no tuned Triton file (moetune/data/backends.yaml): nothing to tune.

    Under ``--dtype auto`` only: an explicit --dtype asks about that kernel's file.
    """
    from dataclasses import replace

    choice = report.backend_for(item.engine)
    if choice is not None and choice.reads_files and item.needs_file:
        # The table knows this GPU: its backend reads the file, whatever the quantization
        # rules say of the engine's usual kernel for the checkpoint.
        return replace(item, kernel_note=None)
    if not item.needs_file or choice is None or choice.reads_files:
        return item
    if options.get("dtype", "auto") != "auto":
        return item
    note = f"{choice.summary()}: nothing to tune ({choice.citation})"
    switch = _triton_switch(report, item.engine)
    if switch:
        note += f"; the file is read only on the Triton path: {switch}"
    return replace(item, needs_file=False, kernel_note=note)


def _triton_switch(report: Any, engine: str) -> str | None:
    """How to make `engine` run the Triton kernel for these experts (quant_rules.yaml)."""
    quant, plans = report.quant, report.engine_plans or {}
    if quant is None or quant.experts is None:
        return None
    plan = plans.get(quant.experts.name, {}).get(engine)
    return plan.triton if plan is not None and plan.file_name else None


def _backend_dict(report: Any, engine: str) -> dict[str, Any] | None:
    choice = report.backend_for(engine)
    return None if choice is None else choice.to_dict()


def _print_down(item: Any, echo: Any) -> None:
    """The `_down` file vLLM 0.34 reads beside the engine's file, where it reads one."""
    down = item.down
    if down.invalid:
        echo(f"  _down file INVALID: {down.invalid}")
    elif down.present:
        picked = f" (folder {down.triton_folder})" if down.triton_folder else ""
        echo(f"  _down file FOUND: {down.found}{picked}")
    else:
        echo(f"  _down file {down.file_name} missing: {down.fallback}")
    if item.down_note:
        echo(f"  ({item.down_note})")


def _print(report: Any, checks: list, triton_version: str | None, triton_source: str) -> None:
    from moetune.engines.check import fallback_lines
    from moetune.engines.formats import engine_label

    local, kernel = report.sharded, report.kernel_dtype
    dtype = kernel.engine_dtype or kernel.activation_dtype
    if kernel.block_shape:
        dtype += f" block {list(kernel.block_shape)}"
    split = f"TP{local.tp_size}" + (f" EP{local.ep_size}" if local.ep_size > 1 else "")
    triton = f"Triton {triton_version} ({triton_source})" if triton_version else triton_source
    from rich.console import Console

    from moetune.commands.terminal import print_wrapped

    console = Console(highlight=False, soft_wrap=True)

    def echo(line: str) -> None:
        print_wrapped(console, line)

    echo(
        f"{report.model}, {split}: E={local.local_experts}, N={local.intermediate_size}, "
        f"K={local.hidden_size}, top-k {local.top_k}, {dtype}"
    )
    echo(f"GPU {report.device.name} ({report.device.source}); {triton}")
    for item in checks:
        lookup = item.lookup
        label = engine_label(item.engine)
        echo("")
        echo(f"{label}: {lookup.file_name}")
        echo("  looks in, in order:")
        if not lookup.searched:
            echo("    nowhere:")
        for number, path in enumerate(lookup.searched, 1):
            mark = "  <- found" if lookup.found is not None and str(lookup.found) == path else ""
            echo(f"    {number}. {path}{mark}")
        for note in lookup.notes:
            echo(f"  ({note})")
        choice = report.backend_for(item.engine)
        if choice is not None and choice.summary() not in (item.kernel_note or ""):
            echo(f"  backend: {choice.summary()} ({choice.citation})")
        if item.kernel_note:
            echo(f"  note: {item.kernel_note}")
        if not item.needs_file:
            continue
        if lookup.invalid:
            echo(f"  INVALID: {lookup.invalid}")
        elif lookup.present:
            picked = f" (folder {lookup.triton_folder})" if lookup.triton_folder else ""
            echo(f"  FOUND: {lookup.found}{picked}")
        else:
            echo(f"  MISSING: {label} runs {lookup.fallback}:")
            for line in fallback_lines(item.fallback):
                echo(f"    {line}")
        if item.down is not None:
            _print_down(item, echo)
        if not item.present:
            action = "to replace it" if item.invalid else "to fill the gap"
            echo(f"  {action}: {item.tune_command}")
    echo("")
    gaps = [item for item in checks if not item.present]
    missing = [engine_label(item.engine) for item in gaps if not item.invalid]
    invalid = [engine_label(item.engine) for item in gaps if item.invalid]
    if gaps:
        parts = [f"Missing for {', '.join(missing)}"] if missing else []
        parts += [f"{'i' if parts else 'I'}nvalid file for {', '.join(invalid)}"] if invalid else []
        echo(f"{'; '.join(parts)} (exit status 4).")
    elif all(item.needs_file for item in checks):
        echo("Every engine has its file (exit status 0).")
    elif not any(item.needs_file for item in checks):
        echo("Nothing to tune: no engine reads a tuned Triton file here (exit status 0).")
    else:
        echo("No engine is missing a file it reads (exit status 0).")
