"""Evaluate a registry entry against a config.json: the generic extractor.

For each parameter the entry's alternatives are tried in three passes:
1. its paths, in order, against config.json (below the entry's text config);
2. the same paths against transformers' config-class defaults for the
   config's model_type (a field the JSON omits is what transformers would fill in);
3. its literal `{default: ...}` values.
Every value is checked against its parameter's rule (moe_mappings.yaml's
`parameters`, see `moetune.extract.rules`) where it is read. A value that is
present and breaks the rule is an error naming the file, the field and the
value: it is never passed over for a later path or a default. A null is a field
set to nothing: later paths are still tried, transformers' defaults are not
(transformers keeps the null too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moetune.errors import (
    ConfigSourceError,
    InvalidMappingsError,
    MissingFieldError,
    MoetuneError,
    UnknownArchitectureError,
)
from moetune.extract.defaults import DEFAULTS_PATH, class_defaults, transformers_version
from moetune.extract.mappings import (
    REQUIRED_PARAMS,
    Default,
    MappingEntry,
    Registry,
    config_identity,
    unknown_architecture_message,
)
from moetune.extract.paths import MISSING, parse_path, resolve, resolve_object
from moetune.extract.rules import Rule, ValueProblem, show, value_problem
from moetune.extract.shape import Extraction, MoEShape

TRANSFORMERS_DEFAULT = "transformers default"
LITERAL_DEFAULT = "default"


@dataclass(frozen=True)
class _Resolved:
    value: Any
    source: str


def text_config_prefix(config: dict[str, Any], entry: MappingEntry) -> str:
    """The first of the entry's text-config paths that holds an object, or "" (top level)."""
    for candidate in entry.text_config:
        if resolve_object(config, candidate) is not None:
            return candidate.lstrip("/")
    return ""


@dataclass(frozen=True)
class _Reading:
    """How one extraction reads values: the rules, the size bound, and what to name in errors."""

    rules: dict[str, Rule]
    allow_huge: bool
    source: str
    entry: MappingEntry

    def problem(self, name: str, value: Any) -> ValueProblem | None:
        return value_problem(self.rules[name], value, allow_huge=self.allow_huge)

    def config_error(self, name: str, path: str, value: Any, problem: ValueProblem) -> MoetuneError:
        """A present config value that breaks its rule: the file, the field, the value, the fix."""
        head = f"{self.source}: {name} is {show(value)} (field {path})"
        if problem.huge:
            return MoetuneError(
                f"{head}, above {problem.bound}: larger than any released "
                "MoE layer, so most likely the wrong field or a typo; if the model really is this "
                "large, pass --allow-huge-shape"
            )
        hint = f" ({problem.hint})" if problem.hint else ""
        return ConfigSourceError(
            f"{head}, expected {problem.expected}{hint}: fix the value, or point "
            f"params.{name} of entry {self.entry.name!r} ({self.entry.source_file}) at the "
            "field that holds it"
        )


def _resolve_param(
    name: str,
    alternatives: tuple[str | Default, ...],
    config: dict[str, Any],
    prefix: str,
    defaults: dict[str, Any] | None,
    reading: _Reading,
) -> tuple[_Resolved | None, list[str], list[str]]:
    """The value of one parameter, or None; also the paths tried and those set to null."""
    paths = [parse_path(alt).under(prefix) for alt in alternatives if isinstance(alt, str)]
    tried = []
    absent = []
    nulls = []
    for path in paths:
        value = resolve(config, path, keep_null=True)
        if value is MISSING:
            tried.append(path)
            absent.append(path)
            continue
        if value is None:
            tried.append(f"{path} (null)")
            nulls.append(path)
            continue
        problem = reading.problem(name, value)
        if problem is not None:
            raise reading.config_error(name, path, value, problem)
        return _Resolved(value, path), tried, nulls
    if defaults is not None and not nulls:
        for path in absent:
            value = resolve(defaults, path)
            if value is MISSING:
                continue
            problem = reading.problem(name, value)
            if problem is not None:
                raise MoetuneError(
                    f"{DEFAULTS_PATH}: the transformers default {path} = {show(value)} is not a "
                    f"valid {name} (expected {problem.expected}); regenerate the file with "
                    "scripts/gen_transformers_defaults.py"
                )
            return _Resolved(value, TRANSFORMERS_DEFAULT), tried, nulls
    for alt in alternatives:
        if isinstance(alt, Default):
            problem = reading.problem(name, alt.value)
            if problem is not None:
                raise InvalidMappingsError(
                    f"{reading.entry.source_file}: entry {reading.entry.name!r}, field "
                    f"'params.{name}': expected {problem.expected}, got {show(alt.value)}"
                )
            return _Resolved(alt.value, LITERAL_DEFAULT), tried, nulls
    return None, tried, nulls


def _missing_field_message(
    name: str, tried: list[str], entry: MappingEntry, architecture: str | None
) -> str:
    model = f"the {architecture} config" if architecture else "the config"
    return (
        f"no {name} in {model} (entry {entry.name!r} of {entry.source_file}): "
        f"tried {', '.join(tried) or 'no paths'}; add the path that holds it to "
        f"params.{name} of that entry in moe_mappings.yaml (or a --mappings file)"
    )


def _null_field_message(name: str, tried: list[str], nulls: list[str], reading: _Reading) -> str:
    return (
        f"{reading.source}: {name} is null (field {nulls[0]}) and no other field of entry "
        f"{reading.entry.name!r} holds it (tried {', '.join(tried)}): set it in config.json"
    )


def extract_shape(
    config: dict[str, Any],
    registry: Registry,
    *,
    source: str = "config.json",
    allow_huge_shape: bool = False,
) -> Extraction:
    """The MoE shape of a parsed config.json, with where each value came from.

    `source` names the file in error messages; `allow_huge_shape` lifts the
    size bounds of the value rules (the commands' --allow-huge-shape).
    """
    entry, guessed = registry.match(config)
    architecture, model_type = config_identity(config)
    prefix = text_config_prefix(config, entry)
    defaults = class_defaults(model_type)
    reading = _Reading(registry.rules, allow_huge_shape, source, entry)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    missing: dict[str, tuple[list[str], list[str]]] = {}
    for name, alternatives in entry.params.items():
        resolved, tried, nulls = _resolve_param(
            name, alternatives, config, prefix, defaults, reading
        )
        if resolved is None:
            missing[name] = (tried, nulls)
        else:
            values[name] = resolved.value
            sources[name] = resolved.source
    absent = [name for name in REQUIRED_PARAMS if name in missing]
    if absent and guessed:
        found = {name: sources[name] for name in REQUIRED_PARAMS if name in sources}
        raise UnknownArchitectureError(
            unknown_architecture_message(registry, config, found=found, missing=absent)
        )
    if absent:
        tried, nulls = missing[absent[0]]
        if nulls:
            raise MissingFieldError(_null_field_message(absent[0], tried, nulls, reading))
        raise MissingFieldError(_missing_field_message(absent[0], tried, entry, architecture))
    if "expert_hidden_size" not in values:
        values["expert_hidden_size"] = values["hidden_size"]
        sources["expert_hidden_size"] = sources["hidden_size"]
    if values["top_k"] > values["num_experts"]:
        raise MoetuneError(
            f"top_k {values['top_k']} (from {sources['top_k']}) is more than num_experts "
            f"{values['num_experts']} (from {sources['num_experts']}): entry {entry.name!r} "
            f"of {entry.source_file} reads the wrong field"
        )
    block = values.get("weight_block_size")
    shape = MoEShape(
        num_experts=values["num_experts"],
        top_k=values["top_k"],
        intermediate_size=values["intermediate_size"],
        hidden_size=values["hidden_size"],
        expert_hidden_size=values["expert_hidden_size"],
        num_shared_experts=values.get("num_shared_experts"),
        dtype=values.get("dtype"),
        quant_method=values.get("quant_method"),
        weight_block_size=tuple(block) if block is not None else None,
    )
    return Extraction(
        shape=shape,
        entry=entry.name,
        architecture=architecture,
        model_type=model_type,
        sources=sources,
        guessed=guessed,
        notes=_notes(entry, guessed, sources, model_type),
    )


def _notes(
    entry: MappingEntry, guessed: bool, sources: dict[str, str], model_type: str | None
) -> tuple[str, ...]:
    notes = []
    if guessed:
        notes.append(
            f"no entry matches this architecture; the {entry.name!r} entry guessed these "
            "values from common field names: check them, then add an entry to moe_mappings.yaml"
        )
    for name, source in sources.items():
        if source == TRANSFORMERS_DEFAULT:
            notes.append(
                f"{name} is not in config.json: the default of transformers "
                f"{transformers_version()} for model_type {model_type!r}"
            )
    return tuple(notes)
