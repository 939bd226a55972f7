"""`moetune check`: each engine's lookup against folders laid out like the engine's own.

The engines' installed packages are stood in for by tmp folders (each engine module's
`installed()`, which finds it with `find_spec`, is patched), the env vars point at tmp
folders too.
Qwen3-30B-A3B TP1 on an H200: E=128, N=768, bf16.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from moetune.cli import main
from moetune.engines import names, sglang, vllm
from moetune.engines.installed import InstalledEngine

NAME = "E=128,N=768,device_name=NVIDIA_H200.json"
DOWN = "E=128,N=768,device_name=NVIDIA_H200_down.json"
ARGS = ("check", "--model", "Qwen/Qwen3-30B-A3B", "--device-name", "NVIDIA H200")


@pytest.fixture(autouse=True)
def hermetic(monkeypatch, tmp_path):
    for variable in ("VLLM_TUNED_CONFIG_FOLDER", "SGLANG_MOE_CONFIG_DIR", "MOETUNE_MAPPINGS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(names, "detect_device_name", lambda: None)
    monkeypatch.setattr(vllm, "installed", lambda: None)
    monkeypatch.setattr(sglang, "installed", lambda: None)


def installed_at(engine, configs_dir, version="0.5.23"):
    """An InstalledEngine whose tuned files are in `configs_dir`."""
    return InstalledEngine(
        engine=engine,
        version=version,
        root=configs_dir.parent,
        kernel_source=None,
        configs_dir=configs_dir,
        lookup_source=None,
        release=version,
    )


def run(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


ROW = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}


def put(folder, *names):
    """A valid one-row table under each name (a _down table says USE_TMA)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        row = {**ROW, "USE_TMA": False} if name.endswith("_down.json") else ROW
        (folder / name).write_text(json.dumps({"1": row}))
    return folder


def test_nothing_anywhere_exits_4_with_the_fallback_and_the_tune_command(capsys):
    code, out, _ = run(capsys, *ARGS)
    assert code == 4
    assert f"vLLM: {NAME}" in out and f"SGLang: {NAME}" in out
    # vLLM 0.33.0's fallback at M=1..32, and SGLang's M <= E tile
    assert "M 1-32        M16 N64 K128 G1 w4 s4" in out
    assert "M 1-128       M16 N32 K64 G1 w- s-" in out
    assert (
        "to fill the gap: moetune tune --model Qwen/Qwen3-30B-A3B --tp 1 "
        "--device-name 'NVIDIA H200' --engine vllm --install vllm"
    ) in out
    assert "Missing for vLLM, SGLang (exit status 4)." in out


def test_env_folders_laid_out_like_each_engine(capsys, monkeypatch, tmp_path):
    user = put(tmp_path / "vllm-user", NAME)
    root = tmp_path / "sglang-root"
    put(root / "configs" / "triton_3_6_0", NAME)
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(user))
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(root))
    code, out, _ = run(capsys, *ARGS, "--triton-version", "3.6.0", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["all_present"] is True
    by_engine = {e["engine"]: e for e in report["engines"]}
    assert by_engine["vllm"]["found"] == str(user / NAME)
    assert by_engine["sglang"]["found"] == str(root / "configs" / "triton_3_6_0" / NAME)
    assert by_engine["sglang"]["triton_folder"] == "triton_3_6_0"
    down = by_engine["sglang"]["down"]
    assert down["file_name"] == DOWN and down["found"] is None
    assert down["fallback"] == "the down GEMM reuses the up config, without TMA"
    assert by_engine["vllm"]["fallback_configs"]["4096"]["BLOCK_SIZE_M"] == 128


def test_sglang_picks_the_newest_other_triton_folder(capsys, monkeypatch, tmp_path):
    package = tmp_path / "sglang-package"
    put(package / "configs" / "triton_3_4_0", NAME)
    put(package / "configs" / "triton_3_5_1", NAME, DOWN)
    put(package / "configs" / "triton_3_6_0")
    monkeypatch.setattr(sglang, "installed", lambda: installed_at("sglang", package / "configs"))
    code, out, _ = run(capsys, *ARGS, "--engine", "sglang", "--triton-version", "3.6.0")
    assert code == 0
    lines = out.splitlines()
    searched = [line.strip() for line in lines if line.strip()[:2] in ("1.", "2.", "3.")]
    assert searched[:3] == [
        f"1. {package}/configs/triton_3_6_0/{NAME}",
        f"2. {package}/configs/triton_3_5_1/{NAME}  <- found",
        f"3. {package}/configs/triton_3_4_0/{NAME}",
    ]
    assert f"FOUND: {package}/configs/triton_3_5_1/{NAME} (folder triton_3_5_1)" in out
    assert f"_down file FOUND: {package}/configs/triton_3_5_1/{DOWN}" in out


def test_vllm_package_folder_and_compare_dir(capsys, monkeypatch, tmp_path):
    package = put(tmp_path / "vllm-configs", NAME)
    monkeypatch.setattr(vllm, "installed", lambda: installed_at("vllm", package, "0.33.0"))
    code, out, _ = run(capsys, *ARGS, "--engine", "vllm")
    assert code == 0 and f"FOUND: {package / NAME}" in out

    mine = put(tmp_path / "mine", NAME)
    code, out, _ = run(capsys, *ARGS, "--engine", "vllm", "--compare-dir", str(mine), "--json")
    (engine,) = json.loads(out)["engines"]
    assert engine["searched"] == [str(mine / NAME), str(package / NAME)]
    assert engine["found"] == str(mine / NAME)

    empty = put(tmp_path / "empty")
    code, out, _ = run(
        capsys, *ARGS, "--engine", "vllm", "--compare-dir", str(empty), "--compare-only"
    )
    assert code == 4 and "MISSING" in out


def test_compare_only_needs_a_dir(capsys):
    code, _, err = run(capsys, *ARGS, "--compare-only")
    assert code == 2 and "--compare-only needs --compare-dir" in err


def test_bad_model_is_one_line_error(capsys, tmp_path):
    code, _, err = run(capsys, "check", "--model", str(tmp_path / "nope"))
    assert code == 1 and err.startswith("Error: ") and err.count("\n") == 1


PROBE = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from moetune.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(["check", "--model", "Qwen/Qwen3-30B-A3B", "--json"])
        except SystemExit as exc:
            code = exc.code
    heavy = ("torch", "triton", "vllm", "sglang", "matplotlib", "moetune.report")
    loaded = [n for n in heavy if n in sys.modules]
    print(json.dumps({"code": code, "loaded": loaded, "report": json.loads(out.getvalue())}))
    """
)


def test_check_imports_neither_torch_triton_nor_the_engines(tmp_path):
    # PYTHONPATH: this checkout's moetune, whatever an editable install points at.
    repo = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", PYTHONPATH=repo)
    for variable in ("VLLM_TUNED_CONFIG_FOLDER", "SGLANG_MOE_CONFIG_DIR", "MOETUNE_MAPPINGS"):
        env.pop(variable, None)
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    assert probe["loaded"] == []
    assert probe["code"] in (0, 4)
    assert probe["report"]["local_experts"] == 128


def test_mxfp4_checkpoint_reads_no_file_so_nothing_is_missing(capsys, current_releases):
    # gpt-oss ships mxfp4 experts: neither engine serves them with the Triton kernel these
    # files tune, so check says so and exits 0 instead of asking for a tune.
    code, out, _ = run(
        capsys, "check", "-m", "openai/gpt-oss-120b", "--tp", "2", "--device-name", "NVIDIA H200"
    )
    assert code == 0, out
    assert out.count("reads no Triton config file: nothing to tune") == 2
    assert "backend: SGLang 0.5.23 on Hopper (sm90): triton_kernels" in out
    assert "to fill the gap" not in out and "MISSING" not in out
    assert "Nothing to tune: no engine reads a tuned Triton file here (exit status 0)." in out


def test_mxfp4_checkpoint_with_a_dtype_override_still_looks_the_file_up(capsys):
    args = (
        "check",
        "-m",
        "openai/gpt-oss-120b",
        "--tp",
        "2",
        "--dtype",
        "bf16",
        "--engine",
        "vllm",
    )
    code, out, _ = run(capsys, *args, "--device-name", "NVIDIA H200")
    assert code == 4 and "reads no Triton config file" not in out


def test_gptq_checkpoint_names_the_default_kernel_and_the_triton_path(capsys):
    # Marlin serves GPTQ experts by default: nothing reads the file unless the user
    # switches to the Triton path, which the note names.
    args = ("check", "-m", "Qwen/Qwen3-30B-A3B-GPTQ-Int4", "--engine", "vllm", "--json")
    code, out, _ = run(capsys, *args, "--device-name", "NVIDIA H200")
    assert code == 0
    (vllm_check,) = json.loads(out)["engines"]
    assert vllm_check["needs_file"] is False
    assert "Marlin, reads no tuned file: nothing to tune" in vllm_check["kernel_note"]
    assert "Triton path: --quantization moe_wna16" in vllm_check["kernel_note"]
    assert vllm_check["backend"]["backend"] == "marlin"


def test_a_file_that_is_not_json_is_invalid_not_found(capsys, monkeypatch, tmp_path):
    folder = tmp_path / "vllm-user"
    folder.mkdir()
    (folder / NAME).write_text("{not json")
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(folder))
    code, out, _ = run(capsys, *ARGS, "--engine", "vllm")
    assert code == 4
    assert "FOUND" not in out
    assert (
        f"  INVALID: {folder / NAME}: cannot read a tuned config: not valid JSON "
        "(Expecting property name enclosed in double quotes: line 1 column 2 (char 1))\n"
    ) in out
    assert (
        "  to replace it: moetune tune --model Qwen/Qwen3-30B-A3B --tp 1 "
        "--device-name 'NVIDIA H200' --engine vllm --install vllm --overwrite-installed\n"
    ) in out
    assert out.endswith("Invalid file for vLLM (exit status 4).\n")

    code, out, _ = run(capsys, *ARGS, "--engine", "vllm", "--json")
    (engine,) = json.loads(out)["engines"]
    assert code == 4 and engine["found"] == str(folder / NAME) and engine["present"] is False
    assert engine["invalid"].startswith(f"{folder / NAME}: cannot read a tuned config")


def test_a_table_the_engine_cannot_read_is_invalid_and_so_is_its_down_table(
    capsys, monkeypatch, tmp_path
):
    root = tmp_path / "sglang-root"
    folder = put(root / "configs" / "triton_3_6_0", NAME, DOWN)
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(root))
    args = (*ARGS, "--engine", "sglang", "--triton-version", "3.6.0")
    assert run(capsys, *args)[0] == 0

    (folder / DOWN).write_text(json.dumps({"1": {**ROW, "num_stages": 17}}))
    code, out, _ = run(capsys, *args)
    assert code == 4
    assert f"  FOUND: {folder / NAME} (folder triton_3_6_0)\n" in out
    assert (
        f"  _down file INVALID: {folder / DOWN}: batch size 1: config "
        '"num_stages": 17 is greater than the maximum of 16\n'
    ) in out

    (folder / NAME).write_text(json.dumps({"²": ROW}))
    code, out, _ = run(capsys, *args)
    assert code == 4 and f'  INVALID: {folder / NAME}: key "²" is not a batch size' in out


KIMI_K25_INT4 = str(Path(__file__).parent / "fixtures" / "configs" / "kimi_k25_int4.json")


@pytest.fixture
def current_releases(monkeypatch):
    from moetune.engines import backends

    monkeypatch.setattr(backends, "installed_version", lambda engine: None)


def test_kimi_k25_int4_has_nothing_to_tune_on_hopper(capsys, current_releases):
    # Marlin serves its experts in both engines: no engine reads the int4_w4a16 Triton
    # file, so there is nothing to tune and the exit status is 0.
    code, out, _ = run(
        capsys, "check", "-m", KIMI_K25_INT4, "--tp", "8", "--device-name", "NVIDIA H200"
    )
    assert code == 0, out
    assert "vLLM 0.34.0 on Hopper (sm90): Marlin, reads no tuned file: nothing to tune" in out
    assert "SGLang 0.5.23 on Hopper (sm90): Marlin, reads no tuned file: nothing to tune" in out
    assert "MISSING" not in out and "to fill the gap" not in out
    assert "Nothing to tune: no engine reads a tuned Triton file here (exit status 0)." in out


def test_kimi_k25_int4_on_blackwell_only_sglang_reads_a_file(capsys, current_releases):
    # vLLM: FlashInfer's MxInt4 TRT-LLM kernel. SGLang 0.5.23 on sm100 runs symmetric int4
    # group 32 compressed-tensors experts on its Triton WNA16 runner: that file is read.
    args = ("check", "-m", KIMI_K25_INT4, "--tp", "8", "--device-name", "NVIDIA B200")
    code, out, _ = run(capsys, *args)
    assert code == 4, out
    assert "vLLM 0.34.0 on Blackwell (sm100 family): FlashInfer TRT-LLM, reads no tuned" in out
    assert "backend: SGLang 0.5.23 on Blackwell (sm100 family): Triton fused_moe" in out
    assert "does not read this file" not in out
    assert "to fill the gap: moetune tune" in out and "--engine sglang" in out
    assert "Missing for SGLang (exit status 4)." in out


def test_kimi_k25_int4_json_says_nothing_to_tune(capsys, current_releases):
    code, out, _ = run(capsys, "check", "-m", KIMI_K25_INT4, "--tp", "8", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["nothing_to_tune"] is True and data["gpu_family"] == "hopper"
    assert [e["backend"]["backend"] for e in data["engines"]] == ["marlin", "marlin"]


def test_block_fp8_on_blackwell_vllm_reads_no_file_but_hopper_does(capsys, current_releases):
    args = ("check", "-m", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--engine", "vllm")
    code, out, _ = run(capsys, *args, "--device-name", "NVIDIA B200")
    assert code == 0, out
    assert "vLLM 0.34.0 on Blackwell (sm100 family): FlashInfer TRT-LLM" in out
    code, out, _ = run(capsys, *args, "--device-name", "NVIDIA H200")
    assert code == 4
    assert "backend: vLLM 0.34.0 on Hopper (sm90): Triton fused_moe, reads the tuned" in out
    assert "MISSING" in out


def test_the_installed_release_is_the_one_named(capsys, monkeypatch):
    from moetune.engines import backends

    monkeypatch.setattr(backends, "installed_version", lambda engine: "0.33.0")
    code, out, _ = run(
        capsys, "check", "-m", KIMI_K25_INT4, "--tp", "8", "--engine", "vllm", "--json"
    )
    assert code == 0
    backend = json.loads(out)["engines"][0]["backend"]
    assert (backend["release"], backend["release_source"]) == ("0.33.0", "installed")
