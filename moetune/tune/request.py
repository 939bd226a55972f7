"""What a tune is asked to do, as values: `SweepRequest`.

`moetune tune` parses its options, resolves them into plain values (the layouts,
the search space, the engines and their kernels, the machine it times on) and
hands one `SweepRequest` to the tuner (`moetune.tune.api.plan`). Nothing below
the command sees a click option or a flag's name: an error about a value speaks
of the value, and the command may say it in its flag's words.

Each distinct per-rank problem of the sweep becomes a `moetune.tune.runner.TuneRequest`
(one plan's request): the fields both share carry over under the same names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moetune.dtypes import QuantChoice
from moetune.tune.confirm import DEFAULT_ROUNDS

__all__ = ["QuantChoice", "SweepRequest"]

ENGINES = ("vllm", "sglang")
# `SweepRequest.routing` of random routing (anything else: a dump to replay).
UNIFORM_ROUTING = "uniform"


@dataclass(frozen=True)
class SweepRequest:
    """A model, the layouts to tune it for, and how: everything `moetune tune` resolved."""

    model: str  # a Hub id, or a path to a config.json or a model folder
    layouts: tuple[Any, ...]  # moetune.extract.layouts.Layout, as asked, in order
    batch_sizes: tuple[int, ...]
    space: tuple[Any, ...]  # moetune.kernel.config.Candidate
    save_dir: Path
    limits: Any  # moetune.device.DeviceLimits the candidates are pruned for
    # Where the config comes from and how it is read (moetune.extract.layouts.resolve_layouts).
    revision: str | None = None
    mappings: str | None = None
    replace_mappings: bool = False
    allow_huge_shape: bool = False
    quant: QuantChoice = field(default_factory=QuantChoice)
    # Print and report as a sweep (a list was asked) rather than one layout's plan.
    is_sweep: bool = True
    # Each engine -> the kernel its files are timed on (absent or None: moetune's twin).
    kernels: Mapping[str, Any] = field(default_factory=dict)
    routing: str = UNIFORM_ROUTING  # or the path of a topk_ids dump to replay
    # The fields each plan's `TuneRequest` carries over, under the same names.
    engines: tuple[str, ...] = ENGINES
    search: str = "fast"
    device_name: str = "cpu"
    triton_version: str = "unknown"
    devices: tuple[str | None, ...] = (None,)
    backend: str = "local"
    compile_workers: int = 0
    timeout_s: float = 120.0
    overwrite: bool = False
    space_source: str = "default grid"
    up_tma: bool = False
    compare_dir: Path | None = None
    confirm_rounds: int = DEFAULT_ROUNDS
    vllm_release: str | None = None
    vllm_release_note: str | None = None
    # The vLLM server runs DeepGEMM's E8M0 scales: vLLM 0.34's _down.json is tuned where
    # it reads it (`moetune.tune.search.split_vllm`).
    vllm_deepgemm: bool = False
