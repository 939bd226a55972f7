"""The transformers-defaults snapshot (moetune/data/transformers_defaults.json)."""

import warnings

import pytest

from moetune.extract.defaults import (
    class_defaults,
    mapped_field_names,
    prune_defaults,
    transformers_version,
)
from moetune.extract.mappings import builtin_mappings_path, load_mappings_file


def test_snapshot_has_the_registry_model_types():
    assert transformers_version()
    assert class_defaults("qwen3_moe")["num_experts"] == 128
    # attribute_map aliases are recorded under both names
    assert class_defaults("qwen3_moe")["num_local_experts"] == 128
    assert class_defaults("qwen3_omni_moe")["thinker_config"]["text_config"]["num_experts"] == 128
    assert class_defaults("not_a_model_type") is None
    assert class_defaults(None) is None


def test_prune_keeps_only_mapped_fields():
    config = {
        "hidden_size": 8,
        "vocab_size": 100,
        "n": None,
        "text_config": {"hidden_size": 4, "x": 1},
        "other": {"y": 2},
    }
    assert prune_defaults(config, {"hidden_size", "text_config", "n"}) == {
        "hidden_size": 8,
        "text_config": {"hidden_size": 4},
    }


@pytest.mark.parametrize(
    "model_type",
    ["mixtral", "qwen3_moe", "deepseek_v3", "dbrx", "kimi_linear", "qwen3_omni_moe", "llama4"],
)
def test_snapshot_matches_installed_transformers(model_type):
    transformers = pytest.importorskip("transformers")
    import importlib.util
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "gen_transformers_defaults.py"
    spec = importlib.util.spec_from_file_location("gen_transformers_defaults", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_transformers_defaults", module)
    spec.loader.exec_module(module)
    mappings = load_mappings_file(builtin_mappings_path())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh = prune_defaults(
            module.class_defaults(model_type),
            mapped_field_names(mappings.entries, mappings.common_params),
        )
    assert fresh == class_defaults(model_type), (
        f"transformers {transformers.__version__} defaults for {model_type} changed: "
        "rerun python scripts/gen_transformers_defaults.py"
    )
