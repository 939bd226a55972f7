"""The first hour's rough edges (issue 31): each message a new user met, fixed and pinned.

Each test runs `moetune` in-process as the console script does, at 80 columns.
"""

from pathlib import Path

import pytest

from moetune.cli import main
from moetune.engines import names
from moetune.errors import TuneError
from moetune.tune.search.space import load_space

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def offline_no_gpu(monkeypatch, tmp_path):
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "MOETUNE_MAPPINGS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(names, "detect_device_name", lambda: None)
    monkeypatch.chdir(tmp_path)


def run(capsys, *args):
    """Run the CLI in-process as `moetune` does; return (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main([str(arg) for arg in args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


# --- a mistyped command -----------------------------------------------------------


@pytest.mark.parametrize(("typed", "meant"), [("extact", "extract"), ("tnue", "tune")])
def test_a_mistyped_command_gets_a_did_you_mean(capsys, typed, meant):
    code, out, err = run(capsys, typed)
    assert code == 2
    assert f"Error: No such command '{typed}'. Did you mean '{meant}'?" in err


def test_a_command_like_no_other_gets_no_suggestion(capsys):
    code, _, err = run(capsys, "frobnicate")
    assert code == 2
    assert "Error: No such command 'frobnicate'.\n" in err
    assert "Did you mean" not in err


# --- 64.0 where a power of two is asked ---------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "value", "whole"),
    [
        ("s.yaml", "BLOCK_SIZE_N: [64.0, 128]\n", "64.0", "64"),
        ("s.json", '{"BLOCK_SIZE_K": 128.0}', "128.0", "128"),
        ("s.yaml", 'num_warps: "4"\n', '"4"', "4"),
    ],
)
def test_an_integral_float_in_a_space_is_told_to_be_an_integer(tmp_path, name, text, value, whole):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TuneError) as info:
        load_space(path)
    message = str(info.value)
    assert f"{value} must be an integer: write {whole}" in message
    assert "power of two" not in message


def test_a_float_that_is_no_integer_still_names_the_rule(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("BLOCK_SIZE_N: [64.5]\n")
    with pytest.raises(TuneError, match=r"64\.5\]? is not a power of two from 16 to 1024"):
        load_space(path)


# --- YAML errors say file:line:column -------------------------------------------------


def test_a_broken_space_file_names_its_line_and_column(capsys, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("BLOCK_SIZE_M: [16, 32]\nBLOCK_SIZE_N: [64, 128\nnum_warps: 4\n")
    code, out, err = run(capsys, "tune", "-m", "Qwen/Qwen3-30B-A3B", "--dry-run", "--space", space)
    assert code == 1
    assert err.startswith(f"Error: search space {space}:3:10: malformed YAML (while parsing a flow")
    assert err.count("\n") == 1


def test_a_broken_mappings_file_names_its_line_and_column(capsys, tmp_path):
    mappings = tmp_path / "mine.yaml"
    mappings.write_text("version: 1\nentries:\n  - name: x\n   architectures: [y]\n")
    code, _, err = run(capsys, "validate", mappings)
    assert code == 1
    assert f"{mappings}:4:4: malformed YAML (while parsing a block" in err


# --- a dense model ------------------------------------------------------------------

DENSE_LLAMA = ROOT / "tests" / "fixtures" / "dense" / "llama.json"


@pytest.mark.parametrize("command", ["extract", "check"])
def test_a_dense_config_is_told_it_may_be_a_dense_model(capsys, command):
    code, out, err = run(capsys, command, "-m", DENSE_LLAMA, "--device-name", "NVIDIA_H200")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1, err
    assert err.startswith(
        "Error: unknown architecture 'LlamaForCausalLM' model_type 'llama': this config has "
        "no MoE fields (none of num_experts, top_k, nor any key with 'expert' or 'moe' in "
        "its name): it may be a dense model, which has no fused-MoE kernel to tune; if it is "
        "an MoE model, add a mapping (docs/mappings.md)"
    )
    assert "{name: llama, architectures: [LlamaForCausalLM]" in err


def test_an_moe_config_of_unknown_names_still_gets_the_entry_to_add(capsys):
    """AcmeMoE names its experts its own way: no "dense model" guess, the usual hint."""
    code, _, err = run(capsys, "extract", "-m", ROOT / "examples" / "acme" / "config.json")
    assert code == 1
    assert "dense" not in err
    assert "the generic guess found no num_experts, top_k, intermediate_size" in err


# --- a --tp that only expert parallelism makes valid ---------------------------------


def test_a_tp_refusal_suggests_the_expert_parallel_layouts_that_work(capsys):
    """MiniMax-M2 (256 experts, I=1536, fp8 blocks of 128): TP8 leaves 192 rows, no
    multiple of 128; EP8 keeps each expert whole, and --ep does extract."""
    model = ("-m", "MiniMaxAI/MiniMax-M2", "--device-name", "NVIDIA_H200")
    code, _, err = run(capsys, "extract", *model, "--tp", "8")
    assert code == 1
    assert err.rstrip().endswith(
        "valid --tp: 1, 2, 3, 4, 6, 12; or keep --tp 8 with expert parallelism: --ep "
        "(vLLM: 32 whole experts per rank) or --ep-size 2, 4 or 8 (SGLang)"
    )
    for layout in (["--ep"], ["--ep-size", "2"], ["--ep-size", "4"], ["--ep-size", "8"]):
        code, out, err = run(capsys, "extract", *model, "--tp", "8", *layout)
        assert code == 0, (layout, err)


def test_no_expert_parallel_hint_where_ep_cannot_split_the_experts(capsys):
    code, _, err = run(capsys, "extract", "-m", "Qwen/Qwen3-30B-A3B", "--tp", "5")
    assert code == 1
    assert "expert parallelism" not in err  # 128 experts do not split 5 ways either


# --- the plan's counts add up --------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "twins"),
    [("Qwen/Qwen3-30B-A3B-FP8", True), ("Qwen/Qwen3-30B-A3B", False)],
)
def test_each_batch_size_s_removals_add_up_to_the_stated_candidates(capsys, model, twins):
    """fp8 on Hopper prunes the grid plus the 8-row twins of the swapped kernel: the Search
    line counts them, so kept + removed is that number at every batch size."""
    import re

    code, out, err = run(
        capsys, "tune", "-m", model, "--dry-run", "--engine", "vllm", "--device-name", "NVIDIA_H200"
    )
    assert code == 0, err
    flat = " ".join(out.split())  # however the lines wrap
    stated = int(re.search(r"Search: fast over (\d+) candidates", flat)[1])
    assert (stated != 1920) == twins
    assert ("BLOCK_SIZE_M=8 twins" in flat) == twins
    rows = re.findall(r"M=(\d+) (\d+) kept(?: \(([^)]*)\))?", flat)
    assert len(rows) == 18
    for m, kept, removed in rows:
        counts = [int(part.rsplit(" ", 1)[1]) for part in removed.split(", ") if part]
        assert int(kept) + sum(counts) == stated, (m, kept, removed)


# --- shell completion ------------------------------------------------------------------


def completions(args, incomplete):
    """(value, type) of what the shell is offered after `moetune ARGS INCOMPLETE`."""
    from click.shell_completion import ShellComplete

    from moetune.cli import cli

    complete = ShellComplete(cli, {}, "moetune", "_MOETUNE_COMPLETE")
    return [(item.value, item.type) for item in complete.get_completions(args, incomplete)]


@pytest.mark.parametrize("command", ["extract", "check", "tune", "benchmark"])
def test_model_completes_to_catalog_ids_and_local_paths(command):
    offered = completions([command, "--model"], "Qwen/Qwen3-30")
    assert ("Qwen/Qwen3-30B-A3B", "plain") in offered
    assert ("Qwen/Qwen3-30B-A3B-FP8", "plain") in offered
    assert all(value.startswith("Qwen/Qwen3-30") for value, _ in offered)
    assert offered[-1] == ("Qwen/Qwen3-30", "file")  # the shell lists matching paths
    assert ("./", "file") in completions([command, "-m"], "./")


def test_dtype_completes_to_its_choices_in_a_list_too():
    assert completions(["extract", "--dtype"], "fp") == [
        ("fp16", "plain"),
        ("fp8_w8a8", "plain"),
    ]
    assert completions(["tune", "--dtype"], "bf16,int4") == [("bf16,int4_w4a16", "plain")]
    assert [value for value, _ in completions(["check", "--dtype"], "")][:2] == ["auto", "bf16"]


@pytest.mark.parametrize(
    ("args", "incomplete", "expected"),
    [
        (["tune", "--engine"], "s", ["sglang"]),
        (["tune", "--search"], "ex", ["exhaustive"]),
        (["tune", "--vllm-release"], "0.3", ["0.33.0", "0.34.0"]),
        (["check", "--vllm-release"], "0.34", ["0.34.0"]),
        ([], "ext", ["extract"]),
    ],
)
def test_fixed_set_options_complete_to_their_values(args, incomplete, expected):
    assert [value for value, _ in completions(args, incomplete)] == expected


def test_routing_completes_to_uniform_or_a_path():
    assert completions(["tune", "--routing"], "un") == [("uniform", "plain"), ("un", "file")]


def test_the_completion_script_answers_through_the_console_entry(tmp_path):
    """What bash runs: `_MOETUNE_COMPLETE=bash_complete` with COMP_WORDS and COMP_CWORD."""
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "_MOETUNE_COMPLETE": "bash_complete",
        "COMP_WORDS": "moetune tune --dtype bf16,fp8",
        "COMP_CWORD": "3",
    }
    result = subprocess.run(
        [sys.executable, "-m", "moetune"], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["plain,bf16,fp8_w8a8"]
