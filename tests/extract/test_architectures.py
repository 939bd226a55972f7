"""Every family in moe_mappings.yaml against a config.json, values checked by hand.

Real configs live in moetune/catalog/ (provenance in its INDEX.md); the expected
values below are the released models' published sizes (model cards / tech
reports, cross-checked in the catalog INDEX). Families with no released config
at hand use tests/fixtures/configs/ (see its README.md for how each was made:
from transformers' config class, from a catalog file with one edit, or a
minimal config with field names taken from the public model code).
"""

import json
from pathlib import Path

import pytest
import yaml

from moetune.extract.evaluate import extract_shape
from moetune.extract.mappings import load_registry

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "moetune" / "catalog"
FIXTURES = ROOT / "tests" / "fixtures" / "configs"


def cases(table: str) -> dict[str, tuple]:
    """One row per config file: its name, then the extraction expected of it.

    Columns: entry, E, top_k, intermediate, hidden, expert_hidden, shared, dtype,
    quant, block; ``-`` is None, a block is ``NxK``, ``#`` starts a comment.
    """
    parsed: dict[str, tuple] = {}
    for line in table.splitlines():
        cells = line.split("#", 1)[0].split()
        if not cells:
            continue
        assert len(cells) == 11, f"a row has 11 cells: {line!r}"
        name, entry, *sizes, dtype, quant, block = cells
        assert name not in parsed, f"{name} twice"
        parsed[name] = (
            entry,
            *(None if cell == "-" else int(cell) for cell in sizes),
            None if dtype == "-" else dtype,
            None if quant == "-" else quant,
            None if block == "-" else tuple(int(n) for n in block.split("x")),
        )
    return parsed


CATALOG_CASES = cases(
    """
# file                                                     entry             E    top_k  inter  hidden  expert  shared  dtype     quant               block
mistralai__Mixtral-8x7B-v0.1.json                          mixtral           8    2      14336  4096    4096    -       bfloat16  -                   -
databricks__dbrx-instruct.json                             dbrx              16   4      10752  6144    6144    -       bfloat16  -                   -
deepseek-ai__DeepSeek-V2-Lite.json                         deepseek          64   6      1408   2048    2048    2       bfloat16  -                   -
deepseek-ai__DeepSeek-V2.json                              deepseek          160  6      1536   5120    5120    2       bfloat16  -                   -
deepseek-ai__DeepSeek-V3.json                              deepseek          256  8      2048   7168    7168    1       bfloat16  fp8                 128x128
deepseek-ai__DeepSeek-V3.2.json                            deepseek          256  8      2048   7168    7168    1       bfloat16  fp8                 128x128
moonshotai__Kimi-K2-Instruct.json                          deepseek          384  8      2048   7168    7168    1       bfloat16  fp8                 128x128
zai-org__GLM-4.5.json                                      deepseek          160  8      1536   5120    5120    1       bfloat16  -                   -
zai-org__GLM-4.5-Air.json                                  deepseek          128  8      1408   4096    4096    1       bfloat16  -                   -
XiaomiMiMo__MiMo-V2-Flash.json                             deepseek          256  8      2048   4096    4096    -       bfloat16  fp8                 128x128
rednote-hilab__dots.llm1.inst.json                         deepseek          128  6      1408   4096    4096    2       bfloat16  -                   -
zai-org__GLM-4.5V.json                                     deepseek_vl_text  128  8      1408   4096    4096    1       bfloat16  -                   -
Qwen__Qwen3-30B-A3B.json                                   qwen3_moe         128  8      768    2048    2048    -       bfloat16  -                   -
Qwen__Qwen3-235B-A22B.json                                 qwen3_moe         128  8      1536   4096    4096    -       bfloat16  -                   -
Qwen__Qwen3-Next-80B-A3B-Instruct.json                     qwen3_next        512  10     512    2048    2048    1       bfloat16  -                   -
Qwen__Qwen3-VL-30B-A3B-Instruct.json                       qwen3_vl_moe      128  8      768    2048    2048    -       bfloat16  -                   -
Qwen__Qwen3.5-35B-A3B.json                                 qwen3_5_moe       256  8      512    2048    2048    1       bfloat16  -                   -
Qwen__Qwen3.5-397B-A17B.json                               qwen3_5_moe       512  10     1024   4096    4096    1       bfloat16  -                   -
# Llama 4: intermediate_size is the expert FFN; intermediate_size_mlp (16384) is dense
meta-llama__Llama-4-Scout-17B-16E-Instruct.json            llama4            16   1      8192   5120    5120    1       bfloat16  -                   -
# gpt-oss carries both num_experts_per_tok and experts_per_token (both 4); no dtype key
openai__gpt-oss-120b.json                                  gpt_oss           128  4      2880   2880    2880    -       -         mxfp4               -
# Kimi K3: text_config.top_k = 50 is a sampling default; routed experts run on a 3584 latent
moonshotai__Kimi-K3.json                                   kimi_k3           896  16     3072   7168    3584    2       bfloat16  compressed-tensors  -
# HunYuan: moe_topk / moe_intermediate_size / num_shared_expert are per-layer lists
tencent__Hunyuan-A13B-Instruct.json                        hunyuan_moe       64   8      3072   4096    4096    1       bfloat16  -                   -
# MiniMax: intermediate_size is per expert (M2's mlp_intermediate_size 8192 is unused)
MiniMaxAI__MiniMax-Text-01-hf.json                         minimax           32   2      9216   6144    6144    -       -         -                   -
MiniMaxAI__MiniMax-M1.json                                 minimax           32   2      9216   6144    6144    -       -         -                   -
MiniMaxAI__MiniMax-M2.json                                 minimax           256  8      1536   3072    3072    -       -         fp8                 128x128
# ERNIE-4.5-VL: moe_num_experts [64, 64] and moe_intermediate_size [1536, 512] are [text, vision]
baidu__ERNIE-4.5-VL-28B-A3B-PT.json                        ernie4_5_moe      64   6      1536   2560    2560    2       bfloat16  -                   -
inclusionAI__Ling-lite.json                                bailing_moe       64   6      1408   2048    2048    2       bfloat16  -                   -
inclusionAI__Ling-plus.json                                bailing_moe       64   4      3072   5376    5376    1       bfloat16  -                   -
ibm-granite__granite-3.0-3b-a800m-base.json                granitemoe        40   8      512    1536    1536    -       -         -                   -
ibm-granite__granite-4.0-h-small.json                      granitemoe        72   10     768    4096    4096    -       bfloat16  -                   -
microsoft__Phi-3.5-MoE-instruct.json                       phimoe            16   2      6400   4096    4096    -       bfloat16  -                   -
nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json           nemotron_h        128  6      1856   2688    2688    1       bfloat16  -                   -
LiquidAI__LFM2-8B-A1B.json                                 lfm2_moe          32   4      1792   2048    2048    -       bfloat16  -                   -
arcee-ai__Trinity-Mini.json                                afmoe             128  8      1024   2048    2048    1       bfloat16  -                   -
# Quantized releases (catalog INDEX.md, "Quantized checkpoints"); their quantization in test_quant.py.
Qwen__Qwen3-30B-A3B-GPTQ-Int4.json                         qwen3_moe         128  8      768    2048    2048    -       float16   gptq                -
QuantTrio__MiniMax-M2-AWQ.json                             minimax           256  8      1536   3072    3072    -       float16   awq                 -
poolside__Laguna-XS.2-INT4.json                            laguna            256  8      512    2048    2048    1       bfloat16  compressed-tensors  -
RedHatAI__Llama-4-Scout-17B-16E-Instruct-FP8-dynamic.json  llama4            16   1      8192   5120    5120    1       bfloat16  compressed-tensors  -
Qwen__Qwen3-30B-A3B-FP8.json                               qwen3_moe         128  8      768    2048    2048    -       bfloat16  fp8                 128x128
mistralai__Mistral-Small-4-119B-2603.json                  mistral4          128  4      2048   4096    4096    1       bfloat16  fp8                 -
nvidia__Qwen3.5-122B-A10B-NVFP4.json                       qwen3_5_moe       256  8      1024   3072    3072    1       bfloat16  modelopt            -
"""
)

FIXTURE_CASES = cases(
    """
# file                  entry             E    top_k  inter  hidden  expert  shared  dtype     quant               block
jamba.json              jamba             16   2      14336  4096    4096    -       -         -                   -  # Jamba-v0.1
olmoe.json              olmoe             64   8      1024   2048    2048    -       -         -                   -  # OLMoE-1B-7B
qwen2_moe.json          qwen2_moe         60   4      1408   2048    2048    1       -         -                   -  # Qwen1.5-MoE-A2.7B
qwen3_5_moe_text.json   qwen3_next        256  8      512    2048    2048    1       -         -                   -  # Qwen3.5-35B-A3B text
qwen3_omni_moe.json     qwen3_omni_moe    128  8      768    2048    2048    -       -         -                   -  # Qwen3-Omni-30B-A3B thinker
kimi_linear.json        kimi_linear       256  8      1024   2304    2304    1       -         -                   -  # Kimi-Linear-48B-A3B
kimi_k25.json           deepseek_vl_text  384  8      2048   7168    7168    1       -         -                   -  # Kimi-K2.5 (K2 text model)
kimi_k25_int4.json      deepseek_vl_text  384  8      2048   7168    7168    1       -         compressed-tensors  -  # Kimi-K2.5 with its int4 W4A16 quantization_config
deepseek_v4_flash.json  deepseek          256  6      2048   4096    4096    1       -         fp8                 128x128  # DeepSeek-V4 defaults with Flash's expert_dtype fp4 and fp8 block config
kimi_vl.json            deepseek_vl_text  64   6      1408   2048    2048    2       bfloat16  -                   -  # Kimi-VL-A3B
deepseek_v4.json        deepseek          256  6      2048   4096    4096    1       -         -                   -  # transformers' defaults
ernie4_5_moe.json       ernie4_5_moe      64   6      1536   2560    2560    2       -         -                   -  # ERNIE-4.5-21B-A3B
granitemoeshared.json   granitemoe        8    2      11008  4096    4096    -       -         -                   -  # class defaults
jetmoe.json             jetmoe            8    2      5632   2048    2048    -       -         -                   -  # JetMoE-8B
longcat_flash.json      longcat_flash     512  12     2048   6144    6144    -       -         -                   -  # LongCat-Flash
nemotron_h_latent.json  nemotron_h        8    2      7688   4096    1024    1       -         -                   -  # latent MoE
gemma4_moe.json         gemma4            128  8      704    2304    2304    -       -         -                   -  # top_k_experts
exaone_moe.json         exaone_moe        64   8      1024   4096    4096    1       -         -                   -  # class defaults
step3p5.json            step3             288  8      1280   4096    4096    -       -         -                   -  # Step-3.5 sizes
step3.json              step3             48   3      5120   7168    7168    -       bfloat16  -                   -  # Step3
grok1.json              grok              8    2      32768  6144    6144    -       bfloat16  -                   -  # Grok-1
bailing_moe_v2.json     bailing_moe       256  8      512    2048    2048    1       bfloat16  -                   -  # Ling-mini-2.0
llama4_text.json        llama4            16   1      8192   5120    5120    1       -         -                   -  # Llama4ForCausalLM, flat
bailing_hybrid.json     bailing_hybrid    512  8      768    2560    2560    1       -         -                   -  # class defaults
# HunYuan checkpoints that write moe_topk etc. as plain numbers (catalog file, lists collapsed)
hunyuan_scalar.json     hunyuan_moe       64   8      3072   4096    4096    1       bfloat16  -                   -
# Ling's base config says n_routed_experts where the chat config says num_experts
ling_base.json          bailing_moe       64   6      1408   2048    2048    2       bfloat16  -                   -
# Real W8A8 int8 config (README.md: not upstream, not built by build_fixtures.py).
qwen3_6_w8a8_int8.json  qwen3_5_moe       256  8      512    2048    2048    1       bfloat16  compressed-tensors  -
"""
)


@pytest.fixture(scope="module")
def registry():
    return load_registry()


def _check(path, expected, registry):
    entry, experts, top_k, inter, hidden, expert_hidden, shared, dtype, quant, block = expected
    extraction = extract_shape(json.loads(path.read_text()), registry)
    shape = extraction.shape
    assert extraction.entry == entry
    assert not extraction.guessed
    assert (shape.num_experts, shape.top_k) == (experts, top_k)
    assert (shape.intermediate_size, shape.hidden_size) == (inter, hidden)
    assert shape.expert_hidden_size == expert_hidden
    assert shape.num_shared_experts == shared
    assert (shape.dtype, shape.quant_method, shape.weight_block_size) == (dtype, quant, block)
    return extraction


@pytest.mark.parametrize("name", sorted(CATALOG_CASES))
def test_catalog_config(name, registry):
    _check(CATALOG / name, CATALOG_CASES[name], registry)


@pytest.mark.parametrize("name", sorted(FIXTURE_CASES))
def test_fixture_config(name, registry):
    _check(FIXTURES / name, FIXTURE_CASES[name], registry)


def test_every_catalog_file_has_a_case():
    assert sorted(p.name for p in CATALOG.glob("*.json")) == sorted(CATALOG_CASES)


def test_every_fixture_has_a_case():
    assert sorted(p.name for p in FIXTURES.glob("*.json")) == sorted(FIXTURE_CASES)


def test_every_entry_is_exercised(registry):
    used = {case[0] for case in {**CATALOG_CASES, **FIXTURE_CASES}.values()}
    unused = {entry.name for entry in registry.entries if not entry.fallback} - used
    assert not unused, f"entries with no test config: {sorted(unused)}"


def test_kimi_k3_reads_the_moe_top_k_not_the_sampling_top_k(registry):
    extraction = _check(
        CATALOG / "moonshotai__Kimi-K3.json", CATALOG_CASES["moonshotai__Kimi-K3.json"], registry
    )
    assert extraction.sources["top_k"] == "text_config.num_experts_per_token"
    assert extraction.sources["expert_hidden_size"] == "text_config.routed_expert_hidden_size"
    assert extraction.sources["quant_method"] == "text_config.quantization_config.quant_method"


@pytest.mark.parametrize(
    "name, param, source",
    [
        ("tencent__Hunyuan-A13B-Instruct.json", "top_k", "moe_topk[0]"),
        ("baidu__ERNIE-4.5-VL-28B-A3B-PT.json", "num_experts", "moe_num_experts[0]"),
        ("databricks__dbrx-instruct.json", "hidden_size", "d_model"),
        ("databricks__dbrx-instruct.json", "top_k", "ffn_config.moe_top_k"),
        (
            "meta-llama__Llama-4-Scout-17B-16E-Instruct.json",
            "intermediate_size",
            "text_config.intermediate_size",
        ),
        ("openai__gpt-oss-120b.json", "top_k", "num_experts_per_tok"),
        (
            "deepseek-ai__DeepSeek-V3.json",
            "weight_block_size",
            "quantization_config.weight_block_size",
        ),
        ("Qwen__Qwen3.5-35B-A3B.json", "dtype", "text_config.dtype"),
        ("Qwen__Qwen3.5-35B-A3B.json", "num_shared_experts", "default"),
    ],
)
def test_sources_name_the_path(name, param, source, registry):
    extraction = extract_shape(json.loads((CATALOG / name).read_text()), registry)
    assert extraction.sources[param] == source


def test_ling_base_config_uses_n_routed_experts(registry):
    extraction = extract_shape(json.loads((FIXTURES / "ling_base.json").read_text()), registry)
    assert extraction.sources["num_experts"] == "n_routed_experts"


def test_configs_saved_by_installed_transformers_resolve_without_defaults(registry):
    """A config.json written by today's transformers (its canonical field names) resolves.

    transformers may store a field under another name than older checkpoints
    (Qwen3-MoE: num_experts -> num_local_experts); the registry must read both.
    """
    transformers = pytest.importorskip("transformers")
    import warnings

    checked = []
    for entry in registry.entries:
        for model_type in entry.model_types:
            if model_type not in transformers.CONFIG_MAPPING:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                config = json.loads(
                    transformers.CONFIG_MAPPING[model_type]().to_json_string(use_diff=False)
                )
            config["model_type"] = model_type
            config.pop("architectures", None)
            if model_type in ("deepseek_v2", "dots1", "gemma4", "gemma4_text"):
                continue  # these classes default the MoE fields to None (dense)
            extraction = extract_shape(config, registry)
            assert extraction.entry == entry.name, model_type
            from_defaults = [
                k for k, v in extraction.sources.items() if v == "transformers default"
            ]
            assert from_defaults == [], (model_type, from_defaults)
            checked.append(model_type)
    assert len(checked) >= 30


@pytest.mark.parametrize(
    "path",
    sorted(CATALOG.glob("*.json")) + sorted(FIXTURES.glob("*.json")),
    ids=lambda p: p.name,
)
def test_generic_fallback_alone_guesses_the_kernel_shape(path, registry, tmp_path):
    """With only the `generic` entry, every test config still gives the right E, top-k, N and K.

    The guess is what a brand-new model gets before anyone writes its entry;
    literal defaults (a shared-expert count the config does not state) cannot be guessed.
    """
    fallback = registry.fallback.to_yaml_dict()
    common = {"dtype": ["torch_dtype", "dtype", "/torch_dtype", "/dtype"]}
    mappings = tmp_path / "generic.yaml"
    mappings.write_text(
        yaml.safe_dump({"version": 1, "common_params": common, "entries": [fallback]})
    )
    config = json.loads(path.read_text())
    guessed = extract_shape(config, load_registry(str(mappings), replace=True))
    known = extract_shape(config, registry).shape
    assert guessed.guessed
    shape = guessed.shape
    assert (shape.num_experts, shape.top_k, shape.intermediate_size, shape.expert_hidden_size) == (
        known.num_experts,
        known.top_k,
        known.intermediate_size,
        known.expert_hidden_size,
    )
