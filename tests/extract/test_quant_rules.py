"""Quantized checkpoints: the rules in quant_rules.yaml against real released configs.

Each real config (moetune/catalog/, provenance in its INDEX.md; the W8A8 one in
tests/fixtures/configs/) is checked end to end through `build_report`: the
experts' kernel dtype, its details (group size, zero points, block shape,
per-channel), what each engine runs by default and the file each engine looks
up. The expected values come from the configs themselves and the engines'
public code (see the comments in quant_rules.yaml).
"""

import json
from pathlib import Path

import pytest
import yaml

from moetune.dtypes import engine_file_n, engine_write_refusal
from moetune.errors import InvalidMappingsError
from moetune.extract.quant import (
    detect_quantization,
    engine_plan,
    layer_ranges,
    load_rules,
    module_matches,
)
from moetune.extract.report import build_report, quant_lines

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "moetune" / "catalog"
FIXTURES = ROOT / "tests" / "fixtures" / "configs"
H200 = "NVIDIA H200"


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("MOETUNE_MAPPINGS", raising=False)


# path, tp: E, N, experts' dtype, block_shape, per_channel, vLLM file, SGLang file,
# (vLLM reads the files by default, SGLang reads them by default)
CASES = {
    "gptq-int4": (
        CATALOG / "Qwen__Qwen3-30B-A3B-GPTQ-Int4.json",
        1,
        (128, 768, "int4_w4a16", (0, 128), False),
        "E=128,N=768,device_name=NVIDIA_H200,dtype=int4_w4a16.json",
        # SGLang keys int4 on w2's packed last dim: N // 2.
        "E=128,N=384,device_name=NVIDIA_H200,dtype=int4_w4a16.json",
        (False, False),
    ),
    "awq-int4": (
        CATALOG / "QuantTrio__MiniMax-M2-AWQ.json",
        4,
        (256, 384, "int4_w4a16", (0, 128), False),
        "E=256,N=384,device_name=NVIDIA_H200,dtype=int4_w4a16.json",
        "E=256,N=192,device_name=NVIDIA_H200,dtype=int4_w4a16.json",
        (False, False),
    ),
    "ct-w4a16-mixed": (
        CATALOG / "poolside__Laguna-XS.2-INT4.json",
        1,
        (256, 512, "int4_w4a16", (0, 128), False),
        "E=256,N=512,device_name=NVIDIA_H200,dtype=int4_w4a16.json",
        "E=256,N=256,device_name=NVIDIA_H200,dtype=int4_w4a16.json",
        (False, False),
    ),
    "ct-w8a8-int8": (
        FIXTURES / "qwen3_6_w8a8_int8.json",
        1,
        (256, 512, "int8_w8a8", None, True),
        # vLLM has no int8_w8a8 dtype string: it looks up the unquantized name.
        "E=256,N=512,device_name=NVIDIA_H200.json",
        "E=256,N=512,device_name=NVIDIA_H200,dtype=int8_w8a8,per_channel_quant=True.json",
        (True, True),
    ),
    "ct-fp8-dynamic-per-channel": (
        CATALOG / "RedHatAI__Llama-4-Scout-17B-16E-Instruct-FP8-dynamic.json",
        4,
        (16, 2048, "fp8_w8a8", None, True),
        "E=16,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
        "E=16,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,per_channel_quant=True.json",
        (False, True),
    ),
    "fp8-block": (
        CATALOG / "Qwen__Qwen3-30B-A3B-FP8.json",
        1,
        (128, 768, "fp8_w8a8", (128, 128), False),
        "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
        "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json",
        (True, True),
    ),
    "fp8-per-tensor-static": (
        CATALOG / "mistralai__Mistral-Small-4-119B-2603.json",
        2,
        (128, 1024, "fp8_w8a8", None, False),
        "E=128,N=1024,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
        "E=128,N=1024,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
        (False, True),  # vLLM: FlashInfer CUTLASS (Hopper) / TRT-LLM (Blackwell)
    ),
    "nvfp4": (
        CATALOG / "nvidia__Qwen3.5-122B-A10B-NVFP4.json",
        1,
        (256, 1024, None, None, False),
        None,
        None,
        (False, False),
    ),
    "mxfp4": (
        CATALOG / "openai__gpt-oss-120b.json",
        1,
        (128, 2880, None, None, False),
        None,
        None,
        (False, False),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_real_config_kernel_and_engine_files(case):
    path, tp, expected, vllm_file, sglang_file, reads = CASES[case]
    E, N, dtype, block, per_channel = expected
    report = build_report(str(path), tp=tp, device_name=H200)
    assert (report.sharded.local_experts, report.sharded.intermediate_size) == (E, N)
    experts = report.quant.experts
    assert experts.dtype == dtype
    assert experts.block_shape == block
    assert experts.per_channel is per_channel
    plans = report.engine_plans[experts.name]
    assert plans["vllm"].file_name == vllm_file
    assert plans["sglang"].file_name == sglang_file
    assert (plans["vllm"].reads_files, plans["sglang"].reads_files) == reads
    if dtype is not None:
        # auto follows the checkpoint: the report's own names are the experts' files.
        assert report.kernel_dtype.engine_dtype == dtype
        assert report.vllm_config_file == vllm_file
        assert report.sglang_config_file == sglang_file
    else:
        # No Triton file: the names stay the unquantized kernel's, and a note says why.
        assert report.kernel_dtype.engine_dtype is None
        assert "no Triton config file" in " ".join(report.notes)
        assert "no Triton config file: served by" in plans["vllm"].why_not
    data = json.loads(json.dumps(report.to_dict()))
    group = next(g for g in data["quantization"]["groups"] if g["name"] == experts.name)
    assert group["engines"]["vllm"]["file"] == vllm_file
    assert group["engines"]["sglang"]["file"] == sglang_file


def test_gptq_details_and_how_to_reach_the_triton_kernel():
    report = build_report(str(CASES["gptq-int4"][0]), device_name=H200)
    gptq = report.quant.experts
    assert (gptq.scheme, gptq.bits, gptq.group_size) == ("gptq", 4, 128)
    assert gptq.zero_point is False  # sym: true
    assert gptq.desc_act is False
    vllm, sglang = report.engine_plans["gptq"]["vllm"], report.engine_plans["gptq"]["sglang"]
    assert "Marlin" in vllm.kernel and "Marlin" in sglang.kernel
    assert vllm.triton.startswith("--quantization moe_wna16")
    assert sglang.triton.startswith("--quantization moe_wna16")
    lines = "\n".join(quant_lines(report))
    assert "int4_w4a16 group 128, zero points no, act-order no" in lines
    assert "Triton path: --quantization moe_wna16" in lines


def test_gptq_with_act_order_has_no_triton_path():
    config = json.loads(CASES["gptq-int4"][0].read_text())
    config["quantization_config"]["desc_act"] = True
    gptq = detect_quantization(config).experts
    assert gptq.desc_act is True
    assert gptq.engines["vllm"].triton is None  # moe_wna16 refuses desc_act checkpoints


def test_awq_zero_points():
    awq = detect_quantization(json.loads(CASES["awq-int4"][0].read_text())).experts
    assert (awq.scheme, awq.bits, awq.group_size, awq.zero_point) == ("awq", 4, 128, True)


def test_gptq_8bit_is_int8_w8a16():
    config = json.loads(CASES["gptq-int4"][0].read_text())
    config["quantization_config"]["bits"] = 8
    group = detect_quantization(config).experts
    assert (group.dtype, group.block_shape) == ("int8_w8a16", (0, 128))
    assert engine_plan(group, 128, 768, H200)["vllm"].file_name == (
        "E=128,N=768,device_name=NVIDIA_H200,dtype=int8_w8a16.json"
    )


def test_mixed_precision_names_each_groups_file_and_layers():
    report = build_report(str(CASES["ct-w4a16-mixed"][0]), device_name=H200)
    quant = report.quant
    assert quant.mixed
    by_name = {g.name: g for g in quant.expert_groups}
    assert layer_ranges(by_name["group_0"].expert_layers) == "1-30"  # layer 0 is dense
    assert layer_ranges(by_name["group_1"].expert_layers) == "31-39"
    assert by_name["group_1"].dtype == "int8_w8a16"
    assert not by_name["group_1"].tunable  # group-wise int8 scales: tune runs per-channel only
    assert report.engine_plans["group_1"]["sglang"].file_name == (
        "E=256,N=512,device_name=NVIDIA_H200,dtype=int8_w8a16.json"
    )
    assert quant.experts.name == "group_0"  # 30 layers against 9
    assert any("mixed precision" in note and "31-39" in note for note in report.notes)


def test_w8a8_vllm_file_is_not_written():
    report = build_report(str(CASES["ct-w8a8-int8"][0]), device_name=H200)
    vllm = report.engine_plans["group_0"]["vllm"]
    assert not vllm.writable and "unquantized file name" in vllm.why_not
    assert report.quant.gate_excluded  # its `ignore` lists every router gate


def test_fp8_static_is_named_but_not_tunable():
    group = detect_quantization(json.loads(CASES["fp8-per-tensor-static"][0].read_text())).experts
    assert group.static_activations and group.activation_scheme == "static"
    assert not group.tunable
    plan = engine_plan(group, 128, 2048, H200)["sglang"]
    assert plan.file_name == "E=128,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    assert "cannot time fp8_w8a8 static activation scales" in plan.why_not


def test_fp8_block_is_tunable_today():
    group = detect_quantization(json.loads(CASES["fp8-block"][0].read_text())).experts
    assert group.tunable
    assert all(p.writable for p in engine_plan(group, 128, 768, H200).values())


def test_kimi_k3_mxfp4_experts_in_compressed_tensors():
    quant = detect_quantization(json.loads((CATALOG / "moonshotai__Kimi-K3.json").read_text()))
    assert quant.source == "text_config.quantization_config"
    assert (quant.experts.kernel, quant.experts.group_size) == ("mxfp4", 32)


def test_compressed_tensors_fp8_block_structure():
    config = {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"type": "float", "num_bits": 8, "block_structure": [128, 128]},
                    "input_activations": {"type": "float", "num_bits": 8, "dynamic": True},
                }
            },
        }
    }
    group = detect_quantization(config).experts
    assert (group.scheme, group.dtype, group.block_shape) == (
        "ct_fp8_block",
        "fp8_w8a8",
        (128, 128),
    )


def test_experts_left_out_run_unquantized():
    config = {
        "num_hidden_layers": 2,
        "quantization_config": {
            "quant_method": "awq",
            "bits": 4,
            "group_size": 128,
            "zero_point": True,
            "modules_to_not_convert": ["experts"],
        },
    }
    quant = detect_quantization(config)
    assert quant.experts is None and quant.experts_excluded
    assert any("run unquantized" in note for note in quant.notes)


def test_unknown_scheme_is_said_not_guessed():
    config = {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}
    quant = detect_quantization(config)
    assert quant.experts.scheme is None and quant.experts.dtype is None
    assert "no rule in quant_rules.yaml" in quant.notes[0]


def test_no_quantization_config():
    assert detect_quantization({"num_experts": 8}) is None


@pytest.mark.parametrize(
    "pattern, name, hit",
    [
        (
            r"re:.*layers\.([1-9]|[12]\d|30)\..*(gate_proj)$",
            "model.layers.7.mlp.experts.0.gate_proj",
            True,
        ),
        (
            r"re:.*layers\.([1-9]|[12]\d|30)\..*(gate_proj)$",
            "model.layers.31.mlp.experts.0.gate_proj",
            False,
        ),
        ("model.layers.*.mlp.router", "model.layers.3.mlp.router", True),
        ("model.layers.1.mlp.gate", "model.layers.1.mlp.gate", True),
        # whole dotted components only: a gate is not a gate_proj, layer 1 is not layer 10
        ("model.layers.1.mlp.gate", "model.layers.1.mlp.gate_proj", False),
        ("model.layers.1.mlp.gate", "model.layers.10.mlp.gate", False),
        ("lm_head", "lm_head", True),
    ],
)
def test_module_matches(pattern, name, hit):
    assert module_matches(pattern, name) is hit


def test_layer_ranges():
    assert layer_ranges((0, 1, 2, 5, 7, 8)) == "0-2, 5, 7-8"
    assert layer_ranges(()) == ""


def test_bad_rules_file_is_one_line(tmp_path):
    rules = yaml.safe_load((ROOT / "quant_rules.yaml").read_text())
    rules["schemes"][0]["kernel_by_bits"] = {4: "int3_w3a16"}
    bad = tmp_path / "rules.yaml"
    bad.write_text(yaml.safe_dump(rules))
    with pytest.raises(InvalidMappingsError, match="unknown kernel 'int3_w3a16'") as info:
        load_rules(str(bad))
    assert "\n" not in str(info.value)
    del rules["schemes"][0]["engines"]
    bad.write_text(yaml.safe_dump(rules))
    with pytest.raises(InvalidMappingsError, match="schemes/0"):
        load_rules(str(bad))


def test_engine_file_n_sglang_keys_int4_on_the_packed_dim():
    # moe_wna16 stores w2 as [E, K, N // 2] uint8; vLLM doubles it back, SGLang does not.
    assert engine_file_n("vllm", 768, "int4_w4a16") == 768
    assert engine_file_n("sglang", 768, "int4_w4a16") == 384
    assert engine_file_n("sglang", 768, "int8_w8a16") == 768
    assert engine_file_n("sglang", 768, "fp8_w8a8") == 768
    assert engine_file_n("sglang", 768, None) == 768


def test_dtype_override_picks_the_mixed_checkpoints_other_group():
    report = build_report(str(CASES["ct-w4a16-mixed"][0]), dtype="int8_w8a16", device_name=H200)
    assert report.kernel_dtype.block_shape == (0, 128)  # group_1's group size
    assert report.vllm_config_file == "E=256,N=512,device_name=NVIDIA_H200,dtype=int8_w8a16.json"
    assert "int8_w8a16 group 128" in report.kernel_dtype.tune_refusal()


def test_packaged_rules_are_the_repository_file():
    from moetune.extract.quant import rules_path, rules_schema_path

    assert rules_path().resolve() == (ROOT / "quant_rules.yaml").resolve()
    assert rules_schema_path().resolve() == (ROOT / "schemas" / "quant_rules.schema.json").resolve()


def test_engine_write_refusal_for_tune():
    assert "unquantized file name" in engine_write_refusal("vllm", "int8_w8a8", per_channel=True)
    assert engine_write_refusal("sglang", "int8_w8a8", per_channel=True) is None
    assert engine_write_refusal("vllm", "fp8_w8a8", per_channel=True) is None
    assert engine_write_refusal("vllm", None) is None
