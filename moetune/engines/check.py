"""`moetune check` as data: for each engine, the file it looks up, where, and what it runs without it.

Pure apart from reading folders: the engines' packages are located with
`find_spec` (never imported), the Triton version comes from the caller.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moetune.engines import sglang, vllm
from moetune.engines.formats import engine_label
from moetune.engines.lookup import ENGINE_BATCH_SIZES, Lookup, summarize
from moetune.engines.tables import TunedConfigError, read_table


@dataclass(frozen=True)
class EngineCheck:
    """One engine's answer: its lookup, SGLang's ``_down`` lookup, and its fallback table."""

    engine: str
    lookup: Lookup
    down: Lookup | None
    fallback: dict[int, dict[str, Any]]  # the engine's default config at the 18 batch sizes
    tune_command: str
    # A quantized checkpoint under --dtype auto: the kernel the engine serves its experts
    # with, and whether that kernel reads tuned files at all (mxfp4, nvfp4: no file exists).
    kernel_note: str | None = None
    needs_file: bool = True
    # When the engine reads the `down` file (vLLM 0.34: one serving path only).
    down_note: str | None = None

    @property
    def present(self) -> bool:
        """The engine has a usable file (or reads none): nothing to tune or replace.

        A missing _down file is reported but is not a gap: SGLang runs the down GEMM
        with the up config then. An invalid file, the _down one included, is a gap.
        """
        if not self.needs_file:
            return True
        return self.lookup.usable and (self.down is None or self.down.invalid is None)

    @property
    def invalid(self) -> bool:
        """A file the engine would load is no table it reads (the _down one included)."""
        return self.lookup.invalid is not None or (
            self.down is not None and self.down.invalid is not None
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.lookup.to_dict(),
            "present": self.present,
            "needs_file": self.needs_file,
            "kernel_note": self.kernel_note,
            "down": None if self.down is None else self.down.to_dict(),
            "down_note": self.down_note,
            "fallback_configs": {str(m): c for m, c in self.fallback.items()},
            "tune_command": self.tune_command,
        }


def tune_command(options: Mapping[str, Any], engine: str, *, overwrite: bool = False) -> str:
    """The `moetune tune` line that writes and installs this engine's missing file
    (`overwrite`: replacing an invalid one, kept as a backup)."""
    words = ["moetune", "tune", "--model", options["model"], "--tp", str(options["tp"])]
    if options.get("ep"):
        words.append("--ep")
    if options.get("ep_size"):
        words += ["--ep-size", str(options["ep_size"])]
    if options.get("dtype") and options["dtype"] != "auto":
        words += ["--dtype", options["dtype"]]
    if options.get("device_name"):
        words += ["--device-name", options["device_name"]]
    if options.get("revision"):
        words += ["--revision", options["revision"]]
    if options.get("mappings"):
        words += ["--mappings", str(options["mappings"])]
    words += ["--engine", engine, "--install", engine]
    if overwrite:
        words.append("--overwrite-installed")
    return " ".join(shlex.quote(word) for word in words)


def check_engines(
    report: Any,  # moetune.extract.report.ExtractReport
    engines: Sequence[str],
    triton_version: str | None,
    options: Mapping[str, Any],
    *,
    compare_dir: Path | None = None,
    compare_only: bool = False,
    env: Mapping[str, str] | None = None,
    vllm_package: Path | None | str = "find",
    sglang_package: Path | None | str = "find",
) -> list[EngineCheck]:
    """Each engine's lookup for the report's shape; `compare_dir` is searched first (or alone)."""
    env = os.environ if env is None else env
    if compare_only:
        env, vllm_package, sglang_package = {}, None, None
    extra = (compare_dir,) if compare_dir is not None else ()
    local, kernel = report.sharded, report.kernel_dtype
    dims = (
        local.local_experts,
        local.intermediate_size,
        local.hidden_size,
        local.top_k,
        kernel.engine_dtype,
        kernel.block_shape,
    )
    checks = []
    for engine in engines:
        down_note = None
        if engine == "vllm":
            release, why = vllm.target_release(options.get("vllm_release"))
            found = vllm.lookup(
                report.vllm_config_file, env=env, package_configs=vllm_package, extra_dirs=extra
            )
            reading = why or f"checked as vLLM {release} reads it"
            found = replace(found, notes=(*found.notes, reading))
            found = checked_vllm(found, release)
            down = None
            if vllm.reads_down_file(release, kernel.engine_dtype, kernel.block_shape):
                down = vllm.lookup(
                    vllm.down_file_name(report.vllm_config_file),
                    env=env,
                    package_configs=vllm_package,
                    extra_dirs=extra,
                )
                down = checked_vllm(
                    replace(down, fallback="vLLM runs the down GEMM on the up file's config"),
                    release,
                    down=True,
                )
                down_note = (
                    f"vLLM {release} runs the down GEMM on it only with "
                    f"{vllm.down_file_conditions(release)}; else on the up file"
                    if vllm.down_file_used(release, local.hidden_size)
                    else f"vLLM {release} reads it but runs the down GEMM on the up file "
                    f"here: hidden size {local.hidden_size} < 4096"
                )
            table = vllm.fallback_table(ENGINE_BATCH_SIZES, *dims)
        else:
            found, down = sglang.lookup_pair(
                report.sglang_config_file,
                triton_version,
                env=env,
                package=sglang_package,
                extra_dirs=extra,
            )
            table = sglang.fallback_table(ENGINE_BATCH_SIZES, *dims)
        if engine != "vllm":
            found = checked(found, engine)
            if down is not None:
                down = checked(down, engine, down=True)
        note, needs_file = _serving_kernel(report, engine, options)
        item = EngineCheck(
            engine, found, down, table, tune_command(options, engine), note, needs_file, down_note
        )
        if item.invalid:  # `tune --install` replaces it only when told to
            item = replace(item, tune_command=tune_command(options, engine, overwrite=True))
        checks.append(item)
    return checks


def checked(lookup: Lookup, engine: str, *, down: bool = False) -> Lookup:
    """`lookup` with `invalid` set when the file it found is no table `engine` reads."""
    if lookup.found is None:
        return lookup
    try:
        table = read_table(lookup.found, engine, down=down)
    except TunedConfigError as exc:
        return replace(lookup, invalid=str(exc))
    refused = sglang.entry_refusal(table) if engine == "sglang" else None
    return replace(lookup, invalid=f"{lookup.found}: {refused}") if refused else lookup


def checked_vllm(lookup: Lookup, release: str, *, down: bool = False) -> Lookup:
    """`lookup` with `invalid` set when the file it found is no table vLLM `release` reads
    (a key it does not accept stops it at start-up: `vllm.read_table_for`)."""
    if lookup.found is None:
        return lookup
    try:
        vllm.read_table_for(lookup.found, release, down=down)
    except TunedConfigError as exc:
        return replace(lookup, invalid=str(exc))
    return lookup


def _serving_kernel(
    report: Any, engine: str, options: Mapping[str, Any]
) -> tuple[str | None, bool]:
    """What serves a quantized checkpoint's experts by default (`--dtype auto` only):
    ``(note, needs_file)``; ``(None, True)`` for unquantized checkpoints or a --dtype override."""
    quant, plans = getattr(report, "quant", None), getattr(report, "engine_plans", None)
    if options.get("dtype", "auto") != "auto" or not quant or not plans or quant.experts is None:
        return None, True
    plan = plans.get(quant.experts.name, {}).get(engine)
    if plan is None:
        return None, True
    label = engine_label(engine)
    if plan.file_name is None:
        return (
            f"{label} serves this checkpoint's experts with {plan.kernel}, which reads no "
            "Triton config file: nothing to tune",
            False,
        )
    if not plan.reads_files:
        path = f"; it is read on the Triton path ({plan.triton})" if plan.triton else ""
        return f"{label}'s default kernel here, {plan.kernel}, does not read this file{path}", True
    return None, True


def fallback_lines(table: dict[int, dict[str, Any]]) -> list[str]:
    """``M 1-32       M16 N64 K128 G1 w4 s4`` per run of equal configs."""
    from moetune.engines.lookup import short

    lines = []
    for first, last, config in summarize(table):
        span = f"M {first}" if first == last else f"M {first}-{last}"
        lines.append(f"{span:<13} {short(config)}")
    return lines
