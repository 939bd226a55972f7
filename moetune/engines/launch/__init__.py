"""The engines' own fused-MoE kernels as the kernel of record: which one a tune times.

A tuned file is only as good as the kernel it was timed on. `resolve_kernel` picks,
per engine file, the installed engine's own ``fused_moe_kernel`` (compiled from its
installed source by `moetune.engines.source`, launched as that release launches it by
one small module per release here), or moetune's twin of that engine's kernel where
the engine is absent: vLLM's twin is moetune's default kernel
(`moetune.kernel.fused_moe_kernel`, no `KernelRef`); SGLang's is
`moetune.kernel.fused_moe_kernel_sglang`, launched by SGLang's own launch module
(`TWINS`). Each twin compiles to its engine's SASS (``bench/sass_loop.py``).

`KernelRef` is the plain value that names the kernel timed: it travels to the worker
processes, into the results-store key and into the plan, the summary and ``--json``.
`engine_gemm` (worker side; imports torch and triton) turns it into a GEMM launcher
with `moetune.kernel.fused_moe_kernel.invoke_fused_moe_gemm`'s arguments.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetune.errors import MoetuneError

KERNEL_CHOICES = ("auto", "vllm", "sglang", "moetune")


def _release_modules() -> dict[tuple[str, str], str]:
    """(engine, release) -> the module that knows how that release launches its kernel:
    every module of this package that declares ``ENGINE`` and ``RELEASE`` (a release is
    one module; nothing else registers it). They import no torch or triton at module level."""
    import pkgutil

    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "ENGINE") and hasattr(module, "RELEASE"):
            found[(module.ENGINE, module.RELEASE)] = module.__name__
    return found


RELEASES = _release_modules()
ENGINE_LABELS = {"vllm": "vLLM", "sglang": "SGLang"}
# engine -> (the release its twin follows, the twin's module). vLLM's twin is moetune's
# default kernel, launched by `invoke_fused_moe_gemm`: it is timed without a `KernelRef`.
TWINS = {
    "vllm": ("0.34.0", "moetune.kernel.fused_moe_kernel"),
    "sglang": ("0.5.23", "moetune.kernel.fused_moe_kernel_sglang"),
}
DEFAULT_TWIN = "vllm"
# The twin of the engines' GPTQ/AWQ int4 kernel (``fused_moe_kernel_gptq_awq``).
WNA16_TWIN = "wna16"
# Each twin -> the files (from the package root) that define its kernel and its launch
# rules. Their digest names the twin in the results-store key, as an engine kernel's
# source digest names it: an edit to any of them is another kernel, never mixed in.
TWIN_FILES = {
    "vllm": ("kernel/fused_moe_kernel.py", "kernel/launch_rules.py"),
    "sglang": (
        "kernel/fused_moe_kernel_sglang.py",
        "kernel/fused_moe_kernel.py",
        "kernel/launch_rules.py",
        "engines/launch/sglang_0_5_23.py",
        "engines/launch/common.py",
    ),
    WNA16_TWIN: (
        "kernel/fused_moe_wna16_kernel.py",
        "kernel/fused_moe_kernel.py",
        "kernel/launch_rules.py",
    ),
}


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
    twin: bool = False  # moetune's twin of that release's kernel (`TWINS`), not the engine's

    def tag(self) -> str:
        """The results-store key's name for it, e.g. ``vllm-0.33.0@f37773a8ca2c``, or
        ``moetune-sglang-0.5.23@<digest of TWIN_FILES>`` for a twin."""
        if self.twin:
            return f"moetune-{self.engine}-{self.release}@{self.digest or twin_digest(self.engine)}"
        return f"{self.engine}-{self.version}@{self.digest}"

    def describe(self) -> str:
        if self.twin:
            return describe_twin(self.engine)
        label = ENGINE_LABELS.get(self.engine, self.engine)
        launched = "" if self.release == self.version else f", launched as {self.release}"
        return f"{label} {self.version}'s fused_moe_kernel ({self.source}{launched})"

    def as_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "version": self.version,
            "release": self.release,
            "source": self.source,
            "digest": self.digest,
            "twin": self.twin,
            "tag": self.tag(),
            "description": self.describe(),
        }


@functools.cache
def twin_digest(twin: str) -> str:
    """The first 12 hex digits of the SHA-256 of `twin`'s `TWIN_FILES` (names and contents)."""
    root = Path(__file__).resolve().parents[2]  # the moetune package
    digest = hashlib.sha256()
    for name in TWIN_FILES[twin]:
        digest.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def kernel_tag(kernel: KernelRef | None, dtype: str) -> str:
    """The results-store key's name of the kernel a `dtype` problem is timed on: `kernel`'s
    tag, or for None the default twin's (``moetune-vllm-0.34.0@<digest>``; int4 w4a16:
    ``moetune-wna16@<digest>``)."""
    from moetune.dtypes import DTYPES

    if kernel is not None:
        return kernel.tag()
    if DTYPES[dtype].gptq_awq:
        return f"moetune-{WNA16_TWIN}@{twin_digest(WNA16_TWIN)}"
    return f"moetune-{DEFAULT_TWIN}-{TWINS[DEFAULT_TWIN][0]}@{twin_digest(DEFAULT_TWIN)}"


def kernel_json(kernel: KernelRef | None, dtype: str) -> dict[str, Any]:
    """``--json``'s ``"kernel"``: `kernel`'s fields, or the default twin's (never null)."""
    from moetune.dtypes import DTYPES

    if kernel is not None:
        return kernel.as_json()
    twin = WNA16_TWIN if DTYPES[dtype].gptq_awq else DEFAULT_TWIN
    release = TWINS[DEFAULT_TWIN][0] if twin == DEFAULT_TWIN else None
    return {
        "engine": "vllm" if twin == DEFAULT_TWIN else None,
        "version": release,
        "release": release,
        "source": ", ".join(f"moetune/{name}" for name in TWIN_FILES[twin]),
        "digest": twin_digest(twin),
        "twin": True,
        "tag": kernel_tag(None, dtype),
        "description": describe_kernel(None, dtype),
    }


def _twin_source(engine: str) -> str:
    return TWINS[engine][1].replace(".", "/") + ".py"


def describe_twin(engine: str) -> str:
    """The plan's words for moetune's twin of `engine`'s kernel."""
    label = ENGINE_LABELS[engine]
    release = TWINS[engine][0]
    # The other releases' kernels where the twin does not follow them (``TWIN_DIFFERS``).
    differs = "".join(
        f"; {label} {other}'s differs {release_module(engine, other).TWIN_DIFFERS}"
        for other in known_releases(engine)
        if other != release and getattr(release_module(engine, other), "TWIN_DIFFERS", None)
    )
    return (
        f"moetune's twin of {label} {release}'s fused_moe_kernel "
        f"({_twin_source(engine)}; {label}'s own is timed where {label} is installed{differs})"
    )


def _version_key(version: str) -> Any:
    from moetune.engines.installed import version_key

    return version_key(version)


# The engines run GPTQ/AWQ weight-only int4 in another Triton kernel, whose twin
# (moetune's wna16 kernel, instruction for instruction vLLM's) times both engines' files.
GPTQ_AWQ_TWIN = (
    "moetune's twin of the engines' fused_moe_kernel_gptq_awq "
    "(moetune/kernel/fused_moe_wna16_kernel.py)"
)


def kernel_for(kernel: KernelRef | None, dtype: str) -> KernelRef | None:
    """The kernel a `dtype` problem is timed on where `kernel` was resolved for its engine.

    `kernel` times the engines' ``fused_moe_kernel``; a dtype the engines run in
    ``fused_moe_kernel_gptq_awq`` (int4 w4a16) is timed on moetune's twin of that kernel
    (None), whichever engine it is for.
    """
    from moetune.dtypes import DTYPES

    return None if DTYPES[dtype].gptq_awq else kernel


def describe_kernel(kernel: KernelRef | None, dtype: str | None = None) -> str:
    """The plan's ``Kernel:`` line for `kernel` (None: vLLM's twin, moetune's default)
    timing a `dtype` problem."""
    from moetune.dtypes import DTYPES

    if kernel is None and dtype is not None and DTYPES[dtype].gptq_awq:
        return GPTQ_AWQ_TWIN
    return describe_twin(DEFAULT_TWIN) if kernel is None else kernel.describe()


def label_kernel(kernel: KernelRef | None) -> str:
    """A short name, e.g. ``the vLLM 0.33.0 kernel``, ``moetune's twin of the SGLang 0.5.23 kernel``."""
    if kernel is None or kernel.twin:
        engine = DEFAULT_TWIN if kernel is None else kernel.engine
        return f"moetune's twin of the {ENGINE_LABELS[engine]} {TWINS[engine][0]} kernel"
    return f"the {ENGINE_LABELS.get(kernel.engine, kernel.engine)} {kernel.version} kernel"


def twin_ref(engine: str) -> KernelRef | None:
    """moetune's twin of `engine`'s kernel: a `KernelRef` (``twin=True``), or None for
    vLLM's twin, moetune's default kernel."""
    if engine == DEFAULT_TWIN:
        return None
    release = TWINS[engine][0]
    return KernelRef(
        engine, release, release, _twin_source(engine), digest=twin_digest(engine), twin=True
    )


def known_releases(engine: str) -> list[str]:
    """The releases of `engine` moetune launches, oldest first."""
    return sorted((release for name, release in RELEASES if name == engine), key=_version_key)


def release_module(engine: str, release: str) -> Any:
    return importlib.import_module(RELEASES[(engine, release)])


@dataclass(frozen=True)
class Resolution:
    """The kernel for one engine's file: a `KernelRef`, or None (moetune's twin), and why."""

    engine: str
    kernel: KernelRef | None
    note: str | None = None

    def describe(self) -> str:
        return describe_kernel(self.kernel)


def _twin(engine: str, why: str | None = None, todo: str | None = None) -> Resolution:
    """`engine`'s file on moetune's twin of its kernel; `why` the fallback's reason (None:
    the twin was asked for, ``--kernel moetune``), said in the note, and `todo` what the
    user can do about it."""
    label = ENGINE_LABELS[engine]
    note = (
        None
        if why is None
        else f"{why}: the {label} file is timed on moetune's twin of {label}'s kernel "
        f"({_twin_source(engine)})"
    )
    if note is not None and todo:
        note += f"; {todo}"
    return Resolution(engine, twin_ref(engine), note)


def interface_change_at(module: Any, source: Path) -> str | None:
    """How the kernel (and launcher) in the installed `source` differ from the interface
    the release `module` declares (``INTERFACE``), or None: the same, or none declared."""
    from moetune.engines.launch.interface import interface_change, read_interface
    from moetune.engines.source import EngineSourceError

    declared = getattr(module, "INTERFACE", None)
    if declared is None:
        return None
    try:
        installed = read_interface(source, declared.kernel, declared.launcher)
    except EngineSourceError as exc:
        return str(exc)
    return interface_change(declared, installed)


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
        return _twin(engine)
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
        return _twin(engine, f"{label} is not installed in this Python environment")
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
    change = interface_change_at(module, source)
    if change:
        why = (
            f"{label} {version}'s {module.KERNEL} is not the one moetune's {label} {release} "
            f"launch was written for ({change})"
        )
        if explicit:
            raise KernelChoiceError(
                f"--kernel {choice}: {why}; --kernel auto tunes on moetune's twin, or use a "
                f"moetune that knows {label} {version}"
            )
        return _twin(engine, why, f"a moetune that knows {label} {version} times its own kernel")
    ref = KernelRef(target, version, release, str(source), file_digest(source))
    return Resolution(engine, ref, note)


class EngineGemm:
    """A loaded engine kernel with `invoke_fused_moe_gemm`'s calling convention."""

    def __init__(self, ref: KernelRef) -> None:
        from moetune.engines.source import load_jit_functions

        self.ref = ref
        self.release = release_module(ref.engine, ref.release)
        if ref.twin:  # moetune's own kernel, launched as that release launches its own
            twin = importlib.import_module(TWINS[ref.engine][1])
            self.kernel = getattr(twin, self.release.KERNEL)
        else:
            self.kernel = load_jit_functions(Path(ref.source), (self.release.KERNEL,))[
                self.release.KERNEL
            ]
            _interpreter_bf16()
        self.capability = _capability()

    def naive_assignment(
        self, num_slots: int, num_experts: int, quant_dtype: str | None, block_shape: Any
    ) -> bool:
        return self.release.naive_assignment(num_slots, num_experts, quant_dtype, block_shape)

    def refusal(self, config: dict, quant_dtype: str | None) -> str | None:
        return self.release.refusal(config, quant_dtype)

    def split_configs(self, config: dict, down_config: dict | None) -> Any:
        """The two GEMMs' configs and TMA flags as this release reads a tuned entry
        (`moetune.kernel.tma.SplitConfigs`; SGLang's reading unless the release has its own)."""
        from moetune.kernel.tma import split_configs

        return getattr(self.release, "split_configs", split_configs)(config, down_config)

    def __call__(self, a: Any, w: Any, c: Any, **launch: Any) -> Any:
        from moetune.engines.launch.common import GemmCall

        return self.release.launch(self.kernel, GemmCall(a, w, c, **launch), self.capability)


def _interpreter_bf16() -> None:
    """On Triton's CPU interpreter, compute the engine's bf16 dots and casts right
    (`moetune.kernel.interpreter_bf16`): the engine's source cannot carry the twins'
    workaround. Nothing changes on a GPU."""
    from moetune.kernel.fused_moe_kernel import interpreting

    if interpreting():
        from moetune.kernel.interpreter_bf16 import patch_interpreter_bf16

        patch_interpreter_bf16()


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
    "compiled from its installed source and launched as that release does (vLLM 0.33.0 and "
    "0.34.0, SGLang 0.5.23; another release as the nearest known one when its kernel's "
    "interface is that one's), or moetune's twin where the engine is not installed or its "
    "kernel changed. vllm / sglang: that engine's kernel, or an error. moetune: the twin."
)


BENCHMARK_KERNEL_HELP = (
    "The kernel the columns are timed on. auto: each engine's columns (its fallback, its "
    "file, the --config files read as its) on that engine's own fused_moe_kernel where it "
    "is installed, else on moetune's twin of it, as tune does. vllm / sglang: every column "
    "on that engine's kernel, or an error. moetune: each engine's columns on its twin."
)


def benchmark_kernel(
    choice: str, engines: tuple[str, ...], find_installed: Callable[[str], Any] | None = None
) -> tuple[dict[str, KernelRef | None], list[str]]:
    """The kernel each engine's columns of `moetune benchmark` are timed on, and the notes.

    ``auto`` and ``moetune``: as `tune` does (`resolve_kernels`), each engine's files on
    its own kernel or its twin, every fallback said in a note. ``vllm``/``sglang``: every
    column on that engine's kernel (one kernel, to compare files on it alone).
    """
    if choice in ENGINE_LABELS:
        resolution = resolve_kernel(choice, choice, find_installed)
        notes = [resolution.note] if resolution.note else []
        return dict.fromkeys(engines, resolution.kernel), notes
    return resolve_kernels(choice, engines, find_installed)
