"""A checkpoint's quantization, the kernel each engine runs for it, and the file it reads.

The rules are data (`quant_rules.yaml`, validated against
`schemas/quant_rules.schema.json`); this module is the generic evaluator:

1. find `quantization_config` (top level, under `text_config`...);
2. split it into groups (one per `config_groups` child, else the whole config);
3. give each group the first scheme whose conditions hold, and read its
   details (bits, group size, zero points, block shape...);
4. find which group covers the routed experts, layer by layer, from the
   groups' `targets` and the checkpoint's exclusion lists (mixed precision);
5. `engine_plan` names each engine's file for the experts' kernel.

No torch, no triton: `moetune extract` imports this.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from moetune.dtypes import accepted_summary, packaged_rules, tune_accepts, variants_of
from moetune.engines.formats import ENGINES, engine_format
from moetune.errors import InvalidMappingsError

_DATA_DIR = Path(__file__).resolve().parent.parent / "data"
_MISSING = object()
_DEFAULT_LAYERS = 128  # layers probed when the config does not say how many it has


def rules_path() -> Path:
    return _DATA_DIR / "quant_rules.yaml"


def rules_schema_path() -> Path:
    return _DATA_DIR / "schemas" / "quant_rules.schema.json"


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineRuntime:
    """What one engine does with a quantized group, from the rules."""

    kernel: str  # the MoE kernel the engine runs for it by default
    reads_files: bool  # whether that kernel reads the Triton fused_moe config files
    triton: str | None  # how to make it run the Triton kernel that does (None: no switch)
    file_dtype: str | None  # dtype string in this engine's file name
    per_channel_quant: bool  # SGLang's `,per_channel_quant=True`
    has_file: bool  # False: no Triton config file exists for this quantization
    writable: bool  # False: tune must not write this engine's file (see `why`)
    why: str | None = None
    n_divisor: int = 1  # the file's N is the per-rank intermediate size divided by this


@dataclass(frozen=True)
class QuantGroup:
    """One quantization scheme of a checkpoint (a compressed-tensors group, or the whole config).

    `dtype` is the engines' kernel dtype string (``int4_w4a16``, ``fp8_w8a8``...)
    or None where no Triton config file exists (MXFP4, NVFP4) or no rule
    matched; `block_shape` is what the engines pass as ``block_shape``:
    ``(block_n, block_k)`` for block fp8, ``(0, group_size)`` for int4/int8
    weight-only (a zero entry keeps it out of the file name).
    """

    name: str
    scheme: str | None
    label: str
    kernel: str | None
    dtype: str | None
    bits: int | None = None
    backend_case: str | None = None  # the case of backends.yaml (None: no rule matched)
    group_size: int | None = None
    zero_point: bool | None = None
    desc_act: bool | None = None
    per_channel: bool = False
    static_activations: bool = False
    block_shape: tuple[int, int] | None = None
    activation_scheme: str | None = None
    expert_layers: tuple[int, ...] = ()
    engines: dict[str, EngineRuntime] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def has_file(self) -> bool:
        return self.dtype is not None

    @property
    def tunable(self) -> bool:
        """Whether `moetune tune` can time this group's kernel (see `moetune.dtypes`)."""
        return self.has_file and tune_accepts(
            self.dtype,
            per_channel=self.per_channel,
            static_activations=self.static_activations,
            block_shape=self.block_shape,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "scheme": self.scheme,
            "label": self.label,
            "kernel": self.kernel,
            "dtype": self.dtype,
            "bits": self.bits,
            "group_size": self.group_size,
            "zero_point": self.zero_point,
            "desc_act": self.desc_act,
            "per_channel_quant": self.per_channel,
            "static_activations": self.static_activations,
            "block_shape": list(self.block_shape) if self.block_shape else None,
            "activation_scheme": self.activation_scheme,
            "expert_layers": layer_ranges(self.expert_layers),
            "tunable": self.tunable,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class QuantInfo:
    """A checkpoint's quantization as far as the routed experts are concerned."""

    method: str | None
    source: str  # where quantization_config was found
    groups: tuple[QuantGroup, ...]
    experts: QuantGroup | None  # the group covering most expert layers; None: experts unquantized
    mixed: bool  # expert layers split over groups with different kernels
    experts_excluded: bool  # every expert module is in an exclusion list
    gate_excluded: bool  # the router gate is in an exclusion list
    excluded_count: int
    notes: tuple[str, ...] = ()

    @property
    def expert_groups(self) -> tuple[QuantGroup, ...]:
        return tuple(g for g in self.groups if g.expert_layers)


@dataclass(frozen=True)
class EnginePlan:
    """One engine's side of a quantized MoE layer: its kernel and the file it looks up."""

    engine: str
    kernel: str
    reads_files: bool
    triton: str | None
    dtype: str | None
    block_shape: tuple[int, int] | None
    per_channel_quant: bool
    file_name: str | None  # None: no Triton config file for this checkpoint
    writable: bool  # moetune tune writes this engine's file
    why_not: str | None = None
    file_n: int | None = None  # the N in the file name (packed for SGLang's int4)

    def to_dict(self) -> dict[str, Any]:
        return {
            "default_kernel": self.kernel,
            "reads_files": self.reads_files,
            "triton_path": self.triton,
            "dtype": self.dtype,
            "block_shape": list(self.block_shape) if self.block_shape else None,
            "per_channel_quant": self.per_channel_quant,
            "file": self.file_name,
            "file_n": self.file_n,
            "tune_writes": self.writable,
            "why_not": self.why_not,
        }


# ---------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Rules:
    data: dict[str, Any]

    @property
    def kernels(self) -> dict[str, Any]:
        return self.data["kernels"]

    @property
    def schemes(self) -> list[dict[str, Any]]:
        return self.data["schemes"]


@lru_cache(maxsize=4)
def load_rules(path: str | None = None) -> Rules:
    """The quantization rules, schema-checked; a problem is one line naming the file and place."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    source = Path(path) if path else rules_path()
    try:
        # The packaged file is parsed once, for these rules and `moetune.dtypes` alike.
        data = yaml.safe_load(source.read_text()) if path else packaged_rules()
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidMappingsError(f"{source}: cannot read the quantization rules: {exc}") from exc
    with open(rules_schema_path()) as handle:
        validator = Draft202012Validator(json.load(handle))
    error = best_match(validator.iter_errors(_jsonable(data)))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "top level"
        raise InvalidMappingsError(f"{source}: {where}: {error.message}")
    for scheme in data["schemes"]:
        kernels = [scheme.get("kernel"), *scheme.get("kernel_by_bits", {}).values()]
        for kernel in filter(None, kernels):
            if kernel not in data["kernels"]:
                raise InvalidMappingsError(
                    f"{source}: scheme {scheme['name']!r}: unknown kernel {kernel!r} "
                    f"(kernels: {', '.join(data['kernels'])})"
                )
    return Rules(data)


def _jsonable(node: Any) -> Any:
    # YAML allows integer keys (kernel_by_bits: {4: ...}); JSON Schema sees strings.
    if isinstance(node, dict):
        return {str(k): _jsonable(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_jsonable(v) for v in node]
    return node


# ---------------------------------------------------------------------------
# Reading the config
# ---------------------------------------------------------------------------


def _get(node: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _lookup(
    group: dict[str, Any], top: dict[str, Any], path: str, root: dict[str, Any] | None = None
) -> Any:
    """`path` in the group; ``/path`` from the top of quantization_config; ``@path`` from the
    top of config.json (`root`; missing when not given)."""
    if path.startswith("@"):
        return _get(root, path[1:]) if root is not None else _MISSING
    return _get(top, path[1:]) if path.startswith("/") else _get(group, path)


def _same(expected: Any, actual: Any) -> bool:
    if expected is None:
        return actual is None or actual is _MISSING
    if actual is _MISSING or isinstance(actual, bool) != isinstance(expected, bool):
        return False
    if isinstance(expected, str) and isinstance(actual, str):
        return expected.lower() == actual.lower()
    return expected == actual


def _holds(
    conditions: dict[str, Any],
    group: dict[str, Any],
    top: dict[str, Any],
    root: dict[str, Any] | None = None,
) -> bool:
    for path, expected in conditions.items():
        actual = _lookup(group, top, path, root)
        if isinstance(expected, dict):
            present = actual is not _MISSING and actual is not None
            if present != expected["present"]:
                return False
        elif isinstance(expected, list):
            if not any(_same(option, actual) for option in expected):
                return False
        elif not _same(expected, actual):
            return False
    return True


def _value(spec: Any, group: dict[str, Any], top: dict[str, Any]) -> Any:
    if spec is None:
        return None
    if isinstance(spec, dict):
        value = _lookup(group, top, spec["not"])
        return None if value is _MISSING or value is None else not value
    value = _lookup(group, top, spec)
    return None if value is _MISSING else value


def find_quant_config(config: dict[str, Any], rules: Rules) -> tuple[str, dict[str, Any]] | None:
    """The first object at one of the rules' `config_paths`, with its path."""
    for path in rules.data["config_paths"]:
        node = _get(config, path)
        if isinstance(node, dict):
            return path, node
    return None


def _groups(quant: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    groups = quant.get("config_groups")
    if isinstance(groups, dict) and groups:
        return [(str(name), g) for name, g in groups.items() if isinstance(g, dict)]
    return [(str(quant.get("quant_method") or "quantization_config"), quant)]


# ---------------------------------------------------------------------------
# Module names: which group covers the experts of which layer
# ---------------------------------------------------------------------------


def module_matches(pattern: str, name: str) -> bool:
    """compressed-tensors `re:` regexes, `*` wildcards, else whole dotted components."""
    if pattern.startswith("re:"):
        try:
            return re.match(pattern[3:], name) is not None
        except re.error:
            return False
    if "*" in pattern or "?" in pattern:
        return fnmatch.fnmatchcase(name, pattern)
    return f".{pattern}." in f".{name}."


def _names(templates: list[str], layer: int) -> list[str]:
    return [template.replace("{layer}", str(layer)) for template in templates]


def _layer_count(config: dict[str, Any], rules: Rules) -> int:
    for path in rules.data.get("layer_count_paths", []):
        value = _get(config, path)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return _DEFAULT_LAYERS


def _excluded(quant: dict[str, Any], rules: Rules) -> list[str]:
    patterns: list[str] = []
    for key in rules.data.get("exclude_keys", []):
        value = quant.get(key)
        if isinstance(value, list):
            patterns.extend(str(p) for p in value)
    return patterns


def _covers(targets: Any, name: str, class_targets: list[str]) -> bool:
    if not isinstance(targets, list) or not targets:
        return True  # no targets: the group is the whole config
    return any(t in class_targets or module_matches(str(t), name) for t in targets)


def layer_ranges(layers: tuple[int, ...] | list[int]) -> str:
    """``(1, 2, 3, 7)`` -> ``"1-3, 7"``."""
    if not layers:
        return ""
    parts: list[str] = []
    start = prev = layers[0]
    for layer in [*layers[1:], None]:
        if layer is not None and layer == prev + 1:
            prev = layer
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if layer is not None:
            start = prev = layer
    return ", ".join(parts)


# ---------------------------------------------------------------------------
# Detection
# ---------------------------------------------------------------------------


def _block(kernel: dict[str, Any], group_size: Any, block: Any) -> tuple[int, int] | None:
    if kernel.get("block") == "group":
        size = group_size if isinstance(group_size, int) and group_size > 0 else None
        return (0, size) if size else None
    if kernel.get("block") == "weights" and isinstance(block, list) and len(block) == 2:
        return (int(block[0]), int(block[1]))
    return None


def _runtime(
    scheme: dict[str, Any], kernel: dict[str, Any], group: dict[str, Any], top: dict[str, Any]
) -> dict[str, EngineRuntime]:
    runtimes = {}
    files = kernel.get("files")
    for engine in ENGINES:
        spec = scheme["engines"][engine]
        triton = spec.get("triton")
        when = spec.get("triton_when")
        if triton and when and not _holds(when, group, top):
            triton = None
        file_spec = files[engine] if files else None
        runtimes[engine] = EngineRuntime(
            kernel=spec["kernel"],
            reads_files=spec["reads_files"],
            triton=triton,
            file_dtype=file_spec["dtype"] if file_spec else None,
            per_channel_quant=bool(file_spec and file_spec.get("per_channel_quant")),
            has_file=file_spec is not None,
            writable=bool(file_spec) and file_spec.get("writable", True),
            why=file_spec.get("why") if file_spec else None,
            n_divisor=file_spec.get("n_divisor", 1) if file_spec else 1,
        )
    return runtimes


def _group(
    name: str,
    group: dict[str, Any],
    top: dict[str, Any],
    rules: Rules,
    root: dict[str, Any] | None = None,
) -> QuantGroup | None:
    for scheme in rules.schemes:
        if not _holds(scheme["when"], group, top, root):
            continue
        bits = _value(scheme.get("bits"), group, top)
        kernel_name = scheme.get("kernel") or scheme["kernel_by_bits"].get(bits)
        if kernel_name is None:
            continue
        kernel = rules.kernels[kernel_name]
        group_size = _value(scheme.get("group_size"), group, top)
        block = _value(scheme.get("block_shape"), group, top)
        return QuantGroup(
            name=name,
            scheme=scheme["name"],
            label=scheme["label"],
            kernel=kernel_name,
            dtype=kernel.get("dtype") if kernel.get("files") else None,
            bits=bits if isinstance(bits, int) else None,
            backend_case=kernel.get("backend_case"),
            group_size=group_size if isinstance(group_size, int) else None,
            zero_point=_value(scheme.get("zero_point"), group, top),
            desc_act=_bool_or_none(_value(scheme.get("desc_act"), group, top)),
            per_channel=bool(kernel.get("per_channel")),
            static_activations=bool(kernel.get("static_activations")),
            block_shape=_block(kernel, group_size, block),
            activation_scheme=_value(scheme.get("activation_scheme"), group, top),
            engines=_runtime(scheme, kernel, group, top),
            notes=tuple(scheme.get("notes", ())),
        )
    return None


def _bool_or_none(value: Any) -> bool | None:
    # GPTQ's desc_act is a bool; compressed-tensors' actorder is null or a string ("group").
    if value is None or isinstance(value, bool):
        return value
    return bool(value)


def detect_quantization(config: dict[str, Any], rules: Rules | None = None) -> QuantInfo | None:
    """The checkpoint's quantization, or None when config.json declares none."""
    rules = rules or load_rules()
    found = find_quant_config(config, rules)
    if found is None:
        return None
    source, quant = found
    method = quant.get("quant_method")
    layers = range(_layer_count(config, rules))
    excluded = _excluded(quant, rules)
    class_targets = rules.data.get("class_targets", [])
    expert_templates = rules.data.get("expert_modules", [])
    targets_key = rules.data.get("targets_key", "targets")

    def is_excluded(name: str) -> bool:
        return any(module_matches(p, name) for p in excluded)

    groups: list[QuantGroup] = []
    unmatched: list[str] = []
    for name, node in _groups(quant):
        group = _group(name, node, quant, rules, config)
        targets = node.get(targets_key) if node is not quant else None
        covered = tuple(
            layer
            for layer in layers
            if any(
                _covers(targets, module, class_targets) and not is_excluded(module)
                for module in _names(expert_templates, layer)
            )
        )
        if group is None:
            unmatched.append(name)
            group = QuantGroup(
                name=name,
                scheme=None,
                label="no moetune rule for this scheme",
                kernel=None,
                dtype=None,
            )
        groups.append(_with_layers(group, covered))
    expert_groups = [g for g in groups if g.expert_layers]
    experts = max(expert_groups, key=lambda g: len(g.expert_layers), default=None)
    mixed = len({(g.kernel, g.block_shape) for g in expert_groups}) > 1
    gate_excluded = any(
        is_excluded(module)
        for layer in layers
        for module in _names(rules.data.get("gate_modules", []), layer)
    )
    notes = []
    if unmatched:
        notes.append(
            f"no rule in quant_rules.yaml matches group(s) {', '.join(unmatched)} of quant_method "
            f"{method!r}: the names shown are the unquantized kernel's"
        )
    if experts is None:
        notes.append(
            "no quantization group covers the routed experts (excluded or not targeted): "
            "they run unquantized"
        )
    if mixed:
        per_group = "; ".join(
            f"{g.name} ({g.dtype or g.kernel}) layers {layer_ranges(g.expert_layers)}"
            for g in expert_groups
        )
        notes.append(
            f"mixed precision: the experts are split over {len(expert_groups)} schemes ({per_group}); "
            "each needs its own file (--dtype names the other group's)"
        )
    return QuantInfo(
        method=str(method) if method is not None else None,
        source=source,
        groups=tuple(groups),
        experts=experts,
        mixed=mixed,
        experts_excluded=experts is None and bool(excluded),
        gate_excluded=gate_excluded,
        excluded_count=len(excluded),
        notes=tuple(notes),
    )


def _with_layers(group: QuantGroup, layers: tuple[int, ...]) -> QuantGroup:
    from dataclasses import replace

    return replace(group, expert_layers=layers)


# ---------------------------------------------------------------------------
# Per-engine plan
# ---------------------------------------------------------------------------


def engine_plan(group: QuantGroup, E: int, N: int, device_name: str) -> dict[str, EnginePlan]:
    """Each engine's kernel and file for `group`'s experts on a rank with E experts, N intermediate.

    N is the per-rank intermediate size; an engine that keys a packed dim
    (SGLang's int4: N // 2) gets it divided by its `n_divisor`.
    """
    plans = {}
    for engine in ENGINES:
        runtime = group.engines[engine]
        file_name = None
        file_n = N // runtime.n_divisor
        if runtime.has_file:
            file_name = engine_format(engine).file_name(
                E,
                file_n,
                device_name,
                runtime.file_dtype,
                group.block_shape,
                per_channel=runtime.per_channel_quant,
            )
        why = None
        if not runtime.has_file:
            why = f"no Triton config file: served by {runtime.kernel}"
        elif not runtime.writable:
            why = runtime.why
        elif not group.tunable:
            why = tune_refusal_text(group)
        plans[engine] = EnginePlan(
            engine=engine,
            kernel=runtime.kernel,
            reads_files=runtime.reads_files,
            triton=runtime.triton,
            dtype=runtime.file_dtype,
            block_shape=group.block_shape,
            per_channel_quant=runtime.per_channel_quant,
            file_name=file_name,
            file_n=file_n if file_name else None,
            writable=runtime.has_file and runtime.writable and group.tunable,
            why_not=why,
        )
    return plans


def describe_variant(group: QuantGroup) -> str:
    """``int4_w4a16 (group 128)``, ``fp8_w8a8 per-channel``..."""
    text = group.dtype or group.kernel or "unknown"
    if group.block_shape and all(group.block_shape):
        text += f" block {list(group.block_shape)}"
    elif group.group_size and any(v.block == "group" for v in variants_of(group.dtype)):
        text += f" group {group.group_size}"
    if group.per_channel:
        text += " per-channel"
    if group.static_activations:
        text += " static activation scales"
    return text


def tune_refusal_text(group: QuantGroup) -> str:
    """Why `moetune tune` cannot time this group's kernel, naming what it accepts."""
    return (
        f"moetune tune cannot time {describe_variant(group)} yet; "
        f"--dtype accepts {accepted_summary()}"
    )
