"""The backend table (moetune/data/backends.yaml) on real released config.json files.

Each expectation is what the engines' selection code picks (the row's `source`), for a
checkpoint moetune bundles (moetune/catalog/) or a fixture whose provenance
tests/fixtures/configs/README.md gives. The engines are not installed here: the table's
current releases answer (vLLM 0.34.0, SGLang 0.5.23).
"""

import json
from pathlib import Path

import pytest
import yaml

from moetune.engines import backends, names
from moetune.engines.backends import (
    Deployment,
    choose,
    gpu_family,
    load_table,
    release_to_follow,
)
from moetune.errors import InvalidMappingsError
from moetune.extract.backend_case import refined_fp8_block
from moetune.extract.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "configs"
HOPPER, BLACKWELL = "NVIDIA H200", "NVIDIA B200"


@pytest.fixture(autouse=True)
def hermetic(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("MOETUNE_MAPPINGS", raising=False)
    monkeypatch.setattr(names, "detect_device_name", lambda: None)
    monkeypatch.setattr(backends, "installed_version", lambda engine: None)


def backend(model, device, engine, **layout):
    report = build_report(model, device_name=device, **layout)
    choice = report.backend_for(engine)
    assert choice is not None, (model, device, engine)
    return choice


@pytest.mark.parametrize(
    ("model", "layout", "device", "engine", "expected"),
    [
        # bf16: Triton on Hopper; vLLM's FlashInfer TRT-LLM on Blackwell; SGLang's Qwen3
        # override on Blackwell, Triton for the others.
        ("Qwen/Qwen3-30B-A3B", {}, HOPPER, "vllm", "triton"),
        ("Qwen/Qwen3-30B-A3B", {}, BLACKWELL, "vllm", "flashinfer_trtllm"),
        ("Qwen/Qwen3-30B-A3B", {}, HOPPER, "sglang", "triton"),
        ("Qwen/Qwen3-30B-A3B", {}, BLACKWELL, "sglang", "flashinfer_trtllm"),
        ("mistralai/Mixtral-8x7B-v0.1", {}, BLACKWELL, "sglang", "triton"),
        ("zai-org/GLM-4.5-Air", {}, BLACKWELL, "sglang", "flashinfer_trtllm"),
        # block fp8: Triton on Hopper under TP, FlashInfer CUTLASS with EP; TRT-LLM on
        # Blackwell; SGLang keeps Triton for DeepSeek on both.
        ("deepseek-ai/DeepSeek-V3", {"tp": 8}, HOPPER, "vllm", "triton"),
        ("deepseek-ai/DeepSeek-V3", {"tp": 8, "ep": True}, HOPPER, "vllm", "flashinfer_cutlass"),
        ("deepseek-ai/DeepSeek-V3", {"tp": 8}, BLACKWELL, "vllm", "flashinfer_trtllm"),
        ("deepseek-ai/DeepSeek-V3", {"tp": 8}, BLACKWELL, "sglang", "triton"),
        ("deepseek-ai/DeepSeek-V3", {"tp": 8, "ep": True}, HOPPER, "sglang", "triton"),
        ("Qwen/Qwen3-30B-A3B-FP8", {"tp": 2}, BLACKWELL, "vllm", "flashinfer_trtllm"),
        ("Qwen/Qwen3-30B-A3B-FP8", {"tp": 2}, BLACKWELL, "sglang", "flashinfer_trtllm"),
        # fp8 per-tensor with static activation scales: FlashInfer in vLLM, Triton in SGLang.
        ("mistralai/Mistral-Small-4-119B-2603", {"tp": 2}, HOPPER, "vllm", "flashinfer_cutlass"),
        ("mistralai/Mistral-Small-4-119B-2603", {"tp": 2}, BLACKWELL, "vllm", "flashinfer_trtllm"),
        ("mistralai/Mistral-Small-4-119B-2603", {"tp": 2}, HOPPER, "sglang", "triton"),
        # weight-only int4: Marlin.
        ("Qwen/Qwen3-30B-A3B-GPTQ-Int4", {}, HOPPER, "vllm", "marlin"),
        ("Qwen/Qwen3-30B-A3B-GPTQ-Int4", {}, HOPPER, "sglang", "marlin"),
        ("QuantTrio/MiniMax-M2-AWQ", {"tp": 4}, BLACKWELL, "vllm", "marlin"),
        # compressed-tensors FP8-dynamic (per-channel): vLLM's CUTLASS, SGLang's Triton.
        (
            "RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic",
            {},
            HOPPER,
            "vllm",
            "vllm_cutlass",
        ),
        (
            "RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic",
            {},
            BLACKWELL,
            "sglang",
            "triton",
        ),
        # fp4 checkpoints.
        ("openai/gpt-oss-120b", {}, HOPPER, "vllm", "oai_triton_kernels"),
        ("openai/gpt-oss-120b", {}, BLACKWELL, "sglang", "flashinfer_trtllm"),
        ("openai/gpt-oss-120b", {}, HOPPER, "sglang", "oai_triton_kernels"),
        ("moonshotai/Kimi-K3", {"tp": 8}, BLACKWELL, "sglang", "flashinfer_trtllm"),
        ("nvidia/Qwen3.5-122B-A10B-NVFP4", {}, BLACKWELL, "vllm", "flashinfer_trtllm"),
    ],
)
def test_backend_of_a_released_checkpoint(model, layout, device, engine, expected):
    assert backend(model, device, engine, **layout).backend == expected


def test_kimi_k25_int4_runs_on_marlin_or_trtllm_never_triton():
    model = str(FIXTURES / "kimi_k25_int4.json")
    assert backend(model, HOPPER, "vllm", tp=8).backend == "marlin"
    # int4 group 32 symmetric: FlashInfer's MxInt4 TRT-LLM kernel on Blackwell, not with EP.
    assert backend(model, BLACKWELL, "vllm", tp=8).backend == "flashinfer_trtllm"
    assert backend(model, BLACKWELL, "vllm", tp=8, ep=True).backend == "marlin"
    assert backend(model, HOPPER, "sglang", tp=8).backend == "marlin"
    # SGLang 0.5.23 on sm100: its Triton WNA16 runner (symmetric int4, group 32).
    assert backend(model, BLACKWELL, "sglang", tp=8).backend == "triton"
    report = build_report(model, tp=8, device_name=HOPPER)
    assert not any(c.reads_files for c in report.backends if c.family == "hopper")


@pytest.mark.parametrize(
    ("group_size", "zero_point", "desc_act", "expected"),
    [
        (32, False, None, "triton"),
        (128, False, False, "triton"),
        (64, False, None, "marlin"),  # the Triton WNA16 runner takes group 32 or 128 only
        (128, True, None, "marlin"),  # asymmetric
        (128, False, True, "marlin"),  # act-order
    ],
)
def test_sglang_blackwell_compressed_tensors_w4a16(group_size, zero_point, desc_act, expected):
    target = Deployment(
        case="wna16",
        family="blackwell",
        quant_method="compressed-tensors",
        bits=4,
        group_size=group_size,
        zero_point=zero_point,
        desc_act=desc_act,
    )
    assert choose("sglang", target, "0.5.23", "test").backend == expected
    gptq = Deployment(**{**target.__dict__, "quant_method": "gptq"})
    assert choose("sglang", gptq, "0.5.23", "test").backend == "marlin"


def test_deepseek_v4_flash_fp4_experts_are_not_the_fp8_block_triton_path():
    report = build_report(str(FIXTURES / "deepseek_v4_flash.json"), tp=8, device_name=HOPPER)
    experts = report.quant.experts
    assert experts.backend_case == "fp4_experts"
    assert experts.dtype is None  # no Triton config file
    plans = report.engine_plans[experts.name]
    assert not plans["vllm"].reads_files and plans["vllm"].file_name is None
    assert {c.engine: c.backend for c in report.backends if c.family == "hopper"} == {
        "vllm": "marlin",
        "sglang": "flashinfer_cutlass",
    }
    assert {c.engine: c.backend for c in report.backends if c.family == "blackwell"} == {
        "vllm": "flashinfer_trtllm",
        "sglang": "flashinfer_trtllm",
    }
    assert report.kernel_dtype.engine_dtype is None


def test_deepseek_v4_with_fp8_experts_stays_on_the_fp8_block_rules(tmp_path):
    config = json.loads((FIXTURES / "deepseek_v4_flash.json").read_text())
    config["expert_dtype"] = "fp8"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    report = build_report(str(path), tp=8, device_name=HOPPER)
    assert report.quant.experts.backend_case == "fp8_block"
    assert report.backend_for("vllm").backend == "triton"


def test_extract_json_names_every_engine_on_both_families():
    report = build_report("deepseek-ai/DeepSeek-V3", tp=8, device_name=HOPPER)
    data = report.to_dict()
    assert data["gpu_family"] == "hopper"
    seen = {(b["engine"], b["release"], b["gpu_family"]) for b in data["backends"]}
    assert seen == {
        ("vllm", "0.34.0", "hopper"),
        ("vllm", "0.34.0", "blackwell"),
        ("sglang", "0.5.23", "hopper"),
        ("sglang", "0.5.23", "blackwell"),
    }
    assert all(b["source"] and b["release_source"] for b in data["backends"])


def test_a_gpu_outside_the_table_gets_no_backend_and_a_note():
    report = build_report("Qwen/Qwen3-30B-A3B", device_name="NVIDIA A100-SXM4-80GB")
    assert report.gpu_family is None and report.backend_for("vllm") is None
    assert any("not a GPU of moetune's backend table" in note for note in report.notes)


@pytest.mark.parametrize(
    ("device", "family"),
    [
        ("NVIDIA H100 80GB HBM3", "hopper"),
        ("NVIDIA H200 NVL", "hopper"),
        ("NVIDIA_H20-3e", "hopper"),
        ("NVIDIA GH200 480GB", "hopper"),
        ("NVIDIA B200", "blackwell"),
        ("NVIDIA GB200", "blackwell"),
        ("NVIDIA B300 SXM6 AC", "blackwell"),
        ("NVIDIA A100-SXM4-80GB", None),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", None),  # sm120, not sm100
        ("NVIDIA GB10", None),
    ],
)
def test_gpu_family_of_torch_device_names(device, family):
    assert gpu_family(device) == family


def test_release_to_follow():
    assert release_to_follow("vllm", None) == (
        "0.34.0",
        "not installed: the newest release moetune has read",
    )
    assert release_to_follow("vllm", "0.33.0") == ("0.33.0", "installed")
    assert release_to_follow("vllm", "0.35.1")[0] == "0.34.0"
    release, why = release_to_follow("sglang", "0.5.10")
    assert release == "0.5.23" and "older than the table" in why


def test_vllm_033_and_034_share_one_table():
    table = load_table()
    assert table.releases("vllm")["0.33.0"] == table.releases("vllm")["0.34.0"]


def test_every_case_a_quant_rule_names_has_a_row_per_engine_and_family():
    from moetune.extract.quant import load_rules

    cases = {k["backend_case"] for k in load_rules().kernels.values()} | {"unquantized"}
    table = load_table()
    for engine in ("vllm", "sglang"):
        for release in table.releases(engine):
            for case in cases:
                for family in table.families:
                    # SGLang names a backend for MXFP4 only for the models it overrides.
                    architecture = "GptOssForCausalLM" if case == "mxfp4" else None
                    target = Deployment(case=case, family=family, architecture=architecture)
                    assert choose(engine, target, release, "test") is not None, (
                        engine,
                        release,
                        case,
                        family,
                    )


def test_refined_fp8_block():
    # Qwen3-30B-A3B-FP8 at TP4 (768 / 4 = 192): vLLM would refine its block to [64, 64],
    # which only Triton takes (moetune's sharding refuses that split today).
    assert refined_fp8_block((128, 128), 192, 2048, 4) == (64, 64)
    assert refined_fp8_block((128, 128), 384, 2048, 2) is None
    assert refined_fp8_block((128, 128), 16, 2048, 8) is None  # below 32: no refinement


def test_a_row_naming_an_unknown_backend_is_one_line(tmp_path):
    data = yaml.safe_load(backends.table_path().read_text())
    data["tables"]["sglang_0_5_23"][0]["backend"] = "cuda_magic"
    path = tmp_path / "backends.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InvalidMappingsError, match="unknown backend 'cuda_magic'"):
        load_table(str(path))


def test_ernie_45_vl_says_its_vision_experts_are_left_out():
    # Real released config: moe_intermediate_size [1536, 512] is [text, vision]; both are
    # FusedMoE layers in vLLM's and SGLang's ernie45_vl_moe.
    report = build_report("baidu/ERNIE-4.5-VL-28B-A3B-PT", device_name=HOPPER)
    assert report.extraction.shape.intermediate_size == 1536
    (note,) = [n for n in report.notes if "second MoE shape" in n]
    assert "moe_intermediate_size[1] = 512" in note and "vision experts" in note


def test_a_list_of_equal_sizes_is_no_second_shape(tmp_path):
    config = json.loads(
        (Path(__file__).resolve().parents[2] / "moetune" / "catalog")
        .joinpath("baidu__ERNIE-4.5-VL-28B-A3B-PT.json")
        .read_text()
    )
    config["moe_intermediate_size"] = [1536, 1536]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    report = build_report(str(path), device_name=HOPPER)
    assert not any("second MoE shape" in n for n in report.notes)


def test_vllm_blackwell_bf16_past_2048_experts_goes_to_flashinfer_cutlass_not_triton():
    # TRT-LLM rejects more than 2048 experts; FLASHINFER_CUTLASS is next in the CUDA list.
    many = Deployment(case="unquantized", family="blackwell", num_experts=4096)
    assert choose("vllm", many, "0.34.0", "test").backend == "flashinfer_cutlass"
    few = Deployment(case="unquantized", family="blackwell", num_experts=2048)
    assert choose("vllm", few, "0.34.0", "test").backend == "flashinfer_trtllm"
    oai = Deployment(case="unquantized", family="blackwell", architecture="GptOssForCausalLM")
    assert choose("vllm", oai, "0.34.0", "test").backend == "triton"
