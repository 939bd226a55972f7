"""`moetune benchmark` without a GPU: a message that suggests only what exists, and --dry-run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from stand_ins import stand_in_release  # tests/ is on sys.path

ROOT = Path(__file__).resolve().parent.parent
VLLM_FILE = ROOT / "bench" / "vllm_configs" / "E=128,N=768,device_name=NVIDIA_H200.json"


def moetune(args, tmp_path, **env):
    base = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-m", "moetune", *args],
        capture_output=True,
        text=True,
        env={**base, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT), **env},
        cwd=tmp_path,
    )


def test_no_gpu_error_suggests_a_command_that_exists(tmp_path):
    result = moetune(
        ["benchmark", "-m", "Qwen/Qwen3-30B-A3B", "--config", str(VLLM_FILE)], tmp_path
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: no CUDA GPU")
    assert "`moetune benchmark ... --dry-run`" in result.stderr
    # ...and the command it names takes that flag.
    dry = moetune(["tune", "-m", "Qwen/Qwen3-30B-A3B", "--batch-size", "1", "--dry-run"], tmp_path)
    assert dry.returncode == 0, dry.stderr


def test_dry_run_shows_the_entry_each_file_gives_per_batch_size(tmp_path):
    args = [
        "benchmark",
        "-m",
        "Qwen/Qwen3-30B-A3B",
        "--config",
        str(VLLM_FILE),
        "--dry-run",
        "--device-name",
        "NVIDIA_H200",
        "--batch-size",
        "1",
        "--batch-size",
        "100",
    ]
    result = moetune(args, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Would time E=128,N=768,K=2048,topk=8,dtype=bf16 on NVIDIA_H200")
    words = [" ".join(line.split()) for line in lines]
    # One config a line under its batch size, the engines' own first: vLLM 0.33.0's
    # fallback, then SGLang's. M=100 takes the published file's nearest key (96), as the
    # engines do.
    assert words[1:7] == [
        "M=1 vllm_fallback M16 N64 K128 G1 w4 s4",
        "sglang_fallback M16 N32 K64 G1 w4 s3",
        "E=128,N=768,device_name=NVIDIA_H200.json M16 N64 K64 G1 w4 s5",
        "M=100 vllm_fallback M64 N128 K64 G1 w4 s3",
        "sglang_fallback M16 N32 K64 G1 w4 s3",
        "E=128,N=768,device_name=NVIDIA_H200.json M16 N128 K128 G1 w4 s2",
    ]


def write_split_pair(folder, name, tile_n_k, up_stages, down_stages, down_tma):
    """An SGLang up table `name` and its _down twin, one row at M=1, BLOCK_SIZE_M 16."""
    n, k = tile_n_k
    tile = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k, "GROUP_SIZE_M": 1}
    up = {"1": {**tile, "num_warps": 4, "num_stages": up_stages}}
    down = {"1": {**tile, "num_warps": 4, "num_stages": down_stages, "USE_TMA": down_tma}}
    (folder / name).write_text(json.dumps(up))
    (folder / name.replace(".json", "_down.json")).write_text(json.dumps(down))


def test_dry_run_pairs_an_sglang_file_with_its_down_table(tmp_path):
    name = "E=128,N=768,device_name=NVIDIA_H200.json"
    write_split_pair(tmp_path, name, (64, 128), up_stages=4, down_stages=2, down_tma=True)
    args = ["benchmark", "-m", "Qwen/Qwen3-30B-A3B", "--batch-size", "1", "--dry-run"]
    result = moetune([*args, "--config", name], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    # Every column in the split harness: the fallbacks as pairs of themselves.
    assert lines[1].startswith("M=1 vllm_fallback up M16 N64 K128 G1 w4 s4 + down M16 N64")
    assert lines[3] == f"{name} up M16 N64 K128 G1 w4 s4 + down M16 N64 K128 G1 w4 s2 TMA"
    assert lines[4].startswith("Timed as SGLang runs a split file")
    # The _down table alone is refused with a one-line error naming the main file.
    wrong = moetune([*args, "--config", name.replace(".json", "_down.json")], tmp_path)
    assert wrong.returncode != 0 and wrong.stderr.count("\n") == 1
    assert f"pass its main file {name}" in wrong.stderr


def test_a_split_pair_runs_end_to_end_on_the_cpu(tmp_path):
    """The whole timing path (interpreter): every column a pair, the down config reported."""
    name = "E=8,N=64,device_name=NVIDIA_H200.json"
    write_split_pair(tmp_path, name, (32, 32), up_stages=2, down_stages=3, down_tma=False)
    config = {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "intermediate_size": 64,
        "hidden_size": 128,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = ["benchmark", "-m", "./config.json", "--batch-size", "2", "--engine", "vllm"]
    result = moetune([*args, "--config", name, "--json"], tmp_path, TRITON_INTERPRET="1")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["harness"] == "pair"
    (row,) = report["results"]
    assert row[name]["status"] == "ok" and row[name]["latency_us"] > 0
    assert row[name]["config"]["num_stages"] == 2 and row[name]["down_config"]["num_stages"] == 3
    assert "down_config" not in row["vllm_fallback"]  # timed as the pair of itself
    assert row["vllm_fallback"]["status"] == "ok"


def test_a_batch_size_key_in_unicode_digits_is_a_one_line_error(tmp_path):
    # "²".isdigit() is True but int("²") fails: this crashed with exit 3.
    row = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    (tmp_path / "odd.json").write_text(json.dumps({"²": {**row, "num_warps": 4, "num_stages": 3}}))
    args = ["benchmark", "-m", "Qwen/Qwen3-30B-A3B", "--config", "odd.json", "--dry-run"]
    result = moetune(args, tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stderr == (
        'Error: odd.json: key "²" is not a batch size: expected a positive whole number '
        'in ASCII digits, no leading zero, at most 9 digits (e.g. "64")\n'
    )


@pytest.mark.slow
def test_repeat_times_interleaved_rounds_and_reports_intervals(tmp_path):
    """--repeat 3 on the CPU (interpreter): medians over the rounds, their intervals, and
    the file's speedup over each baseline with its interval, in the JSON and the table."""
    name = "E=8,N=64,device_name=NVIDIA_H200.json"
    tile = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1}
    (tmp_path / name).write_text(json.dumps({"1": {**tile, "num_warps": 4, "num_stages": 2}}))
    config = {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "intermediate_size": 64,
        "hidden_size": 128,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = ["benchmark", "-m", "./config.json", "--batch-size", "2", "--engine", "vllm"]
    args += ["--config", name]
    result = moetune([*args, "--repeat", "3", "--json"], tmp_path, TRITON_INTERPRET="1")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["repeat"] == 3 and "paired bootstrap" in report["interval"]
    (row,) = report["results"]
    fallback, tuned = row["vllm_fallback"], row[name]
    for entry in (fallback, tuned):
        assert entry["status"] == "ok" and len(entry["rounds_us"]) == 3
        low, high = entry["latency_interval_us"]
        assert min(entry["rounds_us"]) <= low <= entry["latency_us"] <= high
        assert high <= max(entry["rounds_us"])
    speedup = tuned["speedup"]["vllm_fallback"]
    assert speedup["low"] <= speedup["value"] <= speedup["high"]
    assert speedup["value"] == fallback["latency_us"] / tuned["latency_us"]
    assert tuned["ratio_to_reference"] == speedup
    assert "speedup" not in fallback
    # The table names its rounds (two here: the table is checked, not the timings again).
    table = moetune([*args, "--repeat", "2"], tmp_path, TRITON_INTERPRET="1")
    assert table.returncode == 0, table.stderr
    assert "median us of 2 interleaved rounds" in table.stdout


@pytest.mark.parametrize("repeat", [1, 3])
def test_each_engines_files_are_timed_on_that_engines_own_kernel(tmp_path, monkeypatch, repeat):
    """--engine both --kernel auto with both engines installed: vLLM's fallback and file on
    vLLM's kernel, SGLang's on SGLang's, as `tune` does; each speedup on its own kernel,
    with one timing or with --repeat's interleaved rounds."""
    from types import SimpleNamespace

    from click.testing import CliRunner

    from moetune.cli import cli
    from moetune.engines import launch
    from moetune.tune.measure import worker
    from moetune.tune.measure.timing import Outcome

    # The kernel file of vLLM 0.33.0's interface (SGLang's launch declares none to check).
    source = tmp_path / "fused_moe.py"
    source.write_text(stand_in_release(launch.vllm_0_33))
    releases = {"vllm": "0.33.0", "sglang": "0.5.23"}

    def both_installed(engine):
        return SimpleNamespace(
            version=releases[engine], release=releases[engine], kernel_source=source, root="/x"
        )

    resolve = launch.benchmark_kernel
    monkeypatch.setattr(
        launch,
        "benchmark_kernel",
        lambda choice, engines, find=None: resolve(choice, engines, both_installed),
    )
    timed = []  # (kernel engine, batch size, candidate)

    class KernelPool:
        """Times a candidate at 10 us on vLLM's kernel, 20 us on SGLang's."""

        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def run(self, units):
            for unit in units:
                engine = unit.problem.kernel.engine
                assert not unit.problem.kernel.twin
                for candidate in unit.candidates:
                    if unit.mode in ("full", "confirm"):
                        timed.append((engine, unit.batch_size, candidate))
                    latency = 10.0 if engine == "vllm" else 20.0
                    yield unit, Outcome(candidate, "ok", latency, latency, latency)

    monkeypatch.setattr(worker, "WorkerPool", KernelPool)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.chdir(tmp_path)
    row = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    vllm_file = tmp_path / "E=8,N=64,device_name=NVIDIA_H200.json"
    vllm_file.write_text(
        json.dumps({"triton_version": "3.6.0", "2": {**row, "num_warps": 4, "num_stages": 2}})
    )
    sglang_dir = tmp_path / "triton_3_6_0"
    sglang_dir.mkdir()
    sglang_file = sglang_dir / vllm_file.name
    sglang_file.write_text(json.dumps({"2": {**row, "num_warps": 8, "num_stages": 3}}))
    config = {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 8,
        "num_experts_per_tok": 2, "intermediate_size": 64, "hidden_size": 128,
        "torch_dtype": "bfloat16",
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = ["benchmark", "-m", "./config.json", "--batch-size", "2", "--engine", "both"]
    args += ["--config", str(vllm_file), "--config", str(sglang_file), "--json"]
    args += ["--repeat", str(repeat)]
    monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER", raising=False)
    monkeypatch.delenv("SGLANG_MOE_CONFIG_DIR", raising=False)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["timed_on"] == {
        "vllm_fallback": "vllm",
        "sglang_fallback": "sglang",
        str(vllm_file): "vllm",
        str(sglang_file): "sglang",
    }
    kernels = {e: (k["engine"], k["version"], k["twin"]) for e, k in report["kernels"].items()}
    assert kernels == {"vllm": ("vllm", "0.33.0", False), "sglang": ("sglang", "0.5.23", False)}
    (results,) = report["results"]
    assert results[str(vllm_file)]["latency_us"] == 10.0
    assert results[str(sglang_file)]["latency_us"] == 20.0
    assert results["sglang_fallback"]["latency_us"] == 20.0
    if repeat > 1:  # the paired speedups, too, are over the same kernel's columns only
        assert results[str(sglang_file)]["speedup"].keys() == {"sglang_fallback"}
        assert results[str(sglang_file)]["ratio_to_reference"]["value"] == 1.0
        assert len(timed) == 4 * repeat  # 2 columns on each kernel, once a round
    # Each file against the fallbacks timed on its own kernel only.
    assert report["geomean_speedup"] == {
        str(vllm_file): {"vllm_fallback": 1.0},
        str(sglang_file): {"sglang_fallback": 1.0},
    }
    on_sglang = {candidate for engine, _, candidate in timed if engine == "sglang"}
    assert {c.num_warps for c in on_sglang} >= {8}  # SGLang's file, on SGLang's kernel
    assert all(c.num_warps != 8 for engine, _, c in timed if engine == "vllm")
