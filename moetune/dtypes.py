"""The kernel dtypes moetune implements and tunes: one `DtypeSpec` per dtype, in `DTYPES`.

`moetune extract` (its quantization notes), `moetune tune` (`--dtype` choices,
`TuneProblem` checks, the search's byte counts), the kernel (`make_problem`,
`default_config`, the quantizers) and the roofline ask these specs, so a new
kernel path is enabled here once it is checked against `kernel/naive.py`. No
torch, no triton.

The names are the engines' own (``dtype=`` in vLLM's and SGLang's tuned-config
file names); "bf16"/"fp16" are the unquantized kernel, which the file names leave
out. What the kernel implements is declared below; how each engine names and
reads a dtype's files is read from `quant_rules.yaml`'s ``kernels:`` table
(`DtypeSpec.variants`, `engine_file_n`, `engine_write_refusal`), the one place those
facts live, when first asked (parsing it takes longer than importing this module).

| dtype | weights | activations into the GEMMs |
|---|---|---|
| ``bf16`` / ``fp16`` | unquantized | unquantized |
| ``fp8_w8a8`` | fp8 e4m3: per tensor, per output channel, or [bn, bk] blocks | fp8, dynamic: per tensor, per token, or per token group |
| ``int8_w8a8`` | int8, per output channel | int8, dynamic per token |
| ``int8_w8a16`` | int8, per output channel | unquantized |
| ``int4_w4a16`` | int4 packed two per byte along K, a scale (and optional zero point) per group of K | unquantized |
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

from moetune.errors import InvalidMappingsError, TuneError

ENGINES = ("vllm", "sglang")
# The engines' Triton kernels: most dtypes run in fused_moe_kernel; int4 w4a16 in the
# GPTQ/AWQ kernel (moetune's `kernel/fused_moe_wna16_kernel.py`).
FUSED_MOE_KERNEL = "fused_moe_kernel"
GPTQ_AWQ_KERNEL = "fused_moe_kernel_gptq_awq"
# Weight-scale layouts (`DtypeSpec.scales`).
SCALE_LAYOUTS = ("tensor", "channel", "block", "group")
# The compile-rate family of the unquantized kernel (bf16, fp16), which has no ``kernels:`` row.
UNQUANTIZED_COMPILE_FAMILY = "bf16"


@dataclass(frozen=True)
class EngineFile:
    """The tuned-config file one engine looks up for a kernel variant (quant_rules.yaml)."""

    dtype: str | None  # the dtype string in the file name; None: the name carries none
    per_channel_quant: bool = False  # SGLang's ``,per_channel_quant=True``
    n_divisor: int = 1  # the engine keys the file on N divided by this (a packed dim)
    writable: bool = True  # False: moetune tune writes no file for this engine (see `why`)
    why: str | None = None


@dataclass(frozen=True)
class KernelVariant:
    """One row of quant_rules.yaml's ``kernels:`` table: a checkpoint layout of a dtype."""

    name: str  # the table's key (``fp8_w8a8_block``...)
    dtype: str
    block: str | None  # "weights": [bn, bk] weight blocks; "group": [0, group_size]
    per_channel: bool
    static_activations: bool
    files: tuple[tuple[str, EngineFile], ...]  # (engine, its file), per engine
    compile_family: str  # whose compile rate the tune estimate prices it at

    def file(self, engine: str) -> EngineFile:
        return dict(self.files)[engine]


@dataclass(frozen=True)
class DtypeSpec:
    """One kernel dtype: how its weights, activations and scales are stored, which kernel
    runs it, and (`variants`, from quant_rules.yaml) its checkpoint layouts and the file
    each engine looks up for each.

    `scales` lists the weight-scale layouts moetune's kernel runs for it:
    ``tensor`` (one per expert), ``channel`` (one per output channel), ``block``
    (one per [bn, bk] block: the engines' ``block_shape=[bn, bk]``), ``group`` (one
    per group of K: ``block_shape=[0, group_size]``).
    """

    name: str  # as the engines spell it
    weight_bits: int  # per stored weight element
    activation_bits: int  # per activation element entering the GEMMs
    integer: bool = False  # quantized values are integers (int8, int4), not fp8 e4m3
    scales: tuple[str, ...] = ()
    scale_bytes: int = 0  # per weight scale: fp32, or bf16 as the engines store int4's
    default_group_size: int | None = None  # group along K when the checkpoint names none
    static_activations: bool = False  # the kernel takes the checkpoint's activation scales
    engine_kernel: str = FUSED_MOE_KERNEL  # the engines' Triton kernel that runs it
    # Compiled for sm_90, the kernel keeps num_stages copies of its tiles with wgmma
    # (`tune.search.space.pipeline_buffers`): seen for the dtypes marked so only.
    wgmma_stages_seen: bool = False
    # A kernel revision that changes timings but not results: the tuner's problem key
    # carries it (`TuneProblem.key`), so a results store never resumes an older kernel's.
    kernel_revision: int | None = None
    activation_dtype: str = "bfloat16"  # torch dtype of x and the output in moetune's problems

    def __post_init__(self) -> None:
        unknown = set(self.scales) - set(SCALE_LAYOUTS)
        if unknown:
            raise ValueError(f"{self.name}: unknown scale layouts {sorted(unknown)}")

    @property
    def quantized(self) -> bool:
        return self.weight_bits < 16

    @property
    def quantizes_activations(self) -> bool:
        """Activations are quantized too (w8a8): both operands of the dots are 8-bit."""
        return self.activation_bits < 16

    @property
    def weight_only(self) -> bool:
        """Quantized weights, 16-bit activations (the engines' WNA16 kernels)."""
        return self.quantized and not self.quantizes_activations

    @property
    def weight_bytes(self) -> float:
        return self.weight_bits // 8 if self.weight_bits % 8 == 0 else self.weight_bits / 8

    @property
    def activation_bytes(self) -> int:
        return self.activation_bits // 8

    @property
    def pack_factor(self) -> int:
        """Weight elements per stored byte along the input dimension (2 for int4)."""
        return 8 // self.weight_bits if self.weight_bits < 8 else 1

    @property
    def block_quant(self) -> bool:
        """Block-quantized weights (``block_shape=[bn, bk]``) run."""
        return "block" in self.scales

    @property
    def group_quant(self) -> bool:
        """Group-wise weight scales along K (``block_shape=[0, group_size]``) run, with
        optional zero points."""
        return "group" in self.scales

    @property
    def per_channel(self) -> bool:
        """Per-output-channel weight scales with per-token activation scales (SGLang's
        ``per_channel_quant``) run."""
        return self.quantizes_activations and "channel" in self.scales

    @property
    def always_per_channel(self) -> bool:
        """Implemented per channel only: ``per_channel`` is implied."""
        return self.per_channel and self.scales == ("channel",)

    @property
    def gptq_awq(self) -> bool:
        """Runs in the engines' GPTQ/AWQ kernel (moetune's fused_moe_wna16_kernel)."""
        return self.engine_kernel == GPTQ_AWQ_KERNEL

    @property
    def peak_kind(self) -> str:
        """The matmul rate that bounds its compute: the type of the tensor-core operands."""
        if not self.quantizes_activations:
            return "bf16"  # weights are dequantized to 16 bits
        return "int8" if self.integer else "fp8"

    @property
    def quant_dtype(self) -> str | None:
        """The kernels' ``quant_dtype`` and the engines' file-name dtype; None unquantized."""
        return self.name if self.quantized else None

    # -- from quant_rules.yaml ------------------------------------------------

    @property
    def variants(self) -> tuple[KernelVariant, ...]:
        """The ``kernels:`` rows of quant_rules.yaml with this dtype (none unquantized)."""
        return variants_of(self.name)


class DtypeRegistry:
    """The kernel dtypes in their `--dtype` order: ``DTYPES["fp8_w8a8"].block_quant``,
    ``DTYPES.names("group_quant")``..."""

    def __init__(self, specs: tuple[DtypeSpec, ...]) -> None:
        self._specs = {spec.name: spec for spec in specs}

    def __iter__(self) -> Iterator[DtypeSpec]:
        return iter(self._specs.values())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._specs

    def __getitem__(self, name: str) -> DtypeSpec:
        return self._specs[name]

    def get(self, name: str | None) -> DtypeSpec | None:
        return self._specs.get(name) if isinstance(name, str) else None

    def names(self, having: str | Callable[[DtypeSpec], bool] | None = None) -> tuple[str, ...]:
        """The dtype names, all or those whose property `having` (a name or a test) holds."""
        if having is None:
            return tuple(self._specs)
        test = having if callable(having) else lambda spec: bool(getattr(spec, having))
        return tuple(name for name, spec in self._specs.items() if test(spec))

    def quantized(self) -> tuple[str, ...]:
        return self.names("quantized")

    def unquantized(self, torch_dtype: str | None) -> DtypeSpec:
        """The unquantized dtype of activations in `torch_dtype`: fp16 for float16, else bf16."""
        for spec in self:
            if not spec.quantized and spec.activation_dtype == torch_dtype:
                return spec
        return self["bf16"]


DTYPES = DtypeRegistry(
    (
        DtypeSpec("bf16", 16, 16, wgmma_stages_seen=True),
        DtypeSpec("fp16", 16, 16, wgmma_stages_seen=True, activation_dtype="float16"),
        DtypeSpec(
            "fp8_w8a8",
            8,
            8,
            scales=("tensor", "channel", "block"),
            scale_bytes=4,
            wgmma_stages_seen=True,
        ),
        DtypeSpec("int8_w8a8", 8, 8, integer=True, scales=("channel",), scale_bytes=4),
        DtypeSpec("int8_w8a16", 8, 16, integer=True, scales=("channel",), scale_bytes=4),
        DtypeSpec(
            "int4_w4a16",
            4,
            16,
            integer=True,
            scales=("group",),
            scale_bytes=2,
            default_group_size=128,
            engine_kernel=GPTQ_AWQ_KERNEL,
            # rev 2: the kernel that compiles to vLLM's fused_moe_kernel_gptq_awq's SASS.
            kernel_revision=2,
        ),
    )
)


# ---------------------------------------------------------------------------
# quant_rules.yaml, read once
# ---------------------------------------------------------------------------


def rules_resource() -> Any:
    """The packaged quant_rules.yaml (a `Traversable`)."""
    return resources.files("moetune") / "data" / "quant_rules.yaml"


@functools.cache
def packaged_rules() -> dict[str, Any]:
    """quant_rules.yaml as parsed (schema-checked by `moetune.extract.quant.load_rules`)."""
    import yaml

    source = rules_resource()
    try:
        data = yaml.safe_load(source.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidMappingsError(f"{source}: cannot read the quantization rules: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("kernels"), dict):
        raise InvalidMappingsError(f"{source}: no kernels: table")
    return data


@functools.cache
def kernel_variants() -> tuple[KernelVariant, ...]:
    """The ``kernels:`` rows that name a Triton config file, in the file's order."""
    variants = []
    for name, row in packaged_rules()["kernels"].items():
        files = row.get("files")
        if not files:
            continue  # MXFP4, NVFP4: no Triton fused_moe config file
        variants.append(
            KernelVariant(
                name=name,
                dtype=row["dtype"],
                block=row.get("block"),
                per_channel=bool(row.get("per_channel")),
                static_activations=bool(row.get("static_activations")),
                files=tuple((engine, _engine_file(files[engine])) for engine in ENGINES),
                compile_family=_compile_family(name, row),
            )
        )
    return tuple(variants)


def variants_of(dtype: str | None) -> tuple[KernelVariant, ...]:
    """The ``kernels:`` rows whose engines' dtype string is `dtype`."""
    return tuple(v for v in kernel_variants() if v.dtype == dtype)


def _compile_family(name: str, row: dict[str, Any]) -> str:
    family = row.get("compile_family")
    if not family:
        source = rules_resource()
        raise InvalidMappingsError(f"{source}: kernels: {name} names no compile_family")
    return str(family)


def compile_family(
    dtype: str, *, block_shape: tuple[int, int] | None = None, per_channel: bool = False
) -> str:
    """The compile-rate family of a kernel problem: its ``kernels:`` row's ``compile_family``.

    The row is the dtype's with weight blocks iff `block_shape` is given, and the same
    `per_channel` where one has it (else the first such row: fp8 per tensor before its
    static-scale twin, int8_w8a16 whatever its scales); a dtype without rows is unquantized.
    """
    blocked = [v for v in variants_of(dtype) if (v.block == "weights") == bool(block_shape)]
    if not blocked:
        return UNQUANTIZED_COMPILE_FAMILY
    same = [v for v in blocked if v.per_channel == per_channel]
    return (same or blocked)[0].compile_family


def engine_file_n(engine: str, N: int, dtype: str | None) -> int:
    """The N `engine` keys its file on for kernel `dtype` and per-rank intermediate size N.

    SGLang keys int4_w4a16 on w2's packed last dim (N // 2, ``n_divisor`` in
    quant_rules.yaml); everything else is keyed on N itself.
    """
    variants = variants_of(dtype)
    return N // variants[0].file(engine).n_divisor if variants else N


def engine_file_dtype(engine: str, dtype: str) -> str | None:
    """The dtype string `engine`'s file name carries for kernel `dtype` (None: none; vLLM
    names int8_w8a8 configs as unquantized ones). A dtype the rules omit is kept."""
    variants = variants_of(dtype)
    return variants[0].file(engine).dtype if variants else dtype


def engine_write_refusal(
    engine: str, dtype: str | None, *, per_channel: bool = False
) -> str | None:
    """Why tune must not write `engine`'s file for this kernel (None: write it).

    vLLM looks int8_w8a8 configs up under the unquantized name: the rules mark
    that file ``writable: false``, so tune writes only SGLang's.
    """
    for variant in variants_of(dtype):
        found = variant.file(engine)
        if variant.per_channel == per_channel and not found.writable:
            return found.why or f"{engine} does not read a {dtype} file"
    return None


def _engine_file(row: dict[str, Any]) -> EngineFile:
    return EngineFile(
        dtype=row["dtype"],
        per_channel_quant=bool(row.get("per_channel_quant")),
        n_divisor=row.get("n_divisor", 1),
        writable=row.get("writable", True),
        why=row.get("why"),
    )


# ---------------------------------------------------------------------------
# What `moetune tune` accepts
# ---------------------------------------------------------------------------


def tune_accepts(
    dtype: str | None,
    *,
    per_channel: bool = False,
    static_activations: bool = False,
    block_shape: tuple[int, int] | None = None,
) -> bool:
    """Whether `moetune tune` can time this kernel variant (None: unquantized bf16).

    `block_shape` is the engines': ``(bn, bk)`` weight blocks, ``(0, group_size)`` groups.
    """
    spec = DTYPES.get(dtype or "bf16")
    block = bool(block_shape and all(block_shape))
    group = bool(block_shape and not block_shape[0] and block_shape[1])
    return (
        spec is not None
        and (not per_channel or spec.per_channel)
        and (not static_activations or spec.static_activations)
        and (not block or spec.block_quant)
        and (not group or spec.group_quant)
    )


def accepted_summary() -> str:
    """What tune accepts, for messages: ``bf16, fp16, ...; fp8_w8a8 also block-quantized...``."""
    text = ", ".join(DTYPES.names())
    for having, what in (
        ("block_quant", "block-quantized"),
        ("group_quant", "with group scales"),
        ("per_channel", "per-channel"),
        ("static_activations", "with static activation scales"),
    ):
        names = DTYPES.names(having)
        if names:
            text += f"; {', '.join(names)} also {what}"
    return text


@dataclass(frozen=True)
class QuantChoice:
    """The user's say over the checkpoint's quantization: a group size for the group-quantized
    dtypes, per-channel scales for fp8 (None / False: the checkpoint's own)."""

    group_size: int | None = None
    per_channel: bool = False


class QuantChoiceError(TuneError):
    """A `QuantChoice` the dtype has no use for; `choice` names the field ("group_size" or
    "per_channel"), so a command can say it in its own option's words."""

    WORDS = {"group_size": "a group size", "per_channel": "per-channel quantization"}

    def __init__(self, choice: str, applies_to: str, dtype: str) -> None:
        self.choice, self.applies_to, self.dtype = choice, applies_to, dtype
        super().__init__(f"{self.WORDS[choice]} applies to {applies_to}, not {dtype}")

    def worded(self, name: str) -> str:
        """The same refusal with `name` (e.g. a command-line flag) for the choice."""
        return f"{name} applies to {self.applies_to}, not {self.dtype}"


def quant_details(kernel: Any, dtype: str, choice: QuantChoice | None = None) -> dict[str, Any]:
    """block_shape / per_channel / group_size / has_zp of the problem: the checkpoint's
    (as extract reports them), overridden by the user's `choice`; and checkpoint_dtype, the
    checkpoint's activation dtype, which w8a8 runs (an fp16 checkpoint's GEMMs store fp16)
    and the other quantized dtypes leave at bf16.

    The engines' ``block_shape=[0, group_size]`` of weight-only group quantization
    becomes `group_size`; only a full ``[block_n, block_k]`` stays a block shape. A
    choice the dtype has no use for raises `QuantChoiceError`.
    """
    choice = choice or QuantChoice()
    spec = DTYPES.get(dtype)
    if spec is None:
        raise TuneError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES.names())}")
    block = tuple(kernel.block_shape) if kernel.block_shape else None
    checkpoint_group = getattr(kernel, "group_size", None)
    if block is not None and not block[0]:
        checkpoint_group, block = block[1] or None, None
    group_size = choice.group_size or checkpoint_group
    if group_size is not None and not spec.group_quant:
        if choice.group_size:
            raise QuantChoiceError("group_size", ", ".join(DTYPES.names("group_quant")), dtype)
        group_size = None
    if spec.group_quant and group_size is None:
        group_size = spec.default_group_size
    if choice.per_channel and not spec.per_channel:
        raise QuantChoiceError("per_channel", ", ".join(DTYPES.names("per_channel")), dtype)
    per_channel = (
        choice.per_channel
        or spec.always_per_channel
        or (spec.per_channel and bool(getattr(kernel, "per_channel", False)))
    )
    zero_point = getattr(kernel, "has_zp", None) or getattr(kernel, "zero_point", None)
    has_zp = spec.group_quant and bool(zero_point)
    checkpoint_dtype = spec.activation_dtype
    if spec.quantizes_activations:
        checkpoint_dtype = getattr(kernel, "activation_dtype", None) or checkpoint_dtype
    return dict(
        block_shape=block,
        per_channel=per_channel,
        group_size=group_size,
        has_zp=has_zp,
        checkpoint_dtype=checkpoint_dtype,
    )
