"""What a new user trips over in the first hour: commands that disagree, messages that mislead.

Each test is the exact repro of one such fault, run in-process as `moetune` runs, at 80 columns.
"""

import itertools
import json
import re
from pathlib import Path

import pytest

from moetune.cli import main
from moetune.engines import names

ROOT = Path(__file__).resolve().parent.parent
TINY_MOE = ROOT / "tests" / "tune" / "data" / "tiny-moe"
VLLM_FILE = ROOT / "bench" / "vllm_configs" / "E=128,N=768,device_name=NVIDIA_H200.json"


@pytest.fixture(autouse=True)
def offline_no_gpu(monkeypatch, tmp_path):
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "MOETUNE_MAPPINGS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("COLUMNS", "80")  # what a first terminal has
    monkeypatch.setattr(names, "detect_device_name", lambda: None)
    monkeypatch.chdir(tmp_path)


def run(capsys, *args):
    """Run the CLI in-process as `moetune` does; return (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main([str(arg) for arg in args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def logical_lines(text, deeper=2):
    """The lines of `text` with each wrapped line joined back: a line indented more than
    `deeper` columns past the one it follows continues it (the plans wrap at 80 columns
    with a hanging indent; their nested items are 2 columns in; notes hang 2 in)."""
    lines: list[str] = []
    indents: list[int] = []
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if lines and line.strip() and indent > indents[-1] + deeper and lines[-1].strip():
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
            indents.append(indent)
    return lines


def error_line(err):
    lines = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# --- batch sizes: one rule, one syntax, in tune and benchmark -----------------------


def test_benchmark_takes_a_list_of_batch_sizes_as_tune_does(capsys):
    code, out, err = run(
        capsys, "benchmark", "-m", "Qwen/Qwen3-30B-A3B", "--batch-size", "1,64",
        "--batch-size", "8", "--dry-run", "--device-name", "NVIDIA_H200",
    )  # fmt: skip
    assert code == 0, err
    rows = [line.split()[0] for line in out.splitlines() if line.startswith("  M=")]
    assert rows == ["M=1", "M=8", "M=64"]


@pytest.mark.parametrize("command", ["tune", "benchmark"])
def test_an_absurd_batch_size_is_refused_in_one_line(capsys, command):
    code, out, err = run(
        capsys, command, "-m", "Qwen/Qwen3-30B-A3B", "--batch-size", "1000000000", "--dry-run",
    )  # fmt: skip
    assert code == 2
    assert "1,048,576" in error_line(err) and "1000000000" in error_line(err)
    assert out == ""


def test_the_largest_batch_size_is_planned(capsys):
    code, out, err = run(
        capsys, "tune", "-m", "Qwen/Qwen3-30B-A3B", "--batch-size", "1048576", "--dry-run",
        "--engine", "vllm", "--device-name", "NVIDIA_H200",
    )  # fmt: skip
    assert code == 0, err
    assert "Batch sizes: 1048576" in out
    # One call there is tens of ms on an H200: the estimate is in minutes, not "~19 s".
    (line,) = [line for line in out.splitlines() if line.startswith("Estimate:")]
    assert re.match(r"Estimate: +~\d+(\.\d)? (min|h) ", line), line


# --- one layout rule for extract, check, tune and benchmark -------------------------

MIXTRAL = "mistralai/Mixtral-8x7B-v0.1"  # 8 experts, top-k 2


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
def test_the_four_commands_agree_on_every_ep_layout(capsys, tp):
    common = ["-m", MIXTRAL, "--tp", tp, "--ep", "--device-name", "NVIDIA_H200"]
    codes = {
        "extract": run(capsys, "extract", *common, "--json")[0],
        "check": run(capsys, "check", *common, "--json")[0],
        "tune": run(capsys, "tune", *common, "--dry-run", "--batch-size", "1")[0],
        "benchmark": run(capsys, "benchmark", *common, "--dry-run", "--batch-size", "1")[0],
    }
    valid = tp <= 8  # 8 experts split evenly over 1, 2, 4 or 8 ranks
    # check exits 4 (no tuned file here) where the layout is valid.
    assert codes == (
        {"extract": 0, "check": 4, "tune": 0, "benchmark": 0}
        if valid
        else {"extract": 1, "check": 1, "tune": 1, "benchmark": 1}
    )


def test_a_sweep_skips_only_what_its_reasons_call_invalid(capsys):
    code, out, err = run(
        capsys, "tune", "-m", MIXTRAL, "--tp", "1,2,4,8,16", "--ep", "--dry-run",
        "--device-name", "NVIDIA_H200", "--batch-size", "1",
    )  # fmt: skip
    assert code == 0, err
    layouts = [line.strip() for line in logical_lines(out) if line.startswith("  TP")]
    skipped = [line for line in layouts if "skipped" in line]
    assert len(skipped) == 1 and skipped[0].startswith("TP16 EP")
    assert "valid --tp with --ep: 1, 2, 4, 8" in skipped[0]
    tp8 = next(line for line in layouts if line.startswith("TP8 EP"))
    assert "-> shape 4: E=1,N=14336,K=4096,topk=1," in tp8
    # The plan says why a rank's kernel runs top-k 1.
    assert "fewer than top-k 2" in err and "tuned with top-k 1" in err


@pytest.mark.slow
def test_one_expert_per_rank_tunes_end_to_end_on_the_cpu(tmp_path):
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "moetune",
            "tune",
            "-m",
            str(TINY_MOE),
            "--tp",
            "4",
            "--ep",
            "--batch-size",
            "1",
            "--space",
            str(TINY_MOE.parent / "tiny-space.json"),
            "--engine",
            "vllm",
            "--save-dir",
            str(tmp_path / "out"),
            "--json",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "E=1,N=32,device_name=cpu.json").is_file()


# --- the dry run names the files its run writes ------------------------------------


def tiny_tune(*extra):
    space = TINY_MOE.parent / "tiny-space.json"
    return [
        "tune",
        "-m",
        TINY_MOE,
        "--space",
        space,
        "--engine",
        "vllm",
        "--batch-size",
        "1",
        *extra,
    ]


def planned_files(out):
    block = out.split("Will write:\n", 1)[1]
    rows = itertools.takewhile(lambda line: line.startswith("  "), block.splitlines())
    return [line.strip() for line in rows]


@pytest.mark.slow
def test_under_the_interpreter_the_dry_run_names_the_files_the_run_writes(
    capsys, monkeypatch, tmp_path
):
    import os
    import subprocess
    import sys

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    code, out, err = run(capsys, *tiny_tune("--save-dir", tmp_path, "--dry-run"))
    assert code == 0, err
    assert planned_files(out) == [str(tmp_path / "E=4,N=32,device_name=cpu.json")]
    assert "file names say cpu" in err
    result = subprocess.run(
        [sys.executable, "-m", "moetune", *map(str, tiny_tune("--save-dir", tmp_path, "--json"))],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["files"] == planned_files(out)


def test_without_the_interpreter_the_dry_run_names_the_h200_files(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    code, out, err = run(capsys, *tiny_tune("--save-dir", tmp_path, "--dry-run"))
    assert code == 0, err
    assert planned_files(out) == [str(tmp_path / "E=4,N=32,device_name=NVIDIA_H200.json")]


# --- labels name the dtype auto resolved to ------------------------------------------


@pytest.mark.parametrize(
    ("model", "label"),
    [("Qwen/Qwen3-30B-A3B", "TP8 bf16"), ("deepseek-ai/DeepSeek-V3", "TP8 fp8_w8a8")],
)
def test_the_plan_labels_a_layout_with_its_resolved_dtype(capsys, model, label):
    code, out, err = run(
        capsys, "tune", "-m", model, "--tp", "8", "--dry-run", "--device-name", "NVIDIA_H200",
        "--batch-size", "1",
    )  # fmt: skip
    assert code == 0, err
    shape = next(line for line in logical_lines(out) if line.startswith("Shape:"))
    assert shape.endswith(f", {label})") and "auto" not in shape
    code, out, err = run(
        capsys, "tune", "-m", model, "--tp", "4,8", "--dry-run", "--device-name", "NVIDIA_H200",
        "--batch-size", "1", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert [entry["layout"] for entry in json.loads(out)["layouts"]][1] == label


# --- benchmark --config: the file's name is checked against the layout ---------------


def benchmark(*extra):
    return ["benchmark", "-m", "Qwen/Qwen3-30B-A3B", "--config", VLLM_FILE, "--dry-run",
            "--batch-size", "1", "--device-name", "NVIDIA_H200", *extra]  # fmt: skip


def test_benchmark_warns_when_the_file_is_for_another_layout(capsys):
    code, out, err = run(capsys, *benchmark("--tp", "2"))  # a TP1 file (N=768) timed as TP2
    assert code == 0, err
    (warning,) = [line for line in logical_lines(err, 0) if line.startswith("Warning:")]
    assert warning.startswith(f"Warning: --config {VLLM_FILE.name} names N=768, but ")
    assert "TP2 on this machine is N=384" in warning and "--strict" in warning
    assert out.startswith("Would time E=128,N=384,")


def test_benchmark_strict_refuses_a_file_for_another_layout(capsys):
    code, out, err = run(capsys, *benchmark("--tp", "2", "--strict"))
    assert code == 1 and out == ""
    assert "names N=768" in error_line(err) and "--strict" in error_line(err)


@pytest.mark.parametrize(
    ("extra", "differs"),
    [
        (["--dtype", "fp8_w8a8"], "no dtype, but"),
        (["--device-name", "NVIDIA A100-SXM4-80GB"], "device_name=NVIDIA_H200, but"),
    ],
)
def test_benchmark_checks_the_gpu_and_dtype_in_the_name_too(capsys, extra, differs):
    code, out, err = run(capsys, *benchmark(*extra, "--strict"))
    assert code == 1 and differs in error_line(err)


def test_benchmark_strict_times_a_file_named_for_the_layout(capsys):
    code, out, err = run(capsys, *benchmark("--tp", "1", "--strict"))
    assert code == 0, err
    assert "Warning" not in err


def test_benchmark_dry_run_json_prints_only_json(capsys):
    code, out, err = run(capsys, *benchmark("--tp", "2", "--json"))
    assert code == 0
    plan = json.loads(out)
    assert plan["problem"].startswith("E=128,N=384,") and plan["dry_run"]
    (pick,) = plan["picks"]
    assert pick["batch_size"] == 1
    assert pick[str(VLLM_FILE)]["config"]["BLOCK_SIZE_M"] == 16
    assert plan["warnings"] and "names N=768" in plan["warnings"][0]
    # stderr: the warning, which matters; no text report, no notes (they are in the JSON).
    assert [line.split(":")[0] for line in logical_lines(err, 0)] == ["Warning"]


# --- --json: stdout is one JSON document, stderr says nothing the JSON does not -------


@pytest.mark.parametrize(
    "args",
    [
        ["extract", "-m", "Qwen/Qwen3-30B-A3B"],
        ["check", "-m", "Qwen/Qwen3-30B-A3B"],
        ["tune", "-m", "Qwen/Qwen3-30B-A3B", "--dry-run", "--batch-size", "1"],
        ["tune", "-m", "Qwen/Qwen3-30B-A3B", "--tp", "1,2", "--dry-run", "--batch-size", "1"],
        ["benchmark", "-m", "Qwen/Qwen3-30B-A3B", "--dry-run", "--batch-size", "1"],
    ],
    ids=["extract", "check", "tune", "tune-sweep", "benchmark"],
)
def test_json_output_is_json_alone_with_its_notes_inside(capsys, args):
    """No --device-name and no GPU: every command has a note to make, in the JSON."""
    code, out, err = run(capsys, *args, "--json")
    assert code in (0, 4), err  # check: 4, no tuned file here
    data = json.loads(out)
    assert err == ""
    notes = data["notes"]
    assert any("no GPU visible" in note for note in notes), notes


# --- messages that mislead ------------------------------------------------------------


def test_validate_names_every_missing_field_once(capsys, tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "version: 1\nentries:\n  - name: x\n    architectures: [XForCausalLM]\n    params: {}\n"
    )
    code, out, err = run(capsys, "validate", path)
    assert code == 1
    missing = [line.split("'")[-2] for line in err.splitlines() if "missing (required)" in line]
    assert missing == ["params.num_experts", "params.top_k", "params.intermediate_size",
                       "params.hidden_size"]  # fmt: skip
    assert error_line(err) == f"Error: {path}: 4 problems"


@pytest.mark.parametrize(
    "config",
    [{"hidden_size": 64}, {"architectures": [], "hidden_size": 64}, {"model_type": "acme"}],
)
def test_the_suggested_entry_is_valid_yaml_even_without_architectures(capsys, tmp_path, config):
    import yaml

    from moetune.extract.mappings import validate_file

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = run(capsys, "extract", "-m", path)
    line = error_line(err)
    assert code == 1 and ", ," not in line
    entry = yaml.safe_load(line.split("--mappings file): ", 1)[1].replace("<path>", "a.b"))
    mappings = tmp_path / "mine.yaml"
    mappings.write_text(yaml.safe_dump({"version": 1, "entries": [entry]}))
    assert validate_file(str(mappings)) == []


def test_a_group_size_no_tile_can_hold_is_refused_as_such(capsys):
    code, out, err = run(
        capsys, "tune", "-m", "Qwen/Qwen3-30B-A3B", "--dtype", "int4_w4a16", "--group-size",
        "100", "--dry-run", "--batch-size", "1",
    )  # fmt: skip
    assert code == 2
    line = error_line(err)
    assert "100 is no power of two" in line and "widen" not in line


def test_a_problem_no_config_can_run_names_the_rule(capsys):
    code, out, err = run(
        capsys, "tune", "-m", "Qwen/Qwen3-30B-A3B", "--dtype", "int4_w4a16", "--group-size",
        "1024", "--dry-run", "--batch-size", "1",
    )  # fmt: skip
    assert code == 1
    line = error_line(err)
    assert "rule wna16_blocks removed the last 1920" in line and "group size" in line
    assert "widen" not in line


def test_an_unknown_checkpoint_dtype_is_refused(capsys, tmp_path):
    config = json.loads((TINY_MOE / "config.json").read_text())
    config["torch_dtype"] = "float13"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = run(capsys, "extract", "-m", path)
    assert code == 1
    line = error_line(err)
    assert 'dtype is "float13" (field torch_dtype), expected one of bfloat16, float16' in line


@pytest.mark.parametrize("version", ["banana", "3.4", "3.4.0/../../x", ""])
def test_check_refuses_a_triton_version_that_is_none(capsys, version):
    code, out, err = run(
        capsys, "check", "-m", "Qwen/Qwen3-30B-A3B", "--triton-version", version,
        "--device-name", "NVIDIA_H200",
    )  # fmt: skip
    assert code == 2 and out == ""
    assert "is not a Triton version" in error_line(err)


@pytest.mark.parametrize("version", ["3.4.0", "3.5.0rc1", "3.3.1+git3b1c9b2b"])
def test_check_takes_a_real_triton_version(capsys, version):
    code, out, err = run(
        capsys, "check", "-m", "Qwen/Qwen3-30B-A3B", "--triton-version", version,
        "--device-name", "NVIDIA_H200", "--engine", "sglang", "--json",
    )  # fmt: skip
    assert code == 4, err  # no file here: but the version is taken
    assert json.loads(out)["triton_version"] == version


# --- install hints: moetune is installed from its checkout ------------------------------


@pytest.mark.parametrize("command", ["tune", "benchmark"])
def test_without_torch_the_timing_commands_say_so_not_no_gpu(capsys, monkeypatch, command):
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # `import torch` fails
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    code, out, err = run(capsys, command, "-m", TINY_MOE, "--batch-size", "1")
    assert code == 1 and out == ""
    line = error_line(err)
    assert line.startswith("Error: torch is not installed:") and "no CUDA GPU" not in line
    assert "in the moetune checkout: pip install -e '.[kernel]'" in line
    assert f"`moetune {command} ... --dry-run` shows the plan" in line


def test_without_a_gpu_benchmark_names_its_own_dry_run(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    code, out, err = run(capsys, "benchmark", "-m", TINY_MOE, "--batch-size", "1")
    assert code == 1
    line = error_line(err)
    assert "no CUDA GPU visible" in line and "`moetune benchmark ... --dry-run`" in line


def test_every_pip_hint_says_where_it_runs():
    """A `pip install -e` only works in the checkout; an engine goes in without its deps."""
    hints = []
    for path in sorted((ROOT / "moetune").rglob("*.py")):
        text = path.read_text()
        for match in re.finditer(r"pip install[^\n]*", text):
            around = text[max(0, match.start() - 80) : match.end() + 80]
            hints.append((f"{path.relative_to(ROOT)}: {match.group()}", match.group(), around))
    assert len(hints) >= 5
    for where, hint, around in hints:
        if "pip install -e" in hint:
            assert "checkout" in around, where
        elif re.match(r"pip install \{?(vllm|sglang|target)", hint):
            assert "--no-deps" in hint, where
