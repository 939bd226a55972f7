"""The terminal: a closed pipe, 80 columns, names and paths never cut."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def environment(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "MOETUNE_MAPPINGS")}
    env.update(
        PYTHONPATH=str(ROOT),
        CUDA_VISIBLE_DEVICES="",
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf_home"),
        **extra,
    )
    return env


@pytest.mark.parametrize(
    "args",
    [
        ["archs"],  # rich
        ["extract", "-m", "Qwen/Qwen3-30B-A3B", "--json", "--device-name", "NVIDIA_H200"],
        ["tune", "-m", "Qwen/Qwen3-30B-A3B", "--dry-run", "--device-name", "NVIDIA_H200"],
    ],
    ids=["archs", "extract-json", "tune-dry-run"],
)
def test_a_reader_that_goes_away_is_no_error(tmp_path, args):
    """`moetune ... | head`: the pipe closes before the command writes; exit 0, nothing said."""
    process = subprocess.Popen(
        [sys.executable, "-m", "moetune", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=environment(tmp_path),
    )
    process.stdout.close()  # before the interpreter has even started: every write fails
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0, stderr
    assert "Error" not in stderr and "Exception" not in stderr, stderr


def moetune_at_80(tmp_path, *args, **extra):
    env = environment(tmp_path, COLUMNS="80", **extra)
    result = subprocess.run(
        [sys.executable, "-m", "moetune", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout, result.stderr


def whole_on_a_line(text, *names):
    """Each name appears whole on some line of `text` (nothing split it in two)."""
    lines = text.splitlines()
    for name in names:
        assert any(name in line for line in lines), f"{name!r} is cut:\n{text}"


def test_extract_at_80_columns_keeps_every_field_path_whole(tmp_path):
    out, _ = moetune_at_80(
        tmp_path, "extract", "-m", "moonshotai/Kimi-K3", "--tp", "8", "--ep",
        "--device-name", "NVIDIA_H200",
    )  # fmt: skip
    whole_on_a_line(
        out,
        "text_config.quantization_config.quant_method",
        "text_config.routed_expert_hidden_size",
        "[112, 6144, 3584]",
        "E=112,N=3072,device_name=NVIDIA_H200.json",
    )


@pytest.mark.slow
def test_a_cpu_tune_and_benchmark_at_80_columns_keep_paths_and_names_whole(tmp_path):
    save_dir = tmp_path / "a-results-folder-with-a-long-enough-name-to-wrap"
    tiny = ROOT / "tests" / "tune" / "data"
    out, err = moetune_at_80(
        tmp_path, "tune", "-m", tiny / "tiny-moe", "--tp", "1,2", "--space",
        tiny / "tiny-space.json", "--batch-size", "1", "--engine", "sglang",
        "--save-dir", save_dir, TRITON_INTERPRET="1",
    )  # fmt: skip
    written = sorted(save_dir.rglob("E=*.json"))
    assert len(written) == 4  # 2 shapes x (table + _down table)
    whole_on_a_line(out, *map(str, written))  # "Wrote:" lists each path whole
    whole_on_a_line(out, str(save_dir), *(str(p.relative_to(save_dir)) for p in written))
    assert "overflow encountered" not in err and "RuntimeWarning" not in err

    config = next(p for p in written if p.name == "E=4,N=32,device_name=cpu.json")
    out, _ = moetune_at_80(
        tmp_path, "benchmark", "-m", tiny / "tiny-moe", "--config", config, "--batch-size",
        "1", "--engine", "vllm", TRITON_INTERPRET="1",
    )  # fmt: skip
    whole_on_a_line(out, f"file 1: {config}", "vLLM fallback")


def assert_fits_80(text):
    """Every line fits 80 columns, but one that is a single word (a path, a name: data
    that may not be cut) after its indent. (A table of config paths wider than 80, as
    Kimi K3's, is data too: `test_extract_at_80_columns_keeps_every_field_path_whole`.)"""
    for line in text.splitlines():
        line = line.rstrip()  # a table pads its cells
        assert len(line) <= 80 or len(line.split()) == 1, f"{len(line)} wide: {line!r}"


QWEN_FILE = ROOT / "bench" / "vllm_configs" / "E=128,N=768,device_name=NVIDIA_H200.json"


@pytest.mark.parametrize(
    "args",
    [
        ["archs"],
        ["extract", "-m", "Qwen/Qwen3-30B-A3B-FP8", "--tp", "2", "--device-name", "NVIDIA_H200"],
        ["check", "-m", "Qwen/Qwen3-30B-A3B", "--device-name", "NVIDIA_H200"],
        ["check", "-m", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--device-name", "NVIDIA_H200"],
        ["benchmark", "-m", "Qwen/Qwen3-30B-A3B", "--dry-run", "--config", QWEN_FILE,
         "--device-name", "NVIDIA_H200"],
        ["tune", "-m", "Qwen/Qwen3-30B-A3B-FP8", "--dry-run", "--device-name", "NVIDIA_H200"],
        ["tune", "-m", "Qwen/Qwen3-30B-A3B", "--tp", "1,2,3", "--dry-run", "--batch-size", "1",
         "--device-name", "NVIDIA_H200"],
    ],
    ids=["archs", "extract-fp8", "check", "check-fp8", "benchmark-dry-run",
         "tune-dry-run", "tune-sweep-dry-run"],
)  # fmt: skip
def test_output_fits_80_columns_but_for_paths(tmp_path, args):
    result = subprocess.run(
        [sys.executable, "-m", "moetune", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=environment(tmp_path, COLUMNS="80"),
        timeout=600,
    )
    assert result.returncode in (0, 4), result.stderr  # check: 4 when a file is missing
    assert result.stdout.strip()
    assert_fits_80(result.stdout)
    assert_fits_80(result.stderr)


def test_a_pipe_without_columns_keeps_each_line_whole(tmp_path):
    """`moetune check | grep`: with no terminal and no $COLUMNS a line is not wrapped."""
    env = environment(tmp_path)
    env.pop("COLUMNS", None)
    result = subprocess.run(
        [sys.executable, "-m", "moetune", "check", "-m", "Qwen/Qwen3-30B-A3B",
         "--device-name", "NVIDIA_H200"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600,
    )  # fmt: skip
    assert "to fill the gap: moetune tune --model Qwen/Qwen3-30B-A3B --tp 1 --device-name" in (
        result.stdout
    )


def test_say_wraps_at_spaces_and_keeps_a_long_path_whole():
    import io

    from rich.console import Console

    from moetune.commands.terminal import say

    buffer = io.StringIO()
    console = Console(file=buffer, width=40)
    path = "/a/very/long/folder/name/that/does/not/fit/in/forty/columns.json"
    say(console, f"Note: the file {path} is kept, and this sentence wraps at spaces")
    lines = buffer.getvalue().splitlines()
    assert f"  {path}" in lines
    assert all(len(line) <= 40 for line in lines if path not in line)
    assert " ".join(line.strip() for line in lines) == (
        f"Note: the file {path} is kept, and this sentence wraps at spaces"
    )


def wrapped_at(width, *lines, columns="80"):
    import io

    from rich.console import Console

    from moetune.commands.terminal import print_lines

    buffer = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", columns)
        print_lines(Console(file=buffer, width=width), lines)
    return buffer.getvalue().splitlines()


def test_a_plan_line_hangs_under_its_label_and_keeps_paths_whole():
    path = "/results/Qwen__Qwen3-30B-A3B/configs/triton_3_9_0/E=128,N=768.json"
    line = f"Results:     {path} (resumable, one store for every shape of the sweep)"
    lines = wrapped_at(40, line, "  M=1       704 kept  (block_quant 736, shared_memory 32)")
    assert lines[:3] == [
        "Results:",
        f"             {path}",
        "             (resumable, one store for",
    ]
    assert all(len(text) <= 40 for text in lines if path not in text)
    assert lines[-2:] == [
        "  M=1       704 kept  (block_quant 736,",
        "            shared_memory 32)",
    ]


def test_without_a_width_to_fit_a_line_is_printed_whole():
    line = "Batch sizes: " + ", ".join(str(1 << n) for n in range(13))
    assert wrapped_at(40, line, columns="") == [line]
    assert wrapped_at(40, line)[1].startswith("             ")  # under the value


@pytest.mark.parametrize(("interpret", "shown"), [("1", False), ("0", True)])
def test_the_worker_drops_numpy_warnings_under_the_interpreter_only(tmp_path, interpret, shown):
    script = (
        "import numpy\n"
        "from moetune.tune.measure.worker import quiet_interpreter\n"
        "quiet_interpreter()\n"
        "numpy.float32(3e38) * numpy.float32(10)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=environment(tmp_path, TRITON_INTERPRET=interpret),
    )
    assert result.returncode == 0, result.stderr
    assert ("overflow encountered in" in result.stderr) == shown
