"""The generic evaluator: passes, sources, defaults, traps and errors (moetune.extract.evaluate)."""

import pytest

from moetune.errors import (
    ConfigSourceError,
    InvalidMappingsError,
    MissingFieldError,
    MoetuneError,
    UnknownArchitectureError,
)
from moetune.extract.defaults import transformers_version
from moetune.extract.evaluate import extract_shape
from moetune.extract.mappings import (
    Default,
    MappingEntry,
    Registry,
    builtin_mappings_path,
    load_registry,
)

MIXTRAL = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "intermediate_size": 14336,
    "hidden_size": 4096,
    "torch_dtype": "bfloat16",
}
BUILTIN = builtin_mappings_path()


@pytest.fixture(scope="module")
def registry():
    return load_registry(None)


def _without(config, *keys):
    return {k: v for k, v in config.items() if k not in keys}


def test_plain_extraction_and_sources(registry):
    extraction = extract_shape(MIXTRAL, registry)
    assert extraction.shape.to_dict() == {
        "num_experts": 8,
        "top_k": 2,
        "intermediate_size": 14336,
        "hidden_size": 4096,
        "expert_hidden_size": 4096,
        "num_shared_experts": None,
        "dtype": "bfloat16",
        "quant_method": None,
        "weight_block_size": None,
    }
    assert extraction.sources == {
        "dtype": "torch_dtype",
        "num_experts": "num_local_experts",
        "top_k": "num_experts_per_tok",
        "intermediate_size": "intermediate_size",
        "hidden_size": "hidden_size",
        "expert_hidden_size": "hidden_size",
    }
    assert (extraction.entry, extraction.architecture, extraction.model_type) == (
        "mixtral",
        "MixtralForCausalLM",
        "mixtral",
    )
    assert not extraction.guessed and extraction.notes == ()


def test_field_missing_on_every_path(registry):
    config = _without(MIXTRAL, "intermediate_size", "model_type")
    with pytest.raises(MissingFieldError) as exc:
        extract_shape(config, registry)
    assert str(exc.value) == (
        f"no intermediate_size in the MixtralForCausalLM config (entry 'mixtral' of {BUILTIN}): "
        "tried intermediate_size; add the path that holds it to params.intermediate_size of "
        "that entry in moe_mappings.yaml (or a --mappings file)"
    )


def test_wrong_kind_of_value_is_an_error_not_passed_over(registry):
    config = {**_without(MIXTRAL, "model_type"), "intermediate_size": [14336, 14336]}
    with pytest.raises(ConfigSourceError) as exc:
        extract_shape(config, registry, source="m/config.json")
    assert str(exc.value) == (
        "m/config.json: intermediate_size is [14336, 14336] (field intermediate_size), "
        "expected an integer >= 1: fix the value, or point params.intermediate_size of entry "
        f"'mixtral' ({BUILTIN}) at the field that holds it"
    )
    config = {**_without(MIXTRAL, "model_type"), "num_experts_per_tok": 0}
    with pytest.raises(ConfigSourceError, match=r"top_k is 0 \(field num_experts_per_tok\), "):
        extract_shape(config, registry)
    config = {**_without(MIXTRAL, "model_type"), "num_experts_per_tok": True}
    with pytest.raises(ConfigSourceError, match=r"top_k is true \(field num_experts_per_tok\)"):
        extract_shape(config, registry)


def test_null_falls_through_to_later_paths_but_not_to_transformers_defaults(registry):
    # Nemotron-H: moe_latent_size null means "no latent": the next path, hidden_size, is read
    config = {
        "architectures": ["NemotronHForCausalLM"],
        "n_routed_experts": 128,
        "num_experts_per_tok": 6,
        "moe_intermediate_size": 1856,
        "hidden_size": 2688,
        "moe_latent_size": None,
    }
    extraction = extract_shape(config, registry)
    assert extraction.shape.expert_hidden_size == 2688
    assert extraction.sources["expert_hidden_size"] == "hidden_size"
    # transformers keeps a null from config.json: its class default does not apply
    config = {**MIXTRAL, "intermediate_size": None}
    with pytest.raises(MissingFieldError) as exc:
        extract_shape(config, registry)
    assert str(exc.value) == (
        "config.json: intermediate_size is null (field intermediate_size) and no other field of "
        "entry 'mixtral' holds it (tried intermediate_size (null)): set it in config.json"
    )


def test_size_bound_is_lifted_by_allow_huge_shape(registry):
    config = {**MIXTRAL, "num_local_experts": 5000}
    with pytest.raises(MoetuneError, match="num_experts is 5000 .* above 4096: .*--allow-huge"):
        extract_shape(config, registry)
    extraction = extract_shape(config, registry, allow_huge_shape=True)
    assert extraction.shape.num_experts == 5000


def test_transformers_default_fills_an_omitted_field(registry):
    extraction = extract_shape(_without(MIXTRAL, "intermediate_size"), registry)
    assert extraction.shape.intermediate_size == 14336  # MixtralConfig's default
    assert extraction.sources["intermediate_size"] == "transformers default"
    assert extraction.notes == (
        f"intermediate_size is not in config.json: the default of transformers {transformers_version()} "
        "for model_type 'mixtral'",
    )


def test_transformers_default_comes_before_a_literal_default(registry):
    # DeepSeek-V3's class default n_shared_experts is 1; a literal would only be the last resort
    config = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
        "hidden_size": 7168,
    }
    extraction = extract_shape(config, registry)
    assert extraction.shape.num_shared_experts == 1
    assert extraction.sources["num_shared_experts"] == "transformers default"


def test_literal_default(registry):
    config = {
        "architectures": ["Qwen3NextForCausalLM"],
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 512,
        "hidden_size": 2048,
    }
    extraction = extract_shape(config, registry)
    assert extraction.shape.num_shared_experts == 1
    assert extraction.sources["num_shared_experts"] == "default"


def test_bad_literal_default_is_a_mappings_error(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "entries:\n  - name: x\n    architectures: [X]\n    params:\n"
        "      num_experts: e\n      top_k: [k, {default: two}]\n      intermediate_size: i\n      hidden_size: h\n"
    )
    with pytest.raises(InvalidMappingsError) as exc:
        load_registry(str(path))
    assert str(exc.value) == (
        f"{path}, line 6: entry 'x', field 'params.top_k[1].default': "
        'expected an integer >= 1, got "two"'
    )


def test_bad_literal_default_of_a_registry_built_in_code():
    entry = MappingEntry(
        name="x",
        architectures=("X",),
        params={
            "num_experts": ("e",),
            "top_k": ("k", Default(0)),
            "intermediate_size": ("i",),
            "hidden_size": ("h",),
        },
        source_file="code",
    )
    with pytest.raises(InvalidMappingsError) as exc:
        extract_shape({"architectures": ["X"], "e": 4, "i": 8, "h": 16}, Registry((entry,)))
    assert (
        str(exc.value) == "code: entry 'x', field 'params.top_k': expected an integer >= 1, got 0"
    )


def test_top_k_larger_than_experts_is_refused(registry):
    config = {**MIXTRAL, "num_experts_per_tok": 50}
    with pytest.raises(MoetuneError) as exc:
        extract_shape(config, registry)
    assert str(exc.value) == (
        "top_k 50 (from num_experts_per_tok) is more than num_experts 8 (from num_local_experts): "
        f"entry 'mixtral' of {BUILTIN} reads the wrong field"
    )


def test_text_config_falls_back_to_the_top_level(registry):
    # ERNIE-4.5-VL checkpoints are flat; transformers' own class nests a text_config
    flat = {
        "architectures": ["Ernie4_5_VLMoeForConditionalGeneration"],
        "moe_num_experts": [64, 64],
        "moe_k": 6,
        "moe_intermediate_size": [1536, 512],
        "hidden_size": 2560,
    }
    nested = {
        "architectures": flat["architectures"],
        "text_config": {k: v for k, v in flat.items() if k != "architectures"},
    }
    assert extract_shape(flat, registry).sources["num_experts"] == "moe_num_experts[0]"
    assert (
        extract_shape(nested, registry).sources["num_experts"] == "text_config.moe_num_experts[0]"
    )
    assert extract_shape(flat, registry).shape == extract_shape(nested, registry).shape


def test_root_anchored_path_reads_above_the_text_config(registry):
    config = {
        "architectures": ["Qwen3VLMoeForConditionalGeneration"],
        "torch_dtype": "float16",
        "text_config": {
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 768,
            "hidden_size": 2048,
        },
    }
    extraction = extract_shape(config, registry)
    assert extraction.shape.dtype == "float16"
    assert extraction.sources["dtype"] == "torch_dtype"


def test_generic_guess_is_marked(registry):
    config = {
        "architectures": ["BrandNewMoeForCausalLM"],
        "model_type": "brand_new_moe",
        "num_experts": 32,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 768,
        "hidden_size": 2048,
    }
    extraction = extract_shape(config, registry)
    assert extraction.guessed and extraction.entry == "generic"
    assert (extraction.shape.num_experts, extraction.shape.intermediate_size) == (32, 768)
    assert extraction.notes[0].startswith(
        "no entry matches this architecture; the 'generic' entry guessed"
    )


def test_unknown_architecture_when_the_guess_fails(registry):
    config = {
        "architectures": ["QwenMoeForCausalLM"],
        "model_type": "qwen_moe",
        "num_experts": 8,
        "hidden_size": 64,
    }
    with pytest.raises(UnknownArchitectureError) as exc:
        extract_shape(config, registry)
    assert str(exc.value) == (
        "unknown architecture 'QwenMoeForCausalLM' model_type 'qwen_moe': the generic guess found no "
        "top_k, intermediate_size; close matches: Qwen3MoeForCausalLM, Qwen2MoeForCausalLM, "
        "Qwen3_5MoeForCausalLM, qwen3_moe, qwen2_moe, qwen3_5_moe; add an entry to moe_mappings.yaml (or a --mappings file): {name: qwen_moe, "
        "architectures: [QwenMoeForCausalLM], model_types: [qwen_moe], params: {num_experts: num_experts, "
        "top_k: <path>, intermediate_size: <path>, hidden_size: hidden_size}}"
    )


def test_config_without_any_identity(registry):
    with pytest.raises(UnknownArchitectureError) as exc:
        extract_shape({"hidden_size": 64}, registry)
    assert str(exc.value).startswith(
        "unknown architecture (config has no architectures or model_type): the generic guess found no "
        "num_experts, top_k, intermediate_size;"
    )


def test_gpt_oss_alternative_top_k_field(registry):
    # gpt-oss's raw file carries both num_experts_per_tok and experts_per_token; either is enough
    config = {
        "architectures": ["GptOssForCausalLM"],
        "num_local_experts": 32,
        "experts_per_token": 4,
        "intermediate_size": 2880,
        "hidden_size": 2880,
    }
    extraction = extract_shape(config, registry)
    assert extraction.shape.top_k == 4
    assert extraction.sources["top_k"] == "experts_per_token"


def test_quantization_from_text_config_or_top_level(registry):
    text = {
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "hidden_size": 2048,
    }
    quant = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    top = {
        "architectures": ["Qwen3VLMoeForConditionalGeneration"],
        "text_config": text,
        "quantization_config": quant,
    }
    inner = {
        "architectures": top["architectures"],
        "text_config": {**text, "quantization_config": quant},
    }
    for config, source in (
        (top, "quantization_config.weight_block_size"),
        (inner, "text_config.quantization_config.weight_block_size"),
    ):
        extraction = extract_shape(config, registry)
        assert (extraction.shape.quant_method, extraction.shape.weight_block_size) == (
            "fp8",
            (128, 128),
        )
        assert extraction.sources["weight_block_size"] == source
