"""`moetune tune` and `moetune benchmark` end to end on a tiny bundled model (CPU, interpreter).

The model (tests/tune/data/tiny-moe: E=4, top-k 2, K=64, N=32) and a 3-candidate
space keep a whole run at a few seconds of interpreter time per candidate.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from moetune.cli import cli
from moetune.tune.measure.worker import FAULTS_ENV
from moetune.tune.store import STORE_FILENAME, ResultStore

DATA = Path(__file__).parent / "tune" / "data"
MODEL = str(DATA / "tiny-moe")
SPACE = str(DATA / "tiny-space.json")
VLLM_NAME = "E=4,N=32,device_name=NVIDIA_H200.json"
SGLANG_NAME = "configs/triton_{}/E=4,N=32,device_name=NVIDIA_H200.json"
# 3 candidates x 2 batch sizes + vLLM's fallback config at each (SGLang's fallback,
# M16 N32 K64 G1 w4 s3 for this shape, is one of the 3 candidates).
MEASUREMENTS = 8


def tune_args(save_dir, *extra):
    return [
        "tune",
        "--model",
        MODEL,
        "--space",
        SPACE,
        "--batch-size",
        "2",
        "--batch-size",
        "4",
        "--save-dir",
        str(save_dir),
        "--device-name",
        "NVIDIA H200",
        *extra,
    ]


def moetune(args, env=None, **kwargs):
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VLLM_TUNED_CONFIG_FOLDER", "SGLANG_MOE_CONFIG_DIR")
    }
    return subprocess.run(
        [sys.executable, "-m", "moetune", *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        **kwargs,
    )


def test_dry_run_prints_the_plan_and_touches_nothing(tmp_path):
    result = CliRunner().invoke(cli, tune_args(tmp_path / "out", "--dry-run"))
    assert result.exit_code == 0, result.output
    assert "Shape:       E=4,N=32,K=64,topk=2,dtype=bf16" in result.output
    assert "M=2         3 kept" in result.output
    assert VLLM_NAME in result.output
    assert not (tmp_path / "out").exists()


def test_dry_run_shows_the_split_plan_and_the_down_table(tmp_path):
    result = CliRunner().invoke(cli, tune_args(tmp_path / "out", "--dry-run", "--engine", "sglang"))
    assert result.exit_code == 0, result.output
    assert "Split:       SGLang up/down tables" in result.output
    assert "E=4,N=32,device_name=NVIDIA_H200_down.json" in result.output
    assert str(tmp_path / "out" / VLLM_NAME) not in result.output  # --engine sglang only


def test_dry_run_json(tmp_path):
    result = CliRunner().invoke(cli, tune_args(tmp_path, "--dry-run", "--json", "--engine", "vllm"))
    assert result.exit_code == 0
    plan = json.loads(result.stdout)
    assert plan["shape_key"] == "E=4,N=32,K=64,topk=2,dtype=bf16"
    assert plan["problem"] == plan["shape_key"] + ",kernel=" + plan["kernel"]["tag"]
    assert plan["pruning"]["2"]["kept"] == 3
    assert plan["files"] == [str(tmp_path / VLLM_NAME)]
    # Both engines, neither installed: a plan per engine, each on moetune's twin of its kernel.
    both = json.loads(CliRunner().invoke(cli, tune_args(tmp_path, "--dry-run", "--json")).stdout)
    vllm, sglang = both["shapes"]
    assert vllm["kernel"]["twin"] and vllm["kernel"]["engine"] == "vllm"
    assert vllm["files"] == plan["files"]
    # Each fallback to a twin is said, with why.
    assert [note for note in both["notes"] if "is not installed" in note] == [
        "vLLM is not installed in this Python environment: the vLLM file is timed on moetune's "
        "twin of vLLM's kernel (moetune/kernel/fused_moe_kernel.py)",
        "SGLang is not installed in this Python environment: the SGLang file is timed on "
        "moetune's twin of SGLang's kernel (moetune/kernel/fused_moe_kernel_sglang.py)",
    ]
    assert sglang["kernel"]["twin"] and sglang["kernel"]["engine"] == "sglang"
    assert sglang["seeded_from"] == vllm["problem"]  # a transfer search from vLLM's results


def test_a_model_added_by_a_user_yaml_tunes_without_code_change(tmp_path, moetune_in_process):
    # The README's worked example: AcmeMoE is unknown to the built-in registry.
    acme = Path(__file__).parent.parent / "examples" / "acme"
    args = ["tune", "--model", str(acme / "config.json"), "--tp", "4", "--ep", "--dry-run"]
    unknown = moetune_in_process([*args, "--save-dir", str(tmp_path)])
    assert unknown.returncode == 1
    assert unknown.stderr.startswith("Error: unknown architecture 'AcmeMoeForCausalLM'")
    assert unknown.stderr.count("\n") == 1

    known = CliRunner().invoke(
        cli, [*args, "--save-dir", str(tmp_path), "--mappings", str(acme / "acme.yaml")]
    )
    assert known.exit_code == 0, known.output
    assert "Shape:       E=16,N=2048,K=4096,topk=4,dtype=bf16" in known.output
    # Without a GPU, under the interpreter the tests run in, the files are the CPU's.
    assert "E=16,N=2048,device_name=cpu.json" in known.output


def test_tune_without_a_gpu_or_the_interpreter_stops_before_any_work(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    result = subprocess.run(
        [sys.executable, "-m", "moetune", *tune_args(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 1
    assert result.stderr == (
        "Error: no CUDA GPU visible: timing needs one (`moetune tune ... --dry-run` shows the "
        "plan without a GPU; TRITON_INTERPRET=1 runs the pipeline on the CPU, for testing only)\n"
    )
    assert not (tmp_path / "out").exists()


def test_bad_model_is_one_line_error(tmp_path, moetune_in_process):
    result = moetune_in_process(["tune", "--model", str(tmp_path / "nope"), "--dry-run"])
    assert result.returncode == 1
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1


@pytest.mark.slow
def test_tune_survives_a_crashing_candidate_and_writes_both_engines(tmp_path):
    from moetune.engines.tuned_file import validate_tuned_config

    env = {FAULTS_ENV: "crash:BLOCK_SIZE_N=64"}
    # One confirmation round: the crashing vLLM fallback goes through it too (each round costs
    # a worker respawn per batch size); the rounds' statistics are tests/tune/test_confirm.py's.
    args = tune_args(tmp_path, "--search", "exhaustive", "--confirm-rounds", "1", "--json")
    result = moetune(args, env=env)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    # Neither engine is installed: vLLM's file on moetune's twin of vLLM's kernel, then
    # SGLang's on the twin of SGLang's (its whole-call search, then the up/down split search).
    vllm, sglang = summary["shapes"]
    assert vllm["plan"]["kernel"]["engine"] == "vllm" and vllm["plan"]["kernel"]["twin"]
    assert sglang["plan"]["kernel"]["engine"] == "sglang" and sglang["plan"]["kernel"]["twin"]
    assert sum("is not installed in this Python environment" in n for n in summary["notes"]) == 2
    assert vllm["measured"] == MEASUREMENTS and sglang["measured"] > MEASUREMENTS
    for plan in (vllm, sglang):
        assert [row["batch_size"] for row in plan["results"]] == [2, 4]
        for row in plan["results"]:
            assert row["config"]["BLOCK_SIZE_N"] != 64  # the crashing candidate never wins
    # Each plan compares with its own engine's fallback: vLLM's (M16 N64 K128 ...) crashes
    # too, so it is not timed, with a note; SGLang's is.
    assert set(vllm["geomean_speedup"]) == {"vllm_fallback"}
    assert set(sglang["geomean_speedup"]) == {"sglang_fallback"}
    for row in vllm["results"]:
        assert row["baselines"]["vllm_fallback"]["latency_us"] is None
    for row in sglang["results"]:
        assert row["baselines"]["sglang_fallback"]["speedup"] >= 1.0
    assert any("vLLM fallback M16 N64 K128" in note for note in vllm["notes"])
    for row in sglang["split"]:
        assert row["up"]["BLOCK_SIZE_N"] != 64 and row["down"]["BLOCK_SIZE_N"] != 64
    crashed = [m for m in ResultStore(tmp_path / STORE_FILENAME).all() if m.status == "crashed"]
    assert all(m.error.startswith("worker process died") for m in crashed)
    # vLLM's plan: once per batch size as a whole call (the candidate, and vLLM's fallback).
    on_vllm = [m.kind for m in crashed if m.problem_key == vllm["plan"]["problem"]]
    assert on_vllm == ["whole"] * 4
    # SGLang's plan: as a whole call, and as the up and the down GEMM alone (split search).
    on_sglang = {m.kind for m in crashed if m.problem_key == sglang["plan"]["problem"]}
    assert on_sglang == {"whole", "up", "down"}
    triton = vllm["plan"]["triton_version"].replace(".", "_")
    down_name = SGLANG_NAME.format(triton).replace(".json", "_down.json")
    for path, engine in (
        (VLLM_NAME, "vllm"),
        (SGLANG_NAME.format(triton), "sglang"),
        (down_name, "sglang"),
    ):
        validate_tuned_config(tmp_path / path, engine)
    assert [entry["path"] for entry in summary["files"]] == [
        str(tmp_path / VLLM_NAME),
        str(tmp_path / SGLANG_NAME.format(triton)),
        str(tmp_path / down_name),
    ]
    # progress, on stderr: one bar for the run, both plans counted on it, one ETA
    assert result.stderr.count("100%") == 1
    assert f"100% {vllm['measured'] + sglang['measured']} timed" in result.stderr


@pytest.mark.slow
def test_killed_run_resumes_and_measures_only_what_is_missing(tmp_path):
    store_path = tmp_path / STORE_FILENAME
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "moetune",
            *tune_args(tmp_path, "--search", "exhaustive", "--engine", "vllm"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            if store_path.exists() and len(store_path.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the tuner and its workers, mid-sweep
        process.wait()
    kept = len(ResultStore(store_path).all())
    assert 2 <= kept < MEASUREMENTS

    # No confirmation round: what is resumed is the search's store, not the confirmation's.
    resumed = ("--search", "exhaustive", "--engine", "vllm", "--confirm-rounds", "0", "--json")
    result = moetune(tune_args(tmp_path, *resumed))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["reused"] == kept
    assert summary["measured"] == MEASUREMENTS - kept
    lines = store_path.read_text().splitlines()
    keys = {
        tuple(sorted(json.loads(line)["candidate"].items())) + (json.loads(line)["batch_size"],)
        for line in lines
    }
    assert len(keys) == len(lines) == MEASUREMENTS  # nothing was measured twice


def test_benchmark_times_default_and_files_side_by_side(tmp_path):
    tuned = tmp_path / "tuned.json"
    entry = {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 32,
        "BLOCK_SIZE_K": 32,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 2,
    }
    tuned.write_text(json.dumps({"triton_version": "3.6.0", "1": entry, "64": entry}))
    result = moetune(
        ["benchmark", "--model", MODEL, "--batch-size", "3", "--config", str(tuned), "--json"]
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["configs"] == ["vllm_fallback", "sglang_fallback", str(tuned)]
    (row,) = report["results"]
    assert row["batch_size"] == 3 and row[str(tuned)]["config"] == entry
    assert row["vllm_fallback"]["latency_us"] > 0 and row[str(tuned)]["latency_us"] > 0
    # A vLLM file (its triton_version key) is timed on vLLM's kernel (here its twin) and
    # compared with the fallback timed on that kernel; SGLang's fallback is on SGLang's.
    assert report["timed_on"] == {
        "vllm_fallback": "vllm",
        "sglang_fallback": "sglang",
        str(tuned): "vllm",
    }
    assert set(report["geomean_speedup"][str(tuned)]) == {"vllm_fallback"}
    assert report["kernels"]["sglang"]["engine"] == "sglang" and report["kernels"]["sglang"]["twin"]


def test_benchmark_rejects_a_malformed_config_file(tmp_path, moetune_in_process):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"1": {"BLOCK_SIZE_M": 16}}))
    result = moetune_in_process(["benchmark", "--model", MODEL, "--config", str(bad)])
    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: {bad}: batch size 1: config")


QUANT = Path(__file__).resolve().parent.parent / "moetune" / "catalog"


def test_dry_run_refuses_a_kernel_tune_cannot_time_in_one_line(tmp_path, moetune_in_process):
    # static (checkpoint) activation scales: the kernel computes them on the fly only
    static = str(QUANT / "mistralai__Mistral-Small-4-119B-2603.json")
    result = moetune_in_process(
        ["tune", "--model", static, "--dry-run", "--save-dir", str(tmp_path)]
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith(
        "Error: moetune tune cannot time fp8_w8a8 static activation scales (FP8"
    )
    assert "--dtype accepts bf16, fp16, fp8_w8a8" in lines[0]
    assert not any(tmp_path.iterdir())


def test_dry_run_of_an_fp8_block_checkpoint_follows_it(tmp_path):
    fp8 = str(QUANT / "Qwen__Qwen3-30B-A3B-FP8.json")
    result = CliRunner().invoke(cli, ["tune", "--model", fp8, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    assert "E=128,N=768,K=2048,topk=8,dtype=fp8_w8a8,block_shape=[128,128]" in result.output


def test_an_sglang_fp8_block_plan_times_moetunes_twin_of_sglangs_kernel(tmp_path):
    # The vLLM twin ranked SGLang's fp8-block configs unlike SGLang's kernel on an H200; an
    # SGLang file is now timed on the twin of SGLang's own kernel, which ranks them alike.
    fp8 = str(QUANT / "Qwen__Qwen3-30B-A3B-FP8.json")
    args = ["tune", "--model", fp8, "--dry-run", "--kernel", "moetune", "--save-dir", str(tmp_path)]
    sglang_twin = "Kernel:      moetune's twin of SGLang 0.5.23's fused_moe_kernel"
    vllm_twin = "Kernel:      moetune's twin of vLLM 0.34.0's fused_moe_kernel"
    for engine, kernels in (("sglang", [sglang_twin]), ("both", [vllm_twin, sglang_twin])):
        result = CliRunner().invoke(cli, [*args, "--engine", engine])
        assert result.exit_code == 0, result.output
        shown = [line for line in result.output.splitlines() if line.startswith("Kernel:")]
        assert len(shown) == len(kernels)
        assert all(line.startswith(kernel) for line, kernel in zip(shown, kernels, strict=True))
        assert "ranks unlike the twin" not in result.output


def install_args(save_dir, *extra):
    return [*tune_args(save_dir, "--engine", "vllm", "--install", "vllm"), *extra]


def test_install_needs_an_engine_or_a_dir_and_says_so_before_tuning(tmp_path, moetune_in_process):
    no_engine_folders = {"VLLM_TUNED_CONFIG_FOLDER": None, "SGLANG_MOE_CONFIG_DIR": None}
    result = moetune_in_process(install_args(tmp_path / "out"), env=no_engine_folders)
    assert result.returncode == 1
    assert result.stderr.startswith("Error: --install vllm: vLLM is not installed here")
    assert "--install-dir" in result.stderr and not (tmp_path / "out").exists()
    result = moetune_in_process(
        tune_args(tmp_path / "out", "--install", "sglang", "--engine", "vllm")
    )
    assert result.returncode == 2 and "needs --engine" in result.stderr


@pytest.mark.slow
def test_install_copies_into_the_env_folder_and_never_clobbers(tmp_path):
    engine = tmp_path / "engine"
    env = {"VLLM_TUNED_CONFIG_FOLDER": str(engine)}
    first = moetune(install_args(tmp_path / "out", "--confirm-rounds", "0"), env=env)
    assert first.returncode == 0, first.stderr
    installed = engine / VLLM_NAME
    assert installed.read_text() == (tmp_path / "out" / VLLM_NAME).read_text()
    assert f"Installed for vllm ($VLLM_TUNED_CONFIG_FOLDER): {installed}" in first.stdout
    assert "export" not in first.stdout  # vLLM already reads that folder

    # The rerun resumes the store; without confirmation rounds (on the CPU's wall clock they
    # may flip a tie) both runs write the same file, so the installed one is already it.
    again = moetune(install_args(tmp_path / "out", "--json", "--confirm-rounds", "0"), env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["installed"][0]["status"] == "already installed"

    other = json.dumps({"1": {**json.loads(installed.read_text())["2"], "num_stages": 5}})
    installed.write_text(other)  # someone else's file
    refused = moetune(install_args(tmp_path / "out", "--confirm-rounds", "0"), env=env)
    assert refused.returncode == 1 and "--overwrite-installed" in refused.stderr
    assert installed.read_text() == other

    replaced = moetune(
        install_args(tmp_path / "out", "--overwrite-installed", "--json", "--confirm-rounds", "0"),
        env=env,
    )
    assert replaced.returncode == 0, replaced.stderr
    (done,) = json.loads(replaced.stdout)["installed"]
    assert done["status"] == "replaced" and Path(done["backup"]).read_text() == other
    assert installed.read_text() == (tmp_path / "out" / VLLM_NAME).read_text()


@pytest.mark.slow
def test_install_dir_prints_the_export_line(tmp_path):
    result = moetune(install_args(tmp_path / "out", "--install-dir", str(tmp_path / "mine")))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "mine" / VLLM_NAME).is_file()
    assert f"To use it: export VLLM_TUNED_CONFIG_FOLDER={tmp_path / 'mine'}" in result.stdout
    assert "Geomean speedup: " in result.stdout and "x over the vLLM fallback" in result.stdout
    # The summary's times are the confirmation's, and it says so.
    assert "Times: medians of 5 interleaved confirmation rounds" in result.stdout
    # No engine installed: the plan (stderr) and the summary (stdout) both say the fallback.
    note = (
        "Note: vLLM is not installed in this Python environment: the vLLM file is timed on "
        "moetune's twin of vLLM's kernel (moetune/kernel/fused_moe_kernel.py)"
    )
    assert note in " ".join(result.stderr.split()) and note in " ".join(result.stdout.split())
