"""Model to sharded shape to engine file names, in one pure-ish call.

`build_report` is what `moetune extract` prints and what `moetune tune` starts
from: it loads the config (`sources`), matches and evaluates the registry
(`mappings`, `evaluate`), shards the shape (`sharding`) and names the files the
engines will look up (`filenames`). Its only side effects are reading files,
maybe one Hub download and, when no device name is given, one ``nvidia-smi``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moetune.dtypes import engine_file_n
from moetune.engines import backends as engine_backends
from moetune.engines import names
from moetune.engines.backends import BackendChoice, gpu_family, load_table, release_to_follow
from moetune.engines.formats import engine_label
from moetune.extract.backend_case import serving_backends
from moetune.extract.evaluate import extract_shape
from moetune.extract.kernel_dtype import KernelDtype, resolve_kernel_dtype
from moetune.extract.mappings import load_registry
from moetune.extract.quant import (
    EnginePlan,
    QuantGroup,
    QuantInfo,
    describe_variant,
    detect_quantization,
    engine_plan,
    layer_ranges,
)
from moetune.extract.shape import Extraction, ShardedShape
from moetune.extract.sharding import fewer_experts_note, shard
from moetune.extract.sources import LoadedConfig, load_config


@dataclass(frozen=True)
class DeviceName:
    """torch's name of the GPU the files are for, and how it was chosen."""

    name: str
    source: str  # "--device-name", "nvidia-smi" or "fallback: no GPU visible"


@dataclass(frozen=True)
class ExtractReport:
    """Everything `moetune extract` knows about one model under one TP/EP layout."""

    model: str
    loaded: LoadedConfig
    extraction: Extraction
    sharded: ShardedShape
    kernel_dtype: KernelDtype
    device: DeviceName
    triton_version: str | None
    vllm_config_file: str
    sglang_config_file: str
    notes: tuple[str, ...] = ()
    quant: QuantInfo | None = None
    # Per quantization group covering experts: engine -> its kernel and file.
    engine_plans: dict[str, dict[str, EnginePlan]] | None = None
    # The backend table's family of the device (None: neither Hopper nor Blackwell), and
    # each engine's default backend for these experts on every family of the table.
    gpu_family: str | None = None
    backends: tuple[BackendChoice, ...] = ()

    def backend_for(self, engine: str) -> BackendChoice | None:
        """The backend `engine` runs for these experts on this report's GPU (None: unknown)."""
        return next(
            (c for c in self.backends if c.engine == engine and c.family == self.gpu_family),
            None,
        )

    @property
    def sglang_config_dir(self) -> str:
        return names.sglang_config_dir_hint(self.triton_version)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with self-explanatory keys (the `--json` output)."""
        shape, local = self.extraction.shape, self.sharded
        return {
            "model": self.model,
            "config_source": self.loaded.description,
            "config_path": self.loaded.path,
            "architecture": self.extraction.architecture,
            "model_type": self.extraction.model_type,
            "entry": self.extraction.entry,
            "guessed": self.extraction.guessed,
            **shape.to_dict(),
            "sources": dict(self.extraction.sources),
            "tp_size": local.tp_size,
            "ep_size": local.ep_size,
            "local_experts": local.local_experts,
            "local_intermediate_size": local.intermediate_size,
            "w1_width": local.w1_width,
            "w1_shape": [local.local_experts, local.w1_width, local.hidden_size],
            "w2_shape": [local.local_experts, local.hidden_size, local.intermediate_size],
            "engine_dtype": self.kernel_dtype.engine_dtype,
            "activation_dtype": self.kernel_dtype.activation_dtype,
            "block_shape": _list(self.kernel_dtype.block_shape),
            "per_channel_quant": self.kernel_dtype.per_channel,
            "static_activations": self.kernel_dtype.static_activations,
            "dtype_reason": self.kernel_dtype.reason,
            "device_name": self.device.name,
            "device_name_source": self.device.source,
            "vllm_config_file": self.vllm_config_file,
            "vllm_config_search_path": names.VLLM_SEARCH_PATH,
            "sglang_config_file": self.sglang_config_file,
            "sglang_config_dir": self.sglang_config_dir,
            "triton_version": self.triton_version,
            "quantization": self._quant_dict(),
            "gpu_family": self.gpu_family,
            "backends": [choice.to_dict() for choice in self.backends],
            "notes": list(self.notes),
        }

    def _quant_dict(self) -> dict[str, Any] | None:
        quant = self.quant
        if quant is None:
            return None
        plans = self.engine_plans or {}
        return {
            "method": quant.method,
            "config_path": quant.source,
            "mixed": quant.mixed,
            "experts_group": quant.experts.name if quant.experts else None,
            "experts_excluded": quant.experts_excluded,
            "gate_excluded": quant.gate_excluded,
            "excluded_modules": quant.excluded_count,
            "groups": [
                {
                    **group.to_dict(),
                    "engines": {
                        engine: plan.to_dict() for engine, plan in plans.get(group.name, {}).items()
                    },
                }
                for group in quant.groups
            ],
            "notes": list(quant.notes),
        }


def _list(block: tuple[int, int] | None) -> list[int] | None:
    return list(block) if block is not None else None


def resolve_device_name(device_name: str | None) -> DeviceName:
    """The user's `--device-name`, else the first GPU's (``nvidia-smi``), else the fallback."""
    if device_name is not None:
        return DeviceName(device_name, "--device-name")
    detected = names.detect_device_name()
    if detected:
        return DeviceName(detected, "nvidia-smi")
    return DeviceName(names.FALLBACK_DEVICE_NAME, "fallback: no GPU visible")


def build_report(
    model: str,
    *,
    tp: int = 1,
    ep: bool = False,
    ep_size: int | None = None,
    dtype: str = "auto",
    device_name: str | None = None,
    revision: str | None = None,
    mappings: str | None = None,
    replace_mappings: bool = False,
    allow_huge_shape: bool = False,
) -> ExtractReport:
    """Load `model`'s config, extract and shard its MoE shape, and name the engines' files.

    Raises a `MoetuneError` subclass for every user or data problem; a shape
    above the size bounds is one unless `allow_huge_shape`.
    """
    loaded = load_config(model, revision=revision)
    registry = load_registry(mappings, replace=replace_mappings)
    extraction = extract_shape(
        loaded.config,
        registry,
        source=loaded.path or loaded.description,
        allow_huge_shape=allow_huge_shape,
    )
    local = shard(extraction.shape, tp=tp, ep=ep, ep_size=ep_size)
    quant = detect_quantization(loaded.config)
    kernel_dtype = resolve_kernel_dtype(extraction.shape, dtype, quant)
    device = resolve_device_name(device_name)
    args = (local.local_experts, local.intermediate_size, device.name)
    plans = None
    if quant is not None:
        plans = {group.name: engine_plan(group, *args) for group in quant.groups if group.scheme}
    releases = {
        engine: release_to_follow(engine, engine_backends.installed_version(engine))
        for engine in ("vllm", "sglang")
    }
    backends = serving_backends(extraction, local, quant, releases)
    family = gpu_family(device.name)
    return ExtractReport(
        model=model,
        loaded=loaded,
        extraction=extraction,
        sharded=local,
        kernel_dtype=kernel_dtype,
        device=device,
        triton_version=names.installed_triton_version(),
        vllm_config_file=names.vllm_config_filename(
            *args, kernel_dtype.engine_dtype, kernel_dtype.block_shape
        ),
        sglang_config_file=names.sglang_config_filename(
            local.local_experts,
            engine_file_n("sglang", local.intermediate_size, kernel_dtype.engine_dtype),
            device.name,
            kernel_dtype.engine_dtype,
            kernel_dtype.block_shape,
            per_channel_quant=kernel_dtype.per_channel,
        ),
        notes=_notes(extraction, local, kernel_dtype, device, quant, family)
        + _second_shape_notes(loaded.config, extraction),
        quant=quant,
        engine_plans=plans,
        gpu_family=family,
        backends=backends,
    )


def _notes(
    extraction: Extraction,
    local: ShardedShape,
    kernel_dtype: KernelDtype,
    device: DeviceName,
    quant: QuantInfo | None = None,
    family: str | None = None,
) -> tuple[str, ...]:
    # The evaluator already explains guessed values and transformers defaults.
    notes = list(extraction.notes)
    shape = extraction.shape
    if kernel_dtype.note:
        notes.append(kernel_dtype.note)
    if quant is not None:
        notes.extend(quant.notes)
        if quant.experts is not None:
            notes.extend(quant.experts.notes)
    if family is None:
        families = " and ".join(spec["label"] for spec in load_table().families.values())
        notes.append(
            f"{device.name} is not a GPU of moetune's backend table ({families}): which "
            "backend each engine runs for these experts on it is not known"
        )
    few = fewer_experts_note(local)
    if few:
        notes.append(few)
    if device.source.startswith("fallback"):
        notes.append(
            f"no GPU visible: the file names are for {device.name}; pass --device-name "
            "with torch.cuda.get_device_name() of the serving GPU"
        )
    if shape.num_shared_experts:
        notes.append(
            f"{shape.num_shared_experts} shared expert(s): where SGLang fuses shared experts "
            f"into the routed ones, its file counts them in E (E={local.local_experts} + "
            "the fused ones); moetune does not guess whether it does"
        )
    return tuple(notes)


def _second_shape_notes(config: dict[str, Any], extraction: Extraction) -> tuple[str, ...]:
    """A note where the expert size was read as ``field[0]`` of a list whose other items
    differ: a second MoE shape (ERNIE-4.5-VL's vision experts) that moetune leaves out."""
    source = extraction.sources.get("intermediate_size", "")
    if not source.endswith("[0]"):
        return ()
    node: Any = config
    for part in source[: -len("[0]")].split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, list) or len(set(map(str, node))) < 2:
        return ()
    field = source[: -len("[0]")]
    others = ", ".join(f"{field}[{i}] = {v}" for i, v in enumerate(node) if i and v != node[0])
    return (
        f"{field} is {node}: a second MoE shape ({others}; ERNIE-4.5-VL's vision experts, "
        "which vLLM's and SGLang's ernie45_vl_moe also build as FusedMoE layers, so they run "
        "the Triton kernel too) is left out: moetune extracts and tunes [0] only; tune the "
        f"other with --mappings, an entry reading intermediate_size: {field}[1]",
    )


def quant_lines(report: ExtractReport) -> list[str]:
    """The `Quantization` section of `moetune extract`'s table, as plain lines ([] when none)."""
    quant = report.quant
    if quant is None:
        return []
    lines = [f"quant_method {quant.method or 'unset'} ({quant.source})"]
    if quant.experts is None:
        lines.append("  the routed experts are not quantized (excluded or not targeted)")
    plans = report.engine_plans or {}
    for group in quant.expert_groups or quant.groups:
        lines.append(f"  {group.name}: {group.label} -> {_group_details(group)}")
        if quant.mixed or len(quant.groups) > 1:
            lines.append(f"    expert layers {layer_ranges(group.expert_layers) or 'none'}")
        for engine, plan in plans.get(group.name, {}).items():
            lines.extend(_plan_lines(engine, plan))
    if quant.gate_excluded:
        lines.append("  the router gate is listed as unquantized")
    return lines


def _group_details(group: QuantGroup) -> str:
    parts = [describe_variant(group)]
    if group.bits is not None and group.dtype is None:
        parts.append(f"{group.bits}-bit")
    if group.zero_point is not None:
        parts.append(f"zero points {'yes' if group.zero_point else 'no'}")
    if group.desc_act is not None:
        parts.append(f"act-order {'yes' if group.desc_act else 'no'}")
    if group.activation_scheme:
        parts.append(f"activation_scheme {group.activation_scheme}")
    return ", ".join(parts)


def _plan_lines(engine: str, plan: EnginePlan) -> list[str]:
    name = engine_label(engine)
    lines = [
        f"    {name:<7} runs {plan.kernel}; reads tuned files: {'yes' if plan.reads_files else 'no'}"
    ]
    if plan.triton:
        label = "Triton path" if not plan.reads_files else "Triton"
        lines.append(f"            {label}: {plan.triton}")
    if plan.file_name:
        lines.append(f"            file: {plan.file_name}")
        if not plan.writable and plan.why_not:
            lines.append(f"            not written by tune: {plan.why_not}")
    else:
        lines.append("            no Triton config file for this kernel")
    return lines


def backend_lines(report: ExtractReport) -> list[str]:
    """The `Backend` section of `moetune extract`: each engine's default MoE backend for
    these experts, per GPU family, the report's own family marked."""
    lines = []
    for engine in ("vllm", "sglang"):
        choices = [c for c in report.backends if c.engine == engine]
        if not choices:
            continue
        first = choices[0]
        lines.append(f"{engine_label(engine)} {first.release} ({first.release_source})")
        by_family = {choice.family: choice for choice in choices}
        for family, spec in load_table().families.items():
            mark = f"  <- {report.device.name}" if family == report.gpu_family else ""
            choice = by_family.get(family)
            if choice is None:
                lines.append(f"  {spec['label']:<25} not in moetune's backend table{mark}")
                continue
            reads = "reads the tuned files" if choice.reads_files else "reads no tuned file"
            lines.append(f"  {choice.family_label:<25} {choice.label}: {reads}{mark}")
            if choice.note:
                lines.append(f"  {'':<25} ({choice.note})")
    return lines
