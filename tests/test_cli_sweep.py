"""`moetune tune` with layout lists, and its default results folder (tiny model, CPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from moetune.cli import cli
from moetune.tune.store import STORE_FILENAME, ResultStore

DATA = Path(__file__).parent / "tune" / "data"
MODEL = str(DATA / "tiny-moe")
SPACE = str(DATA / "tiny-space.json")


def args(*extra):
    return ["tune", "--model", MODEL, "--space", SPACE, "--device-name", "NVIDIA H200", *extra]


def test_sweep_dry_run_lists_layouts_shapes_skips_and_an_estimate(tmp_path):
    result = CliRunner().invoke(
        cli,
        args("--tp", "1,2,8", "--ep", "--dtype", "auto,bf16", "--batch-size", "2,4")
        + ["--save-dir", str(tmp_path), "--dry-run"],
    )
    assert result.exit_code == 0, result.output
    out = result.output
    # auto is bf16 here: "auto,bf16" asks for each layout once. Neither engine is installed,
    # so each engine's file is timed on moetune's twin of its kernel: two plans per shape.
    assert (
        "Layouts:     3 asked, 2 valid, 2 distinct per-rank shape(s) to tune "
        "(4 plans: one per kernel timed), 1 skipped"
    ) in out
    assert "  TP2 EP bf16  -> shape 2: E=2,N=32,K=64,topk=2,dtype=bf16" in out
    assert "  TP8 EP bf16  skipped: --tp 8 --ep cannot split 4 experts" in out
    assert "Shape 1/2 on moetune's twin of the vLLM 0.34.0 kernel: serves TP1 EP bf16; ~" in out
    assert "Shape 2/2 on moetune's twin of the SGLang 0.5.23 kernel: serves TP2 EP bf16; ~" in out
    assert "\n  Compare:     SGLang fallback, no existing engine file found" in out
    assert (
        "Estimate:    ~" in out and "(for an NVIDIA H200: the CPU interpreter has no rates)" in out
    )
    assert f"Results:     {tmp_path / STORE_FILENAME} (one resumable store for every shape)" in out
    assert "Batch sizes: 2, 4" in out
    assert not list(tmp_path.iterdir())

    as_json = CliRunner().invoke(
        cli,
        args("--tp", "1,2,8", "--ep", "--dtype", "auto,bf16")
        + ["--save-dir", str(tmp_path), "--dry-run", "--json"],
    )
    plan = json.loads(as_json.stdout)
    # Every store key names its kernel: here each engine's twin, by its files' digest.
    assert [shape["problem"] for shape in plan["shapes"]] == [
        f"{shape['shape_key']},kernel={shape['kernel']['tag']}" for shape in plan["shapes"]
    ]
    assert [shape["shape_key"] for shape in plan["shapes"]] == [
        "E=4,N=32,K=64,topk=2,dtype=bf16",
        "E=4,N=32,K=64,topk=2,dtype=bf16",
        "E=2,N=32,K=64,topk=2,dtype=bf16",
        "E=2,N=32,K=64,topk=2,dtype=bf16",
    ]
    assert [(shape["kernel"]["engine"], shape["kernel"]["twin"]) for shape in plan["shapes"]] == [
        ("vllm", True),
        ("sglang", True),
        ("vllm", True),
        ("sglang", True),
    ]
    assert plan["shapes"][2]["layouts"] == ["TP2 EP bf16"]
    assert [entry["skipped"] is not None for entry in plan["layouts"]] == [False] * 2 + [True]
    assert plan["estimate_s"] > 0


def test_single_layout_keeps_the_plain_plan_and_uses_moetune_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # One engine, one kernel: the plain plan (both engines have a plan per kernel, as above).
    result = CliRunner().invoke(cli, args("--dry-run", "--json", "--engine", "vllm"))
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    save_dir = tmp_path / "moetune-results" / "tiny-moe"
    assert plan["shape_key"] == "E=4,N=32,K=64,topk=2,dtype=bf16"
    assert plan["problem"].startswith(plan["shape_key"] + ",kernel=moetune-vllm-0.34.0@")
    assert plan["layouts"] == ["TP1 bf16"]  # auto, resolved
    assert plan["store"] == str(save_dir / STORE_FILENAME)
    assert plan["files"][0] == str(save_dir / "E=4,N=32,device_name=NVIDIA_H200.json")
    text = CliRunner().invoke(cli, args("--dry-run", "--engine", "vllm"))
    assert f"Results:     {save_dir / STORE_FILENAME} (resumable)" in text.output
    assert not (tmp_path / "moetune-results").exists()


def test_lists_are_refused_where_one_layout_is_meant():
    result = subprocess.run(
        [sys.executable, "-m", "moetune", "benchmark", "--model", MODEL, "--tp", "1,2"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "Invalid value for '--tp': takes one value here, got '1,2'" in result.stderr
    assert "`moetune tune`" in result.stderr


@pytest.mark.slow
def test_a_sweep_tunes_each_shape_once_and_says_which_layouts_each_file_serves(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-m", "moetune", *args("--tp", "1,2", "--dtype", "auto,bf16")]
    command += ["--batch-size", "2", "--search", "exhaustive", "--save-dir", str(tmp_path)]
    command += ["--engine", "vllm"]  # no SGLang split tune: 4 measurements per shape
    command += ["--confirm-rounds", "0"]  # the sweep is checked, not the confirmation
    result = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    # 2 shapes x (3 candidates + the default config): auto is bf16, asked once each.
    assert summary["measured"] == 8 and summary["reused"] == 0
    assert [shape["layouts"] for shape in summary["shapes"]] == [["TP1 bf16"], ["TP2 bf16"]]
    served = {Path(entry["path"]).name: entry["layouts"] for entry in summary["files"]}
    assert served["E=4,N=32,device_name=NVIDIA_H200.json"] == ["TP1 bf16"]
    assert served["E=4,N=16,device_name=NVIDIA_H200.json"] == ["TP2 bf16"]
    assert len(summary["files"]) == 2  # one vLLM file per shape
    keys = {
        m.problem_key.partition(",kernel=")[0] for m in ResultStore(tmp_path / STORE_FILENAME).all()
    }
    assert keys == {"E=4,N=32,K=64,topk=2,dtype=bf16", "E=4,N=16,K=64,topk=2,dtype=bf16"}
    assert result.stderr.count("100%") == 1  # one progress bar, one ETA, for every shape
