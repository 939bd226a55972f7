"""`moetune check` as data: for each engine, the file it looks up, where, and what it runs without it.

Pure apart from reading folders: the engines' packages are located with
`find_spec` (never imported), the Triton version comes from the caller.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetune.engines import sglang, vllm
from moetune.engines.lookup import ENGINE_BATCH_SIZES, Lookup, summarize

LABELS = {"vllm": "vLLM", "sglang": "SGLang"}


@dataclass(frozen=True)
class EngineCheck:
    """One engine's answer: its lookup, SGLang's ``_down`` lookup, and its fallback table."""

    engine: str
    lookup: Lookup
    down: Lookup | None
    fallback: dict[int, dict[str, Any]]  # the engine's default config at the 18 batch sizes
    tune_command: str

    @property
    def present(self) -> bool:
        # A missing _down file is reported but is not a gap: SGLang runs the down GEMM
        # with the up config then.
        return self.lookup.present

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.lookup.to_dict(),
            "present": self.present,
            "down": None if self.down is None else self.down.to_dict(),
            "fallback_configs": {str(m): c for m, c in self.fallback.items()},
            "tune_command": self.tune_command,
        }


def tune_command(options: Mapping[str, Any], engine: str) -> str:
    """The `moetune tune` line that writes and installs this engine's missing file."""
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
        if engine == "vllm":
            found = vllm.lookup(
                report.vllm_config_file, env=env, package_configs=vllm_package, extra_dirs=extra
            )
            down = None
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
        checks.append(EngineCheck(engine, found, down, table, tune_command(options, engine)))
    return checks


def fallback_lines(table: dict[int, dict[str, Any]]) -> list[str]:
    """``M 1-32       M16 N64 K128 G1 w4 s4`` per run of equal configs."""
    from moetune.engines.lookup import short

    lines = []
    for first, last, config in summarize(table):
        span = f"M {first}" if first == last else f"M {first}-{last}"
        lines.append(f"{span:<13} {short(config)}")
    return lines
