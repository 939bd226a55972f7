"""`moetune extract`, `archs` and `validate` through click's runner and a real subprocess.

Every test runs offline with a private, empty Hugging Face cache, and with no
GPU visible (the device name falls back to NVIDIA H200 unless given).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from moetune.cli import main
from moetune.engines import names

REPO_ROOT = Path(__file__).resolve().parent.parent
KIMI_K3_FILE = "E=112,N=3072,device_name=NVIDIA_H200.json"

# A new architecture that no built-in entry or generic field name covers.
ACME_CONFIG = {
    "architectures": ["AcmeMoeForCausalLM"],
    "model_type": "acme_moe",
    "d_model": 2048,
    "torch_dtype": "bfloat16",
    "moe": {"n_exp": 48, "k_active": 6, "expert_width": [1536, 1536]},
}
ACME_MAPPINGS = """\
version: 1
entries:
  - name: acme_moe
    description: Acme MoE (a user's own entry)
    architectures: [AcmeMoeForCausalLM]
    params:
      num_experts: moe.n_exp
      top_k: moe.k_active
      intermediate_size: "moe.expert_width[0]"
      hidden_size: d_model
"""


@pytest.fixture(autouse=True)
def offline_no_gpu(monkeypatch, tmp_path):
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "MOETUNE_MAPPINGS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(names, "detect_device_name", lambda: None)


def run(capsys, *args):
    """Run the CLI as `moetune` does (exit codes included); return (code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def write(path, text):
    path.write_text(text)
    return str(path)


def test_kimi_k3_tp8_ep_json(capsys):
    code, out, err = run(
        capsys, "extract", "--model", "moonshotai/Kimi-K3", "--tp", "8", "--ep", "--json"
    )
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report["config_source"].startswith(
        "bundled snapshot moonshotai__Kimi-K3.json (provenance "
    )
    assert report["entry"] and report["guessed"] is False
    assert (report["num_experts"], report["top_k"]) == (896, 16)
    assert (report["intermediate_size"], report["hidden_size"], report["expert_hidden_size"]) == (
        3072,
        7168,
        3584,
    )
    assert report["sources"]["top_k"] == "text_config.num_experts_per_token"
    assert (report["tp_size"], report["ep_size"]) == (8, 8)
    assert report["local_experts"] == 112
    assert report["local_intermediate_size"] == 3072
    assert report["w1_width"] == 6144
    assert report["w1_shape"] == [112, 6144, 3584]
    assert report["w2_shape"] == [112, 3584, 3072]
    assert report["vllm_config_file"] == KIMI_K3_FILE
    assert report["sglang_config_file"] == KIMI_K3_FILE
    assert report["device_name_source"] == "fallback: no GPU visible"


def test_kimi_k3_table(capsys):
    code, out, err = run(capsys, "extract", "--model", "moonshotai/Kimi-K3", "--tp", "8", "--ep")
    assert (code, err) == (0, "")
    assert f"  vLLM    {KIMI_K3_FILE}\n" in out
    assert f"  SGLang  {KIMI_K3_FILE}\n" in out
    assert "text_config.routed_expert_hidden_size" in out
    assert "[112, 6144, 3584]" in out
    assert "--tp 8 with EP 8 (vLLM --enable-expert-parallel = SGLang --ep-size 8)" in out
    assert "$VLLM_TUNED_CONFIG_FOLDER/" in out and "$SGLANG_MOE_CONFIG_DIR/configs/triton_" in out


def test_fp8_block_model_names_and_device_name(capsys):
    code, out, _ = run(
        capsys,
        "extract",
        "--model",
        "deepseek-ai/DeepSeek-V3",
        "--tp",
        "8",
        "--device-name",
        "NVIDIA H200 NVL",
        "--json",
    )
    report = json.loads(out)
    assert code == 0
    assert report["vllm_config_file"] == (
        "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    )
    assert report["sglang_config_file"] == (
        "E=256,N=256,device_name=NVIDIA_H200_NVL,dtype=fp8_w8a8,block_shape=[128, 128].json"
    )


def test_dtype_override_and_sglang_ep_size(capsys):
    code, out, _ = run(
        capsys,
        "extract",
        "--model",
        "mistralai/Mixtral-8x7B-v0.1",
        "--tp",
        "4",
        "--ep-size",
        "2",
        "--dtype",
        "fp8_w8a8",
        "--json",
    )
    report = json.loads(out)
    assert code == 0
    # 8 experts over EP 2, intermediate 14336 over tp/ep = 2.
    assert (report["local_experts"], report["local_intermediate_size"]) == (4, 7168)
    assert report["vllm_config_file"] == "E=4,N=7168,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"


def test_new_architecture_through_a_user_yaml(capsys, tmp_path):
    model = tmp_path / "acme"
    model.mkdir()
    write(model / "config.json", json.dumps(ACME_CONFIG))
    mappings = write(tmp_path / "acme.yaml", ACME_MAPPINGS)
    code, out, err = run(
        capsys, "extract", "--model", str(model), "--mappings", mappings, "--tp", "2", "--json"
    )
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert (report["entry"], report["guessed"]) == ("acme_moe", False)
    assert [
        report[key] for key in ("num_experts", "top_k", "intermediate_size", "hidden_size")
    ] == [
        48,
        6,
        1536,
        2048,
    ]
    assert report["sources"]["intermediate_size"] == "moe.expert_width[0]"
    assert report["vllm_config_file"] == "E=48,N=768,device_name=NVIDIA_H200.json"


def test_new_architecture_through_the_environment_variable(capsys, monkeypatch, tmp_path):
    write(tmp_path / "config.json", json.dumps(ACME_CONFIG))
    monkeypatch.setenv("MOETUNE_MAPPINGS", write(tmp_path / "acme.yaml", ACME_MAPPINGS))
    code, out, _ = run(capsys, "extract", "--model", str(tmp_path), "--json")
    assert code == 0
    assert json.loads(out)["entry"] == "acme_moe"
    code, out, _ = run(capsys, "archs", "--json")
    assert json.loads(out)["entries"][0]["name"] == "acme_moe"


def test_without_the_user_yaml_the_new_architecture_is_unknown(capsys, tmp_path):
    write(tmp_path / "config.json", json.dumps(ACME_CONFIG))
    code, out, err = run(capsys, "extract", "--model", str(tmp_path))
    assert (code, out) == (1, "")
    assert err.startswith("Error: unknown architecture 'AcmeMoeForCausalLM'")
    assert err.count("\n") == 1
    assert "add an entry" in err


# --- error paths: one line, `Error: ...`, exit 1 --------------------------------


def test_malformed_json(capsys, tmp_path):
    path = write(tmp_path / "config.json", '{"num_experts": 8,,}')
    code, out, err = run(capsys, "extract", "--model", path)
    assert (code, out) == (1, "")
    assert (
        err
        == f"Error: malformed JSON in {path} at line 1, column 19: Expecting property name enclosed in double quotes\n"
    )


def test_malformed_yaml(capsys, tmp_path):
    mappings = write(
        tmp_path / "bad.yaml", "version: 1\nentries:\n  - name: x\n   architectures: [y]\n"
    )
    code, out, err = run(capsys, "extract", "--model", "moonshotai/Kimi-K3", "--mappings", mappings)
    assert (code, out) == (1, "")
    assert err.startswith(f"Error: {mappings}:4:4: malformed YAML")
    assert err.count("\n") == 1


def test_missing_field_lists_the_paths_tried(capsys, tmp_path):
    config = json.loads((REPO_ROOT / "moetune/catalog/moonshotai__Kimi-K3.json").read_text())
    del config["text_config"]["num_experts"]
    path = write(tmp_path / "config.json", json.dumps(config))
    code, out, err = run(capsys, "extract", "--model", path)
    assert (code, out) == (1, "")
    assert err.startswith("Error: ")
    assert err.count("\n") == 1
    assert "num_experts" in err and "text_config.num_experts" in err


def test_bad_tp_split(capsys):
    code, out, err = run(capsys, "extract", "--model", "moonshotai/Kimi-K3", "--tp", "6", "--ep")
    assert (code, out) == (1, "")
    assert err == (
        "Error: --tp 6 --ep cannot split 896 experts evenly over 6 ranks; "
        "valid --tp with --ep: 1, 2, 4, 7, 8, 14, 16, 28, 32, 56, 64, 112, ...\n"
    )


def test_not_cached_while_offline(capsys, tmp_path):
    code, out, err = run(capsys, "extract", "--model", "acme/Unreleased-MoE")
    assert (code, out) == (1, "")
    assert err == (
        f"Error: acme/Unreleased-MoE is not in the Hugging Face cache ({tmp_path / 'hf_home' / 'hub'}) "
        "and HF_HUB_OFFLINE is set: run `hf download acme/Unreleased-MoE config.json` on a "
        "connected machine, pass --model /path/to/config.json\n"
    )


def test_ep_and_ep_size_together_is_a_usage_error(capsys):
    code, _, err = run(
        capsys, "extract", "--model", "moonshotai/Kimi-K3", "--tp", "8", "--ep", "--ep-size", "8"
    )
    assert code == 2
    assert err.endswith(
        "Error: --ep (vLLM: EP size = TP size) and --ep-size (SGLang) both set the EP size; pass one\n"
    )


def test_help_teaches_with_examples(capsys):
    code, out, _ = run(capsys, "extract", "--help")
    assert code == 0
    assert "moetune extract --model moonshotai/Kimi-K3 --tp 8 --ep\n" in out
    for option in (
        "--tp",
        "--ep",
        "--ep-size",
        "--dtype",
        "--device-name",
        "--revision",
        "--mappings",
        "--json",
    ):
        assert option in out


# --- archs and validate ------------------------------------------------------------


def test_archs_lists_the_registry(capsys):
    code, out, _ = run(capsys, "archs", "--json")
    listing = json.loads(out)
    assert code == 0
    names = [entry["name"] for entry in listing["entries"]]
    assert len(names) == len(set(names)) > 20
    assert listing["entries"][-1]["fallback"] is True
    assert any(
        "KimiK3ForConditionalGeneration" in entry["architectures"] for entry in listing["entries"]
    )
    code, out, _ = run(capsys, "archs")
    assert code == 0 and "(fallback)" in out and "MixtralForCausalLM" in out


def test_validate_good_and_bad_files(capsys, tmp_path):
    good = write(tmp_path / "good.yaml", ACME_MAPPINGS)
    assert run(capsys, "validate", good) == (0, f"{good}: valid\n", "")
    code, out, _ = run(capsys, "validate")
    assert code == 0 and out.endswith("moe_mappings.yaml: valid\n")
    bad = write(tmp_path / "bad.yaml", ACME_MAPPINGS.replace("      top_k: moe.k_active\n", ""))
    code, out, err = run(capsys, "validate", bad)
    assert (code, out) == (1, "")
    lines = err.splitlines()
    assert lines[-1] == f"Error: {bad}: 1 problem"
    assert "top_k" in lines[0] and bad in lines[0]


# --- the real command in a fresh interpreter ------------------------------------------

PROBE = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from moetune.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(["extract", "--model", "moonshotai/Kimi-K3", "--tp", "8", "--ep", "--json"])
        except SystemExit as exc:
            code = exc.code
    heavy = ("torch", "triton", "transformers", "huggingface_hub", "matplotlib", "moetune.report")
    loaded = [name for name in heavy if name in sys.modules]
    print(json.dumps({"code": code, "loaded": loaded, "report": json.loads(out.getvalue())}))
    """
)


def _env(tmp_path):
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1")
    env.pop("MOETUNE_MAPPINGS", None)
    return env


def test_python_m_moetune_extract_json(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "moetune", "extract", "--model", "Qwen/Qwen3-30B-A3B", "--json"],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["num_experts"], report["top_k"], report["local_intermediate_size"]) == (
        128,
        8,
        768,
    )


def test_extract_imports_neither_torch_nor_triton(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    assert probe["code"] == 0
    assert probe["report"]["local_experts"] == 112
    # huggingface_hub too: a bundled snapshot must not pay for importing it.
    assert probe["loaded"] == []


def test_replace_mappings_needs_a_file(capsys, monkeypatch, tmp_path):
    code, _, err = run(capsys, "extract", "--model", "moonshotai/Kimi-K3", "--replace-mappings")
    assert code == 2
    assert err.endswith("Error: --replace-mappings needs --mappings FILE (or $MOETUNE_MAPPINGS)\n")
    # With the variable set, the user's file is the whole registry: Kimi K3 is then unknown.
    monkeypatch.setenv("MOETUNE_MAPPINGS", write(tmp_path / "acme.yaml", ACME_MAPPINGS))
    code, _, err = run(capsys, "extract", "--model", "moonshotai/Kimi-K3", "--replace-mappings")
    assert code == 1
    assert err.startswith("Error: unknown architecture 'KimiK3ForConditionalGeneration'")


def test_quantized_checkpoint_table_says_what_each_engine_runs(capsys):
    gptq = str(REPO_ROOT / "moetune/catalog/Qwen__Qwen3-30B-A3B-GPTQ-Int4.json")
    code, out, err = run(capsys, "extract", "--model", gptq, "--device-name", "NVIDIA H200")
    assert (code, err) == (0, "")
    assert "gptq: GPTQ weight-only -> int4_w4a16 group 128, zero points no, act-order no" in out
    assert "vLLM    runs Marlin MoE" in out and "reads tuned files: no" in out
    assert "Triton path: --quantization moe_wna16" in out
    assert "  vLLM    E=128,N=768,device_name=NVIDIA_H200,dtype=int4_w4a16.json\n" in out


def test_dtype_override_keeps_the_checkpoints_per_channel_scales(capsys):
    scout = str(
        REPO_ROOT / "moetune/catalog/RedHatAI__Llama-4-Scout-17B-16E-Instruct-FP8-dynamic.json"
    )
    code, out, _ = run(
        capsys, "extract", "--model", scout, "--tp", "4", "--dtype", "fp8_w8a8", "--json"
    )
    report = json.loads(out)
    assert code == 0 and report["per_channel_quant"] is True
    assert report["sglang_config_file"].endswith(",dtype=fp8_w8a8,per_channel_quant=True.json")
    assert report["vllm_config_file"] == "E=16,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"


KIMI_K25_INT4 = str(REPO_ROOT / "tests" / "fixtures" / "configs" / "kimi_k25_int4.json")
DEEPSEEK_V4_FLASH = str(REPO_ROOT / "tests" / "fixtures" / "configs" / "deepseek_v4_flash.json")


@pytest.fixture
def no_engines_installed(monkeypatch):
    from moetune.engines import backends

    monkeypatch.setattr(backends, "installed_version", lambda engine: None)


def test_extract_names_each_engines_backend_on_hopper_and_blackwell(capsys, no_engines_installed):
    code, out, _ = run(capsys, "extract", "-m", "deepseek-ai/DeepSeek-V3", "--tp", "8")
    assert code == 0
    section = out.split("Backend (")[1].split("Tuned-config files")[0]
    vllm, sglang = section.split("SGLang 0.5.23")
    assert "vLLM 0.34.0 (not installed: the newest release moetune has read)" in vllm
    assert (
        "Hopper (sm90)             Triton fused_moe: reads the tuned files  <- NVIDIA H200" in vllm
    )
    assert "Blackwell (sm100 family)  FlashInfer TRT-LLM: reads no tuned file" in vllm
    assert "Blackwell (sm100 family)  Triton fused_moe: reads the tuned files" in sglang


def test_extract_deepseek_v4_flash_reports_its_fp4_experts_not_the_fp8_triton_path(
    capsys, no_engines_installed
):
    code, out, _ = run(capsys, "extract", "-m", DEEPSEEK_V4_FLASH, "--tp", "8", "--json")
    assert code == 0
    data = json.loads(out)
    group = data["quantization"]["groups"][0]
    assert group["scheme"] == "deepseek_v4_fp4_experts"
    assert group["engines"]["vllm"]["reads_files"] is False
    assert group["engines"]["sglang"]["file"] is None
    assert data["engine_dtype"] is None
    assert not any(b["reads_tuned_files"] for b in data["backends"])


@pytest.mark.parametrize(
    ("given", "suggested"),
    [
        ("H100", "'NVIDIA H100 80GB HBM3'"),
        ("h200", "'NVIDIA H200'"),
        ("H100 SXM", "'NVIDIA H100 80GB HBM3'"),
        ("MI300X", "did you mean 'AMD Instinct MI300X'?"),
        ("B200", "did you mean 'NVIDIA B200'?"),
        ("nvidia h100 80gb hbm3", "did you mean 'NVIDIA H100 80GB HBM3'?"),
    ],
)
def test_a_device_name_no_engine_looks_up_is_refused_with_the_right_one(capsys, given, suggested):
    code, _, err = run(capsys, "extract", "-m", "Qwen/Qwen3-30B-A3B", "--device-name", given)
    assert code == 2
    assert suggested in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("Error")]) == 1


@pytest.mark.parametrize(
    ("given", "vllm_name"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"),
        ("NVIDIA_H100_80GB_HBM3", "NVIDIA_H100_80GB_HBM3"),
        # vLLM 0.33/0.34's get_config_file_name: every H200 variant reads NVIDIA_H200.
        ("NVIDIA H200 NVL", "NVIDIA_H200"),
        ("NVIDIA H200 141GB HBM3e", "NVIDIA_H200"),
        ("NVIDIA H300", "NVIDIA_H300"),  # a vendor name moetune does not know: left alone
    ],
)
def test_torch_device_names_are_accepted(capsys, given, vllm_name):
    code, out, _ = run(
        capsys, "extract", "-m", "Qwen/Qwen3-30B-A3B", "--device-name", given, "--json"
    )
    assert code == 0
    assert f"device_name={vllm_name}.json" in json.loads(out)["vllm_config_file"]


def test_a_family_the_table_has_no_row_for_is_said_not_skipped(capsys, no_engines_installed):
    # Kimi-K3's MXFP4 experts on SGLang/Hopper: no override names a backend, so moetune
    # has no row for it rather than a guess.
    code, out, _ = run(capsys, "extract", "-m", "moonshotai/Kimi-K3", "--tp", "8")
    assert code == 0
    sglang = out.split("Backend (")[1].split("Tuned-config files")[0].split("SGLang 0.5.23")[1]
    assert "Hopper (sm90)             not in moetune's backend table  <- NVIDIA H200" in sglang
    assert "Blackwell (sm100 family)  FlashInfer TRT-LLM: reads no tuned file" in sglang
