"""`moetune tune` for the quantized dtypes on the tiny bundled model (CPU, interpreter)."""

import json

import pytest
from click.testing import CliRunner
from test_cli_tune import DATA, QUANT, moetune, tune_args  # tests/ is on sys.path

from moetune.cli import cli
from moetune.engines.tuned_file import validate_tuned_config


def dry_run(tmp_path, *extra):
    return CliRunner().invoke(cli, tune_args(tmp_path, "--dry-run", "--json", *extra))


def plans_of(document: dict) -> list[dict]:
    """The plans of a ``--dry-run --json``: one, or one per kernel timed (``shapes``)."""
    return document["shapes"] if "shapes" in document else [document]


def test_int4_dry_run_shows_group_size_pruning_and_files(tmp_path):
    result = dry_run(tmp_path, "--dtype", "int4_w4a16", "--group-size", "32")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["shape_key"] == "E=4,N=32,K=64,topk=2,dtype=int4_w4a16,group_size=32,kernel_rev=2"
    # BLOCK_SIZE_K must be a multiple of 32 dividing K=64 and N=32: only the BK=32 candidate
    assert plan["pruning"]["2"]["kept"] == 1
    assert plan["pruning"]["2"]["removed"]["wna16_blocks"] == 2
    names = [p.rsplit("/", 1)[-1] for p in plan["files"]]
    # vLLM keys int4 on N, SGLang on w2's packed last dimension N // 2 (and a _down twin)
    assert names[0] == "E=4,N=32,device_name=NVIDIA_H200,dtype=int4_w4a16.json"
    assert "E=4,N=16,device_name=NVIDIA_H200,dtype=int4_w4a16.json" in names[1:]


def test_int4_group_size_defaults_to_128_and_can_leave_nothing_to_tune(
    tmp_path, moetune_in_process
):
    result = moetune_in_process(tune_args(tmp_path, "--dry-run", "--dtype", "int4_w4a16"))
    assert result.returncode == 1
    # Group 128 > K=64: the rule says why, rather than "widen the search space".
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "Error: pruning left no candidate at batch size 2: rule wna16_blocks removed the last "
            "3 (int4 w4a16: BLOCK_SIZE_K a multiple of the group size and a divisor of K and N)"
        )
    )


def test_per_channel_fp8_and_int8_dry_runs(tmp_path):
    document = json.loads(dry_run(tmp_path, "--dtype", "fp8_w8a8", "--per-channel-quant").stdout)
    vllm, sglang = plans_of(document)  # each engine's file on (the twin of) its own kernel
    assert vllm["shape_key"].endswith("dtype=fp8_w8a8,per_channel")
    assert vllm["problem"].startswith(vllm["shape_key"] + ",kernel=moetune-vllm-0.34.0@")
    assert sglang["problem"].startswith(vllm["shape_key"] + ",kernel=moetune-sglang-0.5.23@")
    assert sglang["files"][0].endswith("dtype=fp8_w8a8,per_channel_quant=True.json")
    result = dry_run(tmp_path, "--dtype", "int8_w8a8")
    plan = json.loads(result.stdout)
    assert plan["shape_key"].endswith("dtype=int8_w8a8,per_channel")
    assert plan["problem"].startswith(plan["shape_key"] + ",kernel=moetune-sglang-0.5.23@")
    # SGLang's file (and its _down twin) only: no vLLM file
    assert all("/configs/triton_" in path for path in plan["files"])
    assert plan["files"][0].endswith("dtype=int8_w8a8,per_channel_quant=True.json")
    # The note is in the JSON (--json: stderr carries only progress).
    assert any("vLLM looks int8_w8a8 configs up" in note for note in plan["notes"])
    assert result.stderr == ""


def test_quantization_options_that_do_not_fit_are_one_line_errors(tmp_path, moetune_in_process):
    for extra, message in (
        (("--dtype", "bf16", "--group-size", "64"), "--group-size applies to int4_w4a16"),
        (("--dtype", "int4_w4a16", "--per-channel-quant"), "--per-channel-quant applies to"),
        (("--dtype", "int8_w8a8", "--engine", "vllm"), "vLLM looks int8_w8a8 configs up"),
    ):
        result = moetune_in_process(tune_args(tmp_path, "--dry-run", *extra))
        assert result.returncode == 1, (extra, result.stderr)
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("Error: ") and message in last, result.stderr
        assert "Traceback" not in result.stderr


# The confirmation round is not what these tunes are about (tests/tune/test_confirm.py): none.
NO_CONFIRMATION = ("--confirm-rounds", "0")


@pytest.mark.slow
def test_int4_tune_runs_and_writes_valid_files(tmp_path):
    int4 = ("--dtype", "int4_w4a16", "--group-size", "32", *NO_CONFIRMATION, "--json")
    result = moetune(tune_args(tmp_path, *int4))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    # The winner is a searched candidate or an engine baseline that competed (vLLM's int4
    # fallback); either way its BLOCK_SIZE_K is a whole number of int4 groups.
    assert all(row["config"]["BLOCK_SIZE_K"] % 32 == 0 for row in summary["results"])
    assert all(row["rel_rms"] is not None and row["rel_rms"] < 3e-2 for row in summary["results"])
    triton = summary["plan"]["triton_version"].replace(".", "_")
    validate_tuned_config(
        tmp_path / "E=4,N=32,device_name=NVIDIA_H200,dtype=int4_w4a16.json", "vllm"
    )
    sglang = (
        tmp_path
        / f"configs/triton_{triton}"
        / "E=4,N=16,device_name=NVIDIA_H200,dtype=int4_w4a16.json"
    )
    validate_tuned_config(sglang, "sglang")


@pytest.mark.slow
def test_int8_w8a8_tune_runs_and_writes_only_sglangs_file(tmp_path):
    """Per-channel weights and per-token int8 activations through the whole tuner, the
    SGLang split probes (up / down GEMMs alone) included."""
    result = moetune(tune_args(tmp_path, "--dtype", "int8_w8a8", *NO_CONFIRMATION, "--json"))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert all(row["rel_rms"] is not None and row["rel_rms"] < 6e-2 for row in summary["results"])
    assert all("/configs/triton_" in path for path in summary["files"])  # SGLang only
    names = [path.rsplit("/", 1)[-1] for path in summary["files"]]
    assert names and all(
        name.startswith("E=4,N=32,device_name=NVIDIA_H200,dtype=int8_w8a8,per_channel_quant=True")
        for name in names
    )
    assert not (tmp_path / "E=4,N=32,device_name=NVIDIA_H200.json").exists()


def test_an_fp16_checkpoint_with_fp8_weights_tunes_on_fp16_buffers(tmp_path):
    """The tiny model saved in fp16 with dynamic fp8 weights: its problem names the
    checkpoint's dtype (a bf16 checkpoint's key does not), and the winners match the
    reference rounded where vLLM's kernel rounds (bf16 compute, fp16 buffers): a reference
    that rounds to fp16 alone leaves 0.6-3 % here, which this bound catches."""
    args = tune_args(tmp_path, "--engine", "vllm", "--json")
    args[args.index("--model") + 1] = str(DATA / "tiny-moe-fp16-fp8")
    result = moetune(args)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["plan"]["shape_key"] == "E=4,N=32,K=64,topk=2,dtype=fp8_w8a8,checkpoint=fp16"
    assert summary["plan"]["problem"].startswith(
        summary["plan"]["shape_key"] + ",kernel=moetune-vllm-0.34.0@"
    )
    rms = [row["rel_rms"] for row in summary["results"]]
    assert len(rms) == 2 and all(value is not None and value < 1e-2 for value in rms), rms
    # vLLM reads the same file for either checkpoint dtype: the name carries none.
    validate_tuned_config(tmp_path / "E=4,N=32,device_name=NVIDIA_H200,dtype=fp8_w8a8.json", "vllm")
    bf16 = dry_run(tmp_path / "bf16", "--dtype", "fp8_w8a8", "--engine", "vllm")
    assert json.loads(bf16.stdout)["shape_key"] == "E=4,N=32,K=64,topk=2,dtype=fp8_w8a8"


def test_quantized_checkpoints_tune_as_they_are_quantized():
    """--dtype auto: a GPTQ int4 checkpoint tunes int4 with its group size (symmetric: no
    zero points); an FP8-dynamic one per-channel fp8."""
    gptq = str(QUANT / "Qwen__Qwen3-30B-A3B-GPTQ-Int4.json")
    result = CliRunner().invoke(cli, ["tune", "--model", gptq, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    # Both engines run int4 in fused_moe_kernel_gptq_awq: one plan, on its twin.
    assert (
        plan["shape_key"]
        == "E=128,N=768,K=2048,topk=8,dtype=int4_w4a16,group_size=128,kernel_rev=2"
    )
    assert plan["kernel"]["twin"] and plan["kernel"]["tag"].startswith("moetune-wna16@")
    assert plan["problem"] == plan["shape_key"] + ",kernel=" + plan["kernel"]["tag"]
    scout = str(QUANT / "RedHatAI__Llama-4-Scout-17B-16E-Instruct-FP8-dynamic.json")
    result = CliRunner().invoke(cli, ["tune", "--model", scout, "--tp", "4", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    plan = plans_of(json.loads(result.stdout))[0]
    assert plan["shape_key"] == "E=16,N=2048,K=5120,topk=1,dtype=fp8_w8a8,per_channel"
