"""Options the commands share: which model, how it is split, which dtype and GPU, which engine.

`problem_from_options` turns them into the kernel problem through the extract
package (config.json -> registry -> shape -> sharding -> dtype), and finds the
GPU name, its limits and the Triton version. torch is imported here only inside
functions, and only to ask about GPUs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from moetune.commands.texts import DEVICE_NAME_HELP
from moetune.dtypes import DTYPES, QuantChoice, QuantChoiceError, quant_details
from moetune.engines.launch import KERNEL_CHOICES
from moetune.engines.names import (
    DTYPE_CHOICES,
    device_name_error,
    device_name_problem,
)
from moetune.errors import TuneError

ENGINE_CHOICES = ("vllm", "sglang", "both")
# The device name of a run on the CPU (TRITON_INTERPRET=1, no GPU): in plans and files alike.
CPU_DEVICE_NAME = "cpu"


def complete_model(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Shell completion of --model: the bundled catalog's repo ids, and local paths (a
    config.json or a model folder; the shell lists them)."""
    from click.shell_completion import CompletionItem

    from moetune.extract.sources import catalog_models

    ids = [CompletionItem(model) for model in catalog_models() if model.startswith(incomplete)]
    return [*ids, CompletionItem(incomplete, type="file")]


def complete_routing(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Shell completion of --routing: ``uniform``, or a dump's path."""
    from click.shell_completion import CompletionItem

    uniform = [CompletionItem("uniform")] if "uniform".startswith(incomplete) else []
    return [*uniform, CompletionItem(incomplete, type="file")]


def complete_vllm_release(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Shell completion of --vllm-release: the vLLM releases moetune knows."""
    from click.shell_completion import CompletionItem

    from moetune.engines.installed import RELEASES, version_key

    known = sorted(RELEASES["vllm"], key=version_key)
    return [CompletionItem(release) for release in known if release.startswith(incomplete)]


def mappings_options(command: Callable) -> Callable:
    """Decorate a click command with --mappings and --replace-mappings (a user's registry)."""
    command = click.option(
        "--replace-mappings",
        is_flag=True,
        help="Use the --mappings file alone instead of merging it over the built-in one.",
    )(command)
    return click.option(
        "--mappings",
        type=click.Path(exists=True, dir_okay=False),
        default=None,
        help="Your own moe_mappings.yaml, merged over the built-in one. Env: MOETUNE_MAPPINGS.",
    )(command)


def check_device_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback of --device-name: a name that cannot go into a file name is a usage error."""
    if value is not None:
        problem = device_name_problem(value)
        if problem is not None:
            raise click.UsageError(device_name_error(value, problem), ctx)
    return value


def check_group_size(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """Click callback of --group-size: a power of two, or no tile could hold whole groups."""
    if value is not None and value & (value - 1):
        raise click.BadParameter(
            f"{value} is no power of two: an int4 tile's BLOCK_SIZE_K (a power of two) must "
            "hold whole groups, so the group size must be one too (GPTQ and AWQ use 32, 64 "
            "or 128)",
            ctx,
            param,
        )
    return value


def device_name_option(command: Callable) -> Callable:
    """Decorate a click command with --device-name (checked by `check_device_name`)."""
    return click.option("--device-name", callback=check_device_name, help=DEVICE_NAME_HELP)(command)


def allow_huge_shape_option(command: Callable) -> Callable:
    """Decorate a click command with --allow-huge-shape (lifts the size bounds of extraction)."""
    return click.option(
        "--allow-huge-shape",
        is_flag=True,
        help="Accept a MoE shape above the size bounds (the `maximum` of each parameter in "
        "moe_mappings.yaml, above every released model). Without it such a value is refused: "
        "it is almost always a wrong field or a typo, and tuning it would run for minutes "
        "before failing.",
    )(command)


class ListParam(click.ParamType):
    """Comma-separated values of `item` (a layout sweep), or exactly one where lists make no sense.

    With ``many`` the value is a tuple; without, a list is refused with a
    one-line usage error that says which command takes lists.
    """

    name = "list"

    def __init__(self, item: click.ParamType, metavar: str, *, many: bool) -> None:
        self.item, self.metavar, self.many = item, metavar, many

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return f"{self.metavar}[,...]" if self.many else self.metavar

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple) or (not isinstance(value, str) and not self.many):
            return value  # already converted (a default)
        parts = [part.strip() for part in str(value).split(",")]
        if not all(parts):
            self.fail(f"{value!r} has an empty item", param, ctx)
        if len(parts) > 1 and not self.many:
            self.fail(
                f"takes one value here, got {value!r}; lists (layout sweeps) are for "
                "`moetune tune`",
                param,
                ctx,
            )
        items = tuple(self.item.convert(part, param, ctx) for part in parts)
        return tuple(dict.fromkeys(items)) if self.many else items[0]

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> Any:
        """The item's completions (a Choice's values); in a list, of the part after the
        last comma, the parts before it kept."""
        from click.shell_completion import CompletionItem

        head, comma, last = incomplete.rpartition(",") if self.many else ("", "", incomplete)
        return [
            CompletionItem(head + comma + item.value, type=item.type, help=item.help)
            for item in self.item.shell_complete(ctx, param, last)
        ]


# The largest batch size M `tune` and `benchmark` take: 2^20 tokens in one MoE call, far
# above any engine's (their tuners stop at 4096). Beyond it a number is a typo, and its
# plan (routing, alignment buffers of M x top_k slots) would be absurd.
MAX_BATCH_SIZE = 1 << 20


class BatchSize(click.ParamType):
    """A batch size M: a whole number from 1 to `MAX_BATCH_SIZE`."""

    name = "batch size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            text = str(value).strip()
            if not (text.isascii() and text.isdigit()):
                self.fail(f"{value!r} is not a batch size (a whole number of tokens)", param, ctx)
            number = int(text)
        if not 1 <= number <= MAX_BATCH_SIZE:
            self.fail(
                f"batch size {number} is out of range: M is 1 to {MAX_BATCH_SIZE:,} tokens "
                "(the engines' tuners stop at 4096)",
                param,
                ctx,
            )
        return number


def batch_size_option(command: Callable) -> Callable:
    """Decorate a click command with --batch-size (comma-separated or repeated), the same
    rule for every command; it arrives as ``batch_sizes``, a tuple of tuples (`batch_sizes_of`)."""
    return click.option(
        "--batch-size",
        "batch_sizes",
        type=ListParam(BatchSize(), "M", many=True),
        multiple=True,
        help="Batch sizes M (comma-separated or repeated; 1 to "
        f"{MAX_BATCH_SIZE:,}). Default: the engines' 18 (1 ... 4096).",
    )(command)


def batch_sizes_of(given: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """The distinct batch sizes of --batch-size, ascending; the engines' 18 when none given."""
    from moetune.engines.lookup import ENGINE_BATCH_SIZES

    return tuple(sorted({m for sizes in given for m in sizes})) or tuple(ENGINE_BATCH_SIZES)


class Seconds(click.FloatRange):
    """A finite number of seconds in [`min`, `max`] (click's FloatRange lets inf and nan by)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return number


# The longest --timeout: a day (the worker pool refuses longer waits).
MAX_TIMEOUT_S = 86400


class GpuList(click.ParamType):
    """``--gpus``: comma-separated GPU indices (or GPU-/MIG- UUIDs), as CUDA_VISIBLE_DEVICES
    takes them; a tuple of distinct strings."""

    name = "gpus"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "ID[,...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        parts = [part.strip() for part in str(value).split(",")]
        for part in parts:
            if not (part.isdigit() or part.startswith(("GPU-", "MIG-"))):
                self.fail(
                    f"{part!r} is not a GPU index (0, 1, ...) or a GPU-/MIG- UUID", param, ctx
                )
        twice = sorted({part for part in parts if parts.count(part) > 1})
        if twice:
            self.fail(f"{value!r} names GPU {twice[0]} twice", param, ctx)
        return tuple(parts)


def gpus_option(command: Callable) -> Callable:
    """Decorate a click command with --gpus (`GpuList`)."""
    return click.option(
        "--gpus",
        type=GpuList(),
        help="Comma-separated GPU ids to use (default: every visible GPU).",
    )(command)


def timeout_option(help: str) -> Callable:
    """--timeout (arriving as ``timeout_s``): seconds, 120 by default; `help` says what it bounds."""
    return click.option(
        "--timeout",
        "timeout_s",
        type=Seconds(min=1, max=MAX_TIMEOUT_S),
        default=120.0,
        show_default=True,
        help=help,
    )


def engine_option(help: str) -> Callable:
    """--engine vllm|sglang|both, both by default; `help` says what the command does with it."""
    return click.option(
        "--engine",
        type=click.Choice(ENGINE_CHOICES),
        default="both",
        show_default=True,
        help=help,
    )


def kernel_option(help: str) -> Callable:
    """--kernel (`moetune.engines.launch.KERNEL_CHOICES`), auto by default."""
    return click.option(
        "--kernel",
        type=click.Choice(KERNEL_CHOICES),
        default="auto",
        show_default=True,
        help=help,
    )


def vllm_release_option(help: str) -> Callable:
    """--vllm-release X.Y.Z: the vLLM release the vLLM file is for (default: the installed
    vLLM's, else the newest moetune knows: `moetune.engines.vllm.target_release`)."""
    return click.option(
        "--vllm-release", metavar="X.Y.Z", shell_complete=complete_vllm_release, help=help
    )


def compare_dir_option(help: str) -> Callable:
    """--compare-dir DIR: an existing folder of tuned files; `help` says how it is searched."""
    return click.option(
        "--compare-dir",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        help=help,
    )


def worker_devices(gpus: tuple[str, ...] | None, machine: Any, *, dry_run: bool) -> tuple:
    """The workers' devices: --gpus if given (refused where no CUDA GPU is visible), else
    every visible one (`machine.devices`)."""
    from moetune.device import interpreter_requested

    if not gpus:
        return machine.devices
    if interpreter_requested():
        raise TuneError(
            f"--gpus {','.join(gpus)}: TRITON_INTERPRET=1 times on the CPU; leave --gpus out, "
            "or unset TRITON_INTERPRET to time on the GPUs"
        )
    if not dry_run and all(device is None for device in machine.devices):
        raise _gpus_refusal(gpus)
    return gpus


def _gpus_refusal(gpus: tuple[str, ...]) -> TuneError:
    return TuneError(
        f"--gpus {','.join(gpus)}: no CUDA GPU is visible here; leave --gpus out "
        "(TRITON_INTERPRET=1 times on the CPU, for testing only)"
    )


# The device files through which a process reaches a CUDA GPU: the NVIDIA driver's on Linux,
# /dev/dxg under WSL2. Where none exists no GPU can be visible, known without importing torch.
CUDA_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")


def check_gpu_visible(gpus: tuple[str, ...] | None, *, dry_run: bool) -> None:
    """Refuse a run that needs a GPU on a Linux machine without CUDA device files, before
    torch is imported (seconds): the same one line `machine_from_options` and
    `worker_devices` give after asking torch. Elsewhere, or with a device file, torch decides."""
    import sys

    if dry_run or not sys.platform.startswith("linux"):
        return
    if any(os.path.exists(path) for path in CUDA_DEVICE_FILES):
        return
    if gpus:
        raise _gpus_refusal(gpus)
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise TuneError(_no_gpu_message())


def model_options(command: Callable | None = None, *, sweep: bool = False) -> Callable:
    """Decorate a click command with --model, --revision, --tp, --ep, --ep-size, --dtype,
    --device-name, --allow-huge-shape, --mappings and --replace-mappings.

    With ``sweep=True`` (`moetune tune`), --tp, --ep-size and --dtype take
    comma-separated lists and arrive as tuples; elsewhere they take one value.
    """
    if command is None:
        return lambda command: model_options(command, sweep=sweep)
    size = click.IntRange(min=1)
    dtype = click.Choice(DTYPE_CHOICES)
    many = " Comma-separated list: one tune per distinct per-rank shape." if sweep else ""
    options = [
        click.option(
            "--model",
            "-m",
            required=True,
            shell_complete=complete_model,
            help="Hugging Face repo id, or a path to a config.json or a model folder.",
        ),
        click.option("--revision", help="Hub revision (branch, tag or commit) of the config."),
        click.option(
            "--tp",
            type=ListParam(size, "N", many=sweep),
            default="1",
            show_default=True,
            help="Tensor-parallel size the engine runs with." + many,
        ),
        click.option(
            "--ep",
            is_flag=True,
            help="vLLM expert parallelism (EP size = TP size)"
            + (", for every --tp." if sweep else "."),
        ),
        click.option(
            "--ep-size",
            type=ListParam(size, "K", many=sweep),
            help="SGLang expert-parallel size." + many,
        ),
        click.option(
            "--dtype",
            type=ListParam(dtype, "[" + "|".join(DTYPE_CHOICES) + "]", many=sweep),
            default="auto",
            show_default=True,
            help="Kernel dtype; auto follows the checkpoint (fp8 checkpoints: fp8_w8a8)." + many,
        ),
        click.option(
            "--group-size",
            type=click.IntRange(min=2),
            callback=check_group_size,
            help=f"int4_w4a16 weight group size along K (default: the checkpoint's, else "
            f"{DTYPES['int4_w4a16'].default_group_size}).",
        ),
        click.option(
            "--per-channel-quant",
            is_flag=True,
            help="fp8_w8a8 with per-output-channel weight scales and per-token activation "
            "scales (int8_w8a8 always is).",
        ),
        device_name_option,
        allow_huge_shape_option,
    ]
    for option in reversed(options):
        command = option(command)
    return mappings_options(command)


def layouts_from_options(options: dict[str, Any]) -> list[Any]:
    """The `Layout`s a sweep's model options ask for (lists multiply; see extract.layouts)."""
    from moetune.extract.layouts import expand_layouts

    return expand_layouts(
        options["tp"],
        ep=options["ep"],
        ep_sizes=options.get("ep_size") or (),
        dtypes=options["dtype"],
    )


def default_compile_workers(devices: tuple[str | None, ...]) -> int:
    """Parallel compile processes: the cores left over by the timers, at most 16."""
    if all(device is None for device in devices):
        return 0  # CPU: the interpreter does not compile
    return max(0, min(16, (os.cpu_count() or 2) - len(devices) - 1))


@dataclass(frozen=True)
class Resolved:
    problem: Any  # TuneProblem
    source: str
    device_name: str
    triton_version: str
    limits: Any  # DeviceLimits
    devices: tuple[str | None, ...]
    notes: list[str] = field(default_factory=list)
    split: str = ""  # the layout: TP2, TP8 EP, TP8 EP4


@dataclass(frozen=True)
class Machine:
    """Where the timing runs and what the file names say about it."""

    device_name: str
    triton_version: str
    limits: Any  # DeviceLimits
    devices: tuple[str | None, ...]
    notes: list[str] = field(default_factory=list)


def machine_from_options(options: dict[str, Any], *, dry_run: bool = False) -> Machine:
    """The GPUs, the device name for the files, the pruning limits and the Triton version.

    Without a GPU the names are the CPU's under TRITON_INTERPRET=1 (where a run times on
    the CPU), else NVIDIA H200's; a dry run names what its run would write.
    """
    from moetune.device import DeviceLimits
    from moetune.engines.names import FALLBACK_DEVICE_NAME, installed_triton_version
    from moetune.tune.runner import visible_devices

    devices = visible_devices(None)
    on_gpu = any(device is not None for device in devices)
    device_name = options.get("device_name")
    notes: list[str] = []
    if on_gpu:
        import torch

        device_name = device_name or torch.cuda.get_device_name(0)
        limits = DeviceLimits.from_torch(0)
    else:
        limits = DeviceLimits.h200()
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        if not dry_run and not interpreted:
            raise TuneError(_no_gpu_message())
        if device_name is None:
            # A plan names the files its run writes: under the interpreter, the CPU's.
            if interpreted:
                device_name = CPU_DEVICE_NAME
                notes.append(
                    "no GPU visible: timing on the CPU under the Triton interpreter (only "
                    f"useful for testing); file names say {CPU_DEVICE_NAME} (--device-name)"
                )
            else:
                device_name = FALLBACK_DEVICE_NAME
                notes.append(f"no GPU visible: file names assume {device_name} (--device-name)")
    return Machine(device_name, installed_triton_version() or "unknown", limits, devices, notes)


def _no_gpu_message() -> str:
    """Why this command cannot time here (torch missing, or no GPU), and what runs instead."""
    import importlib.util

    context = click.get_current_context(silent=True)
    command = f"moetune {context.info_name if context else 'tune'}"
    instead = (
        f"`{command} ... --dry-run` shows the plan without a GPU; TRITON_INTERPRET=1 runs the "
        "pipeline on the CPU, for testing only"
    )
    try:
        torch_found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken or stubbed-out torch
        torch_found = False
    if not torch_found:
        return (
            "torch is not installed: timing needs torch and a CUDA GPU (pip install torch, the "
            "CUDA build you serve with, then in the moetune checkout: pip install -e "
            f"'.[kernel]'; {instead})"
        )
    return f"no CUDA GPU visible: timing needs one ({instead})"


# The command-line flag of each `moetune.dtypes.QuantChoice` field, for its refusals.
QUANT_FLAGS = {"group_size": "--group-size", "per_channel": "--per-channel-quant"}


def quant_choice(options: dict[str, Any]) -> QuantChoice:
    """--group-size and --per-channel-quant as values."""
    return QuantChoice(options.get("group_size"), bool(options.get("per_channel_quant")))


def flag_worded(exc: QuantChoiceError) -> TuneError:
    """A refused quantization choice, said in its flag's words."""
    return TuneError(exc.worded(QUANT_FLAGS[exc.choice]))


def quant_from_options(options: dict[str, Any], kernel: Any, dtype: str) -> dict[str, Any]:
    """`moetune.dtypes.quant_details` of the checkpoint's `kernel` under the options."""
    try:
        return quant_details(kernel, dtype, quant_choice(options))
    except QuantChoiceError as exc:
        raise flag_worded(exc) from None


def problem_from_options(options: dict[str, Any], *, dry_run: bool = False) -> Resolved:
    """The `TuneProblem` and the machine facts for the model options of a command."""
    from moetune.extract.report import build_report
    from moetune.tune.problem import TuneProblem

    machine = machine_from_options(options, dry_run=dry_run)
    notes = list(machine.notes)
    report = build_report(
        options["model"],
        tp=options["tp"],
        ep=options["ep"],
        ep_size=options.get("ep_size"),
        dtype=options["dtype"],
        device_name=machine.device_name,
        revision=options.get("revision"),
        mappings=options.get("mappings"),
        replace_mappings=options.get("replace_mappings", False),
        allow_huge_shape=options.get("allow_huge_shape", False),
    )
    kernel = report.kernel_dtype
    refusal = kernel.tune_refusal()
    if refusal:
        raise TuneError(refusal)
    dtype = kernel.name
    problem = TuneProblem.from_sharded(
        report.sharded, dtype, **quant_from_options(options, kernel, dtype)
    )
    from moetune.extract.sharding import fewer_experts_note

    notes[:0] = [note for note in (kernel.note, fewer_experts_note(report.sharded)) if note]
    loaded = report.loaded
    split = f"TP{options['tp']}" + (
        " EP" if options["ep"] else f" EP{options['ep_size']}" if options.get("ep_size") else ""
    )
    return Resolved(
        problem=problem,
        source=f"{loaded.description}, {split}",
        device_name=machine.device_name,
        triton_version=machine.triton_version,
        limits=machine.limits,
        devices=machine.devices,
        notes=notes,
        split=split,
    )
