"""Write moetune/data/transformers_defaults.json from the installed transformers.

For every model_type named in moe_mappings.yaml, and every other model_type
whose config class declares experts, the snapshot keeps the defaults of the
fields the mappings read (`moetune.extract.defaults.prune_defaults`). moetune
reads the snapshot at run time so that `moetune extract` never imports
transformers. Rerun after upgrading transformers:

    python scripts/gen_transformers_defaults.py
"""

from __future__ import annotations

import argparse
import logging
import warnings

import transformers
from transformers import CONFIG_MAPPING, PretrainedConfig

from moetune.extract.defaults import DEFAULTS_PATH, mapped_field_names, prune_defaults
from moetune.extract.mappings import builtin_mappings_path, load_mappings_file
from moetune.fileio import atomic_write_json

EXPERT_COUNT_FIELDS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"}


def _declares_experts(pruned: dict) -> bool:
    return any(
        key in EXPERT_COUNT_FIELDS or (isinstance(value, dict) and _declares_experts(value))
        for key, value in pruned.items()
    )


def with_aliases(config: PretrainedConfig) -> dict:
    """`config.to_dict()` plus its `attribute_map` aliases, sub-configs included.

    A config class may store a field under another name than the one
    checkpoints use (Qwen3-MoE stores `num_experts` as `num_local_experts`).
    """
    data = config.to_dict()
    for alias, name in getattr(config, "attribute_map", {}).items():
        if name in data:
            data.setdefault(alias, data[name])
    for key, value in vars(config).items():
        if isinstance(value, PretrainedConfig):
            data[key] = with_aliases(value)
    return data


def class_defaults(model_type: str) -> dict | None:
    """`model_type`'s config class defaults as a dict, or None when it cannot be built bare."""
    try:
        return with_aliases(CONFIG_MAPPING[model_type]())
    except Exception:  # noqa: BLE001 - some config classes need arguments; skip them
        return None


def build_snapshot() -> dict:
    mappings = load_mappings_file(builtin_mappings_path())
    field_names = mapped_field_names(mappings.entries, mappings.common_params)
    registry_types = {mt for entry in mappings.entries for mt in entry.model_types}
    snapshot = {}
    for model_type in sorted(CONFIG_MAPPING.keys()):
        defaults = class_defaults(model_type)
        if defaults is None:
            continue
        pruned = prune_defaults(defaults, field_names)
        if model_type in registry_types or _declares_experts(pruned):
            snapshot[model_type] = pruned
    return {
        "transformers_version": transformers.__version__,
        "generated_by": "scripts/gen_transformers_defaults.py",
        "model_types": snapshot,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=str(DEFAULTS_PATH), help="where to write the JSON")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    snapshot = build_snapshot()
    atomic_write_json(args.output, snapshot, indent=1)
    print(
        f"{args.output}: {len(snapshot['model_types'])} model types, transformers {snapshot['transformers_version']}"
    )


if __name__ == "__main__":
    main()
