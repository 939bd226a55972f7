"""`build_report`: the model -> sharded shape -> file names path that `extract` and `tune` share."""

import json

import pytest

from moetune.engines import names
from moetune.extract.report import build_report, resolve_device_name

BRIEF_KEYS = {
    "num_experts", "top_k", "intermediate_size", "hidden_size", "expert_hidden_size",
    "num_shared_experts", "dtype", "quant_method", "weight_block_size", "local_experts",
    "local_intermediate_size", "w1_width", "tp_size", "ep_size", "vllm_config_file",
    "sglang_config_file", "sources", "guessed", "architecture", "entry", "config_source",
}  # fmt: skip


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("MOETUNE_MAPPINGS", raising=False)


def test_kimi_k3_report_on_an_h200_variant():
    report = build_report(
        "moonshotai/Kimi-K3", tp=8, ep=True, device_name="NVIDIA H200 141GB HBM3e"
    )
    assert report.sharded.local_experts == 112
    assert report.vllm_config_file == "E=112,N=3072,device_name=NVIDIA_H200.json"
    assert report.sglang_config_file == "E=112,N=3072,device_name=NVIDIA_H200_141GB_HBM3e.json"
    assert report.device.source == "--device-name"
    notes = " | ".join(report.notes)
    assert "quant_method 'compressed-tensors'" in notes  # MXFP4 experts: not these files' kernel
    assert "2 shared expert(s)" in notes and "E=112 + the fused ones" in notes
    assert "no GPU visible" not in notes


def test_to_dict_is_json_with_the_documented_keys():
    data = build_report("deepseek-ai/DeepSeek-V3", tp=8, ep=True).to_dict()
    assert BRIEF_KEYS <= data.keys()
    assert json.loads(json.dumps(data)) == data
    assert (data["engine_dtype"], data["block_shape"], data["weight_block_size"]) == (
        "fp8_w8a8",
        [128, 128],
        [128, 128],
    )
    assert (data["local_experts"], data["local_intermediate_size"]) == (32, 2048)


def test_device_name_sources(monkeypatch):
    monkeypatch.setattr(names, "detect_device_name", lambda: "NVIDIA H100 80GB HBM3")
    assert resolve_device_name(None).source == "nvidia-smi"
    assert resolve_device_name("NVIDIA B200").name == "NVIDIA B200"
    monkeypatch.setattr(names, "detect_device_name", lambda: None)
    fallback = resolve_device_name(None)
    assert (fallback.name, fallback.source) == ("NVIDIA H200", "fallback: no GPU visible")
