"""Evaluate a registry entry against a config.json: the generic extractor.

For each parameter the entry's alternatives are tried in three passes:
1. its paths, in order, against config.json (below the entry's text config);
2. the same paths against transformers' config-class defaults for the
   config's model_type (a field the JSON omits is what transformers would fill in);
3. its literal `{default: ...}` values.
A value of the wrong kind (a list where a number is expected, a string, a
non-positive size) does not count as resolved; the error lists why each
path was passed over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moetune.errors import (
    InvalidMappingsError,
    MissingFieldError,
    MoetuneError,
    UnknownArchitectureError,
)
from moetune.extract.defaults import class_defaults, transformers_version
from moetune.extract.mappings import (
    REQUIRED_PARAMS,
    Default,
    MappingEntry,
    Registry,
    config_identity,
    unknown_architecture_message,
)
from moetune.extract.paths import MISSING, parse_path, resolve, resolve_object
from moetune.extract.shape import Extraction, MoEShape

TRANSFORMERS_DEFAULT = "transformers default"
LITERAL_DEFAULT = "default"


def _positive_int(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{_kind(value)}, expected an integer"
    return None if value > 0 else f"{value}, expected a positive integer"


def _count(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{_kind(value)}, expected an integer"
    return None if value >= 0 else f"{value}, expected zero or more"


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) and value else f"{_kind(value)}, expected a string"


def _block(value: Any) -> str | None:
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        return None
    return f"{_kind(value)}, expected a list of two positive integers"


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return f"a list {_preview(value)}"
    if isinstance(value, dict):
        return "an object"
    return repr(value)


def _preview(value: list[Any]) -> str:
    text = repr(value)
    return text if len(text) <= 30 else text[:26] + "...]"


# What each parameter's value must look like (None: fine, else why not).
CHECKS = {
    "num_experts": _positive_int,
    "top_k": _positive_int,
    "intermediate_size": _positive_int,
    "hidden_size": _positive_int,
    "expert_hidden_size": _positive_int,
    "num_shared_experts": _count,
    "dtype": _text,
    "quant_method": _text,
    "weight_block_size": _block,
}


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


def _resolve_param(
    name: str,
    alternatives: tuple[str | Default, ...],
    config: dict[str, Any],
    prefix: str,
    defaults: dict[str, Any] | None,
    entry: MappingEntry,
) -> tuple[_Resolved | None, list[str]]:
    """The first acceptable value for one parameter, or None and what was tried."""
    check = CHECKS[name]
    paths = [parse_path(alt).under(prefix) for alt in alternatives if isinstance(alt, str)]
    tried = []
    absent = []
    for path in paths:
        value = resolve(config, path)
        problem = check(value) if value is not MISSING else None
        if value is not MISSING and problem is None:
            return _Resolved(value, path), tried
        tried.append(f"{path} ({problem})" if problem else path)
        if value is MISSING:
            absent.append(path)
    if defaults is not None:
        for path in absent:
            value = resolve(defaults, path)
            if value is not MISSING and check(value) is None:
                return _Resolved(value, TRANSFORMERS_DEFAULT), tried
    for alt in alternatives:
        if isinstance(alt, Default):
            problem = check(alt.value)
            if problem is not None:
                raise InvalidMappingsError(
                    f"{entry.source_file}: entry {entry.name!r}, field 'params.{name}': "
                    f"default {problem}"
                )
            return _Resolved(alt.value, LITERAL_DEFAULT), tried
    return None, tried


def _missing_field_message(
    name: str, tried: list[str], entry: MappingEntry, architecture: str | None
) -> str:
    model = f"the {architecture} config" if architecture else "the config"
    return (
        f"no {name} in {model} (entry {entry.name!r} of {entry.source_file}): "
        f"tried {', '.join(tried) or 'no paths'}; add the path that holds it to "
        f"params.{name} of that entry in moe_mappings.yaml (or a --mappings file)"
    )


def extract_shape(config: dict[str, Any], registry: Registry) -> Extraction:
    """The MoE shape of a parsed config.json, with where each value came from."""
    entry, guessed = registry.match(config)
    architecture, model_type = config_identity(config)
    prefix = text_config_prefix(config, entry)
    defaults = class_defaults(model_type)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    missing: dict[str, list[str]] = {}
    for name, alternatives in entry.params.items():
        resolved, tried = _resolve_param(name, alternatives, config, prefix, defaults, entry)
        if resolved is None:
            missing[name] = tried
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
        raise MissingFieldError(
            _missing_field_message(absent[0], missing[absent[0]], entry, architecture)
        )
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
