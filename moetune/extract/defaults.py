"""transformers' config-class defaults, read from a JSON snapshot instead of transformers.

When a config.json omits a field, transformers fills it from its config class's
defaults, and so do the engines that load the model through it. Importing
transformers costs seconds, so `scripts/gen_transformers_defaults.py` writes
the MoE-relevant defaults per model_type to `moetune/data/transformers_defaults.json`
(with the transformers version they came from) and this module reads that file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from moetune.extract.mappings import MappingEntry
from moetune.extract.paths import parse_path

DEFAULTS_PATH = Path(__file__).resolve().parent.parent / "data" / "transformers_defaults.json"


@lru_cache(maxsize=1)
def _snapshot() -> dict[str, Any]:
    with open(DEFAULTS_PATH, encoding="utf-8") as handle:
        return json.load(handle)


def transformers_version() -> str | None:
    """The transformers version the snapshot was generated with."""
    return _snapshot().get("transformers_version")


def class_defaults(model_type: str | None) -> dict[str, Any] | None:
    """The (pruned, nested) default config dict of `model_type`'s config class, or None."""
    if model_type is None:
        return None
    return _snapshot()["model_types"].get(model_type)


def mapped_field_names(
    entries: Iterable[MappingEntry], common_params: dict[str, tuple[Any, ...]]
) -> set[str]:
    """Every field name any path of these entries steps through (what the snapshot keeps)."""
    alternatives = [alt for entry in entries for alts in entry.params.values() for alt in alts]
    alternatives += [alt for alts in common_params.values() for alt in alts]
    paths = [alt for alt in alternatives if isinstance(alt, str)]
    paths += [path for entry in entries for path in entry.text_config]
    return {step for path in paths for step in parse_path(path).steps if isinstance(step, str)}


def prune_defaults(config: dict[str, Any], field_names: set[str]) -> dict[str, Any]:
    """`config` reduced to the non-null fields in `field_names`, nested objects included."""
    pruned: dict[str, Any] = {}
    for key in sorted(config):
        value = config[key]
        if key not in field_names or value is None:
            continue
        if isinstance(value, dict):
            value = prune_defaults(value, field_names)
            if not value:
                continue
        pruned[key] = value
    return pruned
