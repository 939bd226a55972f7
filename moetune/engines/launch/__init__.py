"""The engines' own fused-MoE kernels as the kernel of record: which one a tune times.

A tuned file is only as good as the kernel it was timed on. `resolve_kernel` picks,
per engine file, the installed engine's own ``fused_moe_kernel`` (compiled from its
installed source by `moetune.engines.source`, launched as that release launches it by
one small module per release here), or moetune's twin where the engine is absent.

`KernelRef` is the plain value that names the kernel timed: it travels to the worker
processes, into the results-store key and into the plan, the summary and ``--json``.
`engine_gemm` (worker side; imports torch and triton) turns it into a GEMM launcher
with `moetune.kernel.fused_moe_kernel.invoke_fused_moe_gemm`'s arguments.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetune.errors import MoetuneError

KERNEL_CHOICES = ("auto", "vllm", "sglang", "moetune")
# (engine, release) -> the module that knows how that release launches its kernel.
RELEASES = {
    ("vllm", "0.33.0"): "moetune.engines.launch.vllm_0_33",
    ("sglang", "0.5.23"): "moetune.engines.launch.sglang_0_5_23",
}
ENGINE_LABELS = {"vllm": "vLLM", "sglang": "SGLang"}


class KernelChoiceError(MoetuneError):
    """An explicit ``--kernel`` that cannot be honoured here."""


@dataclass(frozen=True)
class KernelRef:
    """The engine kernel a measurement timed: engine, installed version, source and launcher."""

    engine: str
    version: str
    release: str  # the known release whose launch semantics are used
    source: str  # the installed file the kernel was compiled from
    digest: str  # its content digest (`moetune.engines.source.file_digest`)

    def tag(self) -> str:
        """The results-store key's name for it, e.g. ``vllm-0.33.0@f37773a8ca2c``."""
        return f"{self.engine}-{self.version}@{self.digest}"

    def describe(self) -> str:
        launched = "" if self.release == self.version else f", launched as {self.release}"
        label = ENGINE_LABELS.get(self.engine, self.engine)
        return f"{label} {self.version}'s fused_moe_kernel ({self.source}{launched})"

    def as_json(self) -> dict[str, str]:
        return {
            "engine": self.engine,
            "version": self.version,
            "release": self.release,
            "source": self.source,
            "digest": self.digest,
        }


def known_releases(engine: str) -> list[str]:
    return [release for name, release in RELEASES if name == engine]


def release_module(engine: str, release: str) -> Any:
    return importlib.import_module(RELEASES[(engine, release)])


@dataclass(frozen=True)
class Resolution:
    """The kernel for one engine's file: a `KernelRef`, or None (moetune's twin), and why."""

    engine: str
    kernel: KernelRef | None
    note: str | None = None

    def describe(self) -> str:
        if self.kernel is not None:
            return self.kernel.describe()
        return "moetune's twin kernel (moetune.kernel.fused_moe_kernel)"


def _twin(engine: str, why: str) -> Resolution:
    label = ENGINE_LABELS[engine]
    return Resolution(
        engine, None, f"{why}: the {label} file is tuned on moetune's twin of its kernel"
    )


def resolve_kernel(
    choice: str, engine: str, find_installed: Callable[[str], Any] | None = None
) -> Resolution:
    """The kernel `engine`'s file is timed on under ``--kernel choice``.

    ``auto``: the engine's own kernel when it is installed here with a readable kernel
    source; otherwise the twin, with a one-line note saying why. ``vllm``/``sglang``:
    that engine's kernel or a `KernelChoiceError` (not installed, a release moetune does
    not know, a source without the kernel). ``moetune``: the twin.
    `find_installed(engine)` returns an object with ``version`` and ``kernel_source``
    (`moetune.engines.installed.find_installed` by default), or None.
    """
    from moetune.engines.source import EngineSourceError, file_digest, has_jit_functions

    if choice not in KERNEL_CHOICES:
        raise KernelChoiceError(f"unknown kernel {choice!r}; expected {', '.join(KERNEL_CHOICES)}")
    if choice == "moetune":
        return Resolution(engine, None)
    explicit = choice != "auto"
    target = engine if choice == "auto" else choice
    label = ENGINE_LABELS[target]
    if find_installed is None:
        from moetune.engines.installed import find_installed
    installed = find_installed(target)
    if installed is None:
        if explicit:
            raise KernelChoiceError(
                f"--kernel {choice}: {label} is not installed in this Python environment "
                f"(pip install --no-deps {target}=={known_releases(target)[-1]}: moetune reads "
                "its kernel's source, or use --kernel auto)"
            )
        return Resolution(engine, None)  # the plan's Kernel line says it is the twin
    version = installed.version or "unknown"
    supported = ", ".join(known_releases(target))
    # `installed.release`: the known release nearest the installed version (its layout).
    release = installed.release if (target, installed.release) in RELEASES else None
    if release is None or (explicit and version != release):
        why = (
            f"{label} {version} is a release whose kernel launch moetune does not know "
            f"(supported: {supported})"
        )
        if explicit:
            raise KernelChoiceError(
                f"--kernel {choice}: {why}; --kernel auto times the nearest known launch "
                "or moetune's twin"
            )
        if release is None:
            return _twin(engine, why)
    note = None
    if version != release:
        note = f"{label} {version}: its kernel is launched as {label} {release} launches it"
    module = release_module(target, release)
    if installed.kernel_source is None:
        why = f"{label} {version} at {installed.root} has no fused-MoE kernel file"
        if explicit:
            raise KernelChoiceError(f"--kernel {choice}: {why}")
        return _twin(engine, why)
    source = Path(installed.kernel_source)
    try:
        has_jit_functions(source, (module.KERNEL,))
    except EngineSourceError as exc:
        if explicit:
            raise KernelChoiceError(f"--kernel {choice}: {exc}") from None
        return _twin(engine, str(exc))
    ref = KernelRef(target, version, release, str(source), file_digest(source))
    return Resolution(engine, ref, note)


class EngineGemm:
    """A loaded engine kernel with `invoke_fused_moe_gemm`'s calling convention."""

    def __init__(self, ref: KernelRef) -> None:
        from moetune.engines.source import load_jit_functions

        self.ref = ref
        self.release = release_module(ref.engine, ref.release)
        self.kernel = load_jit_functions(Path(ref.source), (self.release.KERNEL,))[
            self.release.KERNEL
        ]
        self.capability = _capability()

    def naive_assignment(
        self, num_slots: int, num_experts: int, quant_dtype: str | None, block_shape: Any
    ) -> bool:
        return self.release.naive_assignment(num_slots, num_experts, quant_dtype, block_shape)

    def refusal(self, config: dict, quant_dtype: str | None) -> str | None:
        return self.release.refusal(config, quant_dtype)

    def __call__(self, a: Any, w: Any, c: Any, **launch: Any) -> Any:
        from moetune.engines.launch.common import GemmCall

        return self.release.launch(self.kernel, GemmCall(a, w, c, **launch), self.capability)


def _capability() -> tuple[int, int] | None:
    import torch

    from moetune.kernel.fused_moe_kernel import interpreting

    if interpreting() or not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability())


@functools.lru_cache(maxsize=4)
def engine_gemm(ref: KernelRef) -> EngineGemm:
    """The compiled engine kernel `ref` names (once per process)."""
    return EngineGemm(ref)


def resolve_kernels(
    choice: str, engines: tuple[str, ...], find_installed: Callable[[str], Any] | None = None
) -> tuple[dict[str, KernelRef | None], list[str]]:
    """Each engine's kernel under ``--kernel choice``, and the notes to print.

    An explicit engine kernel times that engine's files only: it must match ``--engine``.
    """
    if choice in ENGINE_LABELS and set(engines) != {choice}:
        raise KernelChoiceError(
            f"--kernel {choice} times {ENGINE_LABELS[choice]}'s kernel, so it needs "
            f"--engine {choice}; --kernel auto times each engine's file on its own kernel"
        )
    resolutions = [resolve_kernel(choice, engine, find_installed) for engine in engines]
    notes = [r.note for r in resolutions if r.note]
    return {r.engine: r.kernel for r in resolutions}, list(dict.fromkeys(notes))


KERNEL_HELP = (
    "The kernel timed. auto: each engine's file on that engine's own fused_moe_kernel, "
    "compiled from its installed source and launched as that release does (vLLM 0.33.0, "
    "SGLang 0.5.23; the nearest for other releases), or moetune's twin where the engine "
    "is not installed. vllm / sglang: that engine's kernel, or an error. moetune: the twin."
)


BENCHMARK_KERNEL_HELP = (
    "The kernel every column is timed on. auto: the compared engine's own fused_moe_kernel "
    "where it is installed (with --engine both: vLLM's, else SGLang's), else moetune's twin. "
    "vllm / sglang: that engine's kernel, or an error. moetune: the twin."
)


def benchmark_kernel(
    choice: str, engines: tuple[str, ...], find_installed: Callable[[str], Any] | None = None
) -> tuple[KernelRef | None, list[str]]:
    """The one kernel `moetune benchmark` times every column on, and the notes to print.

    A benchmark compares configs side by side, so they share a kernel: ``auto`` takes
    the first of `engines` whose own kernel is usable here, else the twin.
    """
    if choice in ENGINE_LABELS:
        resolution = resolve_kernel(choice, choice, find_installed)
        return resolution.kernel, [resolution.note] if resolution.note else []
    notes: list[str] = []
    for engine in engines:
        resolution = resolve_kernel(choice, engine, find_installed)
        notes += [resolution.note] if resolution.note else []
        if resolution.kernel is not None:
            return resolution.kernel, notes
    return None, notes
