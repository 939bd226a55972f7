"""`moetune extract`: a model's MoE shape, its per-rank shard and the engines' file names."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import click

from moetune.commands.options import (
    ListParam,
    allow_huge_shape_option,
    complete_model,
    device_name_option,
    mappings_options,
)
from moetune.engines.names import DTYPE_CHOICES, VLLM_SEARCH_PATH

if TYPE_CHECKING:
    from moetune.extract.report import ExtractReport


@click.command()
@click.option(
    "--model",
    "-m",
    required=True,
    shell_complete=complete_model,
    help="Hugging Face repo id (org/name), a model directory, or a config.json path.",
)
@click.option(
    "--tp",
    type=ListParam(click.IntRange(min=1), "N", many=False),
    default=1,
    show_default=True,
    help="GPUs one MoE layer is split over: the engine's TP size "
    "(vLLM with data parallelism: TP x DP, which its MoE layers span).",
)
@click.option(
    "--ep",
    is_flag=True,
    help="vLLM's --enable-expert-parallel: experts split over the --tp ranks, full intermediate.",
)
@click.option(
    "--ep-size",
    type=ListParam(click.IntRange(min=1), "K", many=False),
    default=None,
    help="SGLang's --ep-size K: E/K experts per rank, intermediate split over tp/K.",
)
@click.option(
    "--dtype",
    type=click.Choice(DTYPE_CHOICES, case_sensitive=False),
    default="auto",
    show_default=True,
    help="Kernel dtype; auto reads the checkpoint's quantization_config.",
)
@device_name_option
@click.option(
    "--revision",
    default=None,
    help="Hub revision (branch, tag or commit); skips the bundled snapshot.",
)
@allow_huge_shape_option
@mappings_options
@click.option("--json", "json_", is_flag=True, help="Print JSON for scripts instead of tables.")
def extract(
    model: str,
    tp: int,
    ep: bool,
    ep_size: int | None,
    dtype: str,
    device_name: str | None,
    revision: str | None,
    allow_huge_shape: bool,
    mappings: str | None,
    replace_mappings: bool,
    json_: bool,
) -> None:
    """Show a model's MoE shape, its per-GPU shard and the tuned-config file names.

    Reads config.json only (no weights, no GPU, never remote code): from a
    path, the Hugging Face cache, moetune's bundled snapshots, or the Hub.

    \b
    Examples:
        moetune extract --model moonshotai/Kimi-K3 --tp 8 --ep
        moetune extract --model deepseek-ai/DeepSeek-V3 --tp 8 --json
        moetune extract --model ./my-model/ --tp 4 --ep-size 2
        moetune extract --model my-org/New-MoE --mappings my_mappings.yaml
    """
    if ep and ep_size is not None:
        raise click.UsageError(
            "--ep (vLLM: EP size = TP size) and --ep-size (SGLang) both set the EP size; pass one"
        )
    if replace_mappings and mappings is None and not os.environ.get("MOETUNE_MAPPINGS"):
        raise click.UsageError("--replace-mappings needs --mappings FILE (or $MOETUNE_MAPPINGS)")
    from moetune.extract.report import build_report

    report = build_report(
        model,
        tp=tp,
        ep=ep,
        ep_size=ep_size,
        dtype=dtype.lower(),
        device_name=device_name,
        revision=revision,
        mappings=mappings,
        replace_mappings=replace_mappings,
        allow_huge_shape=allow_huge_shape,
    )
    if json_:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        _print_tables(report)


def _layout(tp: int, ep_size: int) -> str:
    if tp == 1:
        return "--tp 1: one GPU holds the whole MoE block"
    if ep_size == 1:
        return f"--tp {tp}, no EP: all experts on every rank, intermediate split {tp} ways"
    if ep_size == tp:
        return (
            f"--tp {tp} with EP {ep_size} (vLLM --enable-expert-parallel = SGLang --ep-size {tp})"
        )
    return f"--tp {tp} --ep-size {ep_size} (SGLang): intermediate split {tp // ep_size} ways"


def _table(*columns: str) -> Any:
    """A borderless rich table: names, values and config paths stay whole; only the
    meaning wraps (at spaces)."""
    from rich.table import Table

    grid = Table(box=None, pad_edge=False)
    for column in columns:
        grid.add_column(
            column,
            no_wrap=column != "meaning",
            justify="right" if column == "value" else "left",
        )
    return grid


def _print_tables(report: ExtractReport) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.text import Text

    from moetune.commands.terminal import print_table, print_wrapped

    console = Console(highlight=False, soft_wrap=True)

    def show(markup: str) -> None:
        # wrapped at spaces, names and paths whole (a long value hangs under its label)
        print_wrapped(console, Text.from_markup(markup))

    extraction, shape, local = report.extraction, report.extraction.shape, report.sharded
    show(f"[bold]{escape(report.model)}[/bold]: {escape(report.loaded.description)}")
    identity = extraction.architecture or "no architectures"
    if extraction.model_type:
        identity += f" (model_type {extraction.model_type})"
    show(f"{escape(identity)}, registry entry [bold]{escape(extraction.entry)}[/bold]")
    if extraction.guessed:
        show("[bold red]GUESSED[/bold red]: generic fallback entry, check every value")

    show("\n[bold]MoE block[/bold] (whole model)")
    values = _table("parameter", "value", "from")
    for name, value in shape.to_dict().items():
        source = extraction.sources.get(name, "")
        if extraction.guessed and source:
            source += " (guessed)"
        values.add_row(name, "-" if value is None else escape(str(value)), escape(source))
    print_table(console, values)

    show(f"\n[bold]Per GPU rank[/bold]: {escape(_layout(local.tp_size, local.ep_size))}")
    per_rank = _table("quantity", "value", "meaning")
    for row in _per_rank_rows(report):
        per_rank.add_row(*(escape(str(cell)) for cell in row))
    print_table(console, per_rank)
    _print_engine_facts(console, report)


def _per_rank_rows(report: ExtractReport) -> list[tuple[str, Any, str]]:
    """The per-rank table's rows: (quantity, value, meaning)."""
    local, kernel = report.sharded, report.kernel_dtype
    if kernel.engine_dtype:
        dtype_value, dtype_meaning = kernel.engine_dtype, f"from {kernel.reason}"
    else:
        dtype_value = kernel.activation_dtype
        dtype_meaning = f"no dtype in the file names; from {kernel.reason}"
    rows: list[tuple[str, Any, str]] = [
        ("local_experts", local.local_experts, "E of the file names"),
        ("local_intermediate_size", local.intermediate_size, "N of the file names"),
        ("expert_hidden_size", local.hidden_size, "K of the kernel"),
        (
            "w1",
            f"[{local.local_experts}, {local.w1_width}, {local.hidden_size}]",
            "gate+up [E, 2N, K]",
        ),
        (
            "w2",
            f"[{local.local_experts}, {local.hidden_size}, {local.intermediate_size}]",
            "down [E, K, N]",
        ),
        ("top_k", local.top_k, "experts per token"),
        ("kernel dtype", dtype_value, dtype_meaning),
    ]
    if kernel.block_shape:
        meaning = "group size [0, g]" if not all(kernel.block_shape) else "fp8 weight block [n, k]"
        rows.append(("block_shape", list(kernel.block_shape), meaning))
    if kernel.per_channel:
        rows.append(("per_channel_quant", True, "per-channel weights, per-token activations"))
    if kernel.static_activations:
        rows.append(("activation scales", "static", "from the checkpoint"))
    return rows


def _print_engine_facts(console: Any, report: ExtractReport) -> None:
    """What each engine runs (quantization, backend), the file names it reads, the notes."""
    from rich.markup import escape
    from rich.text import Text

    from moetune.commands.terminal import print_wrapped
    from moetune.extract.report import backend_lines, quant_lines

    def show(markup: str) -> None:
        print_wrapped(console, Text.from_markup(markup))

    quant = quant_lines(report)
    if quant:
        show("\n[bold]Quantization[/bold] (what each engine runs for this checkpoint)")
        for line in quant:
            show(escape(line))

    backends = backend_lines(report)
    if backends:
        show(
            "\n[bold]Backend[/bold] (what each engine runs by default for these experts, "
            "from its selection code)"
        )
        for line in backends:
            show(f"  {escape(line)}")

    show(
        f"\n[bold]Tuned-config files[/bold] for {escape(report.device.name)} ({report.device.source})"
    )
    show(f"  vLLM    {escape(report.vllm_config_file)}")
    show(f"          read from {VLLM_SEARCH_PATH}")
    show(f"  SGLang  {escape(report.sglang_config_file)}")
    show(f"          read from {escape(report.sglang_config_dir)}")
    if report.notes:
        show("\n[bold]Notes[/bold]")
        for note in report.notes:
            show(f"  - {escape(note)}")
