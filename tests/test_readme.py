"""README.md is real: its console blocks match fresh runs, and every command in it runs.

See scripts/gen_readme.py for the block markers; `python scripts/gen_readme.py`
regenerates the blocks.
"""

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gen_readme.py"
CODE_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# Commands that would time kernels on a GPU: checked with --dry-run.
GPU_COMMANDS = ("tune", "benchmark")
A_TUNED_ENTRY = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 64,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}


def _generator():
    spec = importlib.util.spec_from_file_location("gen_readme", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gen = _generator()


def flat(text: str) -> str:
    return " ".join(text.split())


def test_readme_has_the_generated_blocks():
    names = [block.name for block in gen.blocks(gen.README.read_text())]
    assert len(names) == len(set(names)), names
    for name in ("extract-qwen", "extract-kimi", "archs", "acme-unknown", "acme-valid"):
        assert name in names
    assert "tune-dry-run" in names and "report-h200" in names


@pytest.mark.slow
def test_generated_blocks_match_a_fresh_run():
    text = gen.README.read_text()
    fresh = gen.render(text)
    assert gen.machine_independent(fresh) == gen.machine_independent(text), (
        "README.md drifted from the commands' real output: run python scripts/gen_readme.py"
    )


EXIT_STATUS = re.compile(r"\(exit status (\d+)\)")


def readme_commands() -> list[tuple[str, int]]:
    """Every moetune command of the README in order, and the exit status its shown output implies:
    1 for an ``Error:``, N where the output says ``(exit status N)``, else 0."""
    commands = []
    for match in CODE_BLOCK.finditer(gen.README.read_text()):
        language, body = match.group(1), match.group(2)
        if language == "bash":
            for line in body.splitlines():
                if line.startswith("moetune "):
                    commands.append((" ".join(shlex.split(line, comments=True)), 0))
        elif language == "console":
            lines = body.splitlines()
            for i, line in enumerate(lines):
                if line.startswith("$ moetune "):
                    shown = lines[i + 1] if i + 1 < len(lines) else ""
                    output = []
                    for later in lines[i + 1 :]:
                        if later.startswith("$ "):
                            break
                        output.append(later)
                    status = EXIT_STATUS.search("\n".join(output))
                    code = (
                        1 if shown.startswith("Error:") else int(status.group(1)) if status else 0
                    )
                    commands.append((line[2:], code))
    return commands


def _write_planned_files(output: str, cwd: Path) -> None:
    """Stand in for a GPU tune: the files its plan says it will write, with one entry."""
    planned = output.split("Will write:\n", 1)
    if len(planned) < 2:
        return
    for line in planned[1].splitlines():
        if not line.startswith("  ") or not line.strip().endswith(".json"):
            break
        path = cwd / line.strip()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"1": A_TUNED_ENTRY}))


@pytest.mark.slow
def test_every_readme_command_runs_in_order_in_a_fresh_folder(tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    # README commands compare with vLLM's published files, as a user in a checkout would.
    shutil.copytree(ROOT / "bench" / "vllm_configs", tmp_path / "bench" / "vllm_configs")
    commands = readme_commands()
    assert len(commands) >= 10
    ran = []
    for command, expected in commands:
        command = gen.HEAD.sub("", command)
        argv = shlex.split(command)[1:]
        if argv[0] in GPU_COMMANDS and "--dry-run" not in argv:
            argv.append("--dry-run")
        env = gen.environment(str(tmp_path / "hf_home"))
        result = subprocess.run(
            [sys.executable, "-m", "moetune", *argv],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=300,
        )
        assert result.returncode == expected, f"{command}\n{result.stderr}"
        if argv[0] == "tune":
            _write_planned_files(result.stdout, tmp_path)
        ran.append(argv[0])
    assert {"extract", "tune", "benchmark", "archs", "validate"} <= set(ran)


def test_help_texts_and_readme_say_the_same():
    from click.testing import CliRunner

    from moetune.cli import cli
    from moetune.commands import texts
    from moetune.extract.filenames import FALLBACK_DEVICE_NAME

    readme = flat(gen.README.read_text())
    for name in ("FAST_SEARCH_SHARE", "DEVICE_NAME_DEFAULT", "FLOOR_HELP"):
        assert flat(getattr(texts, name)) in readme, f"README does not say texts.{name}"
    assert FALLBACK_DEVICE_NAME.replace(" ", "_") in texts.DEVICE_NAME_DEFAULT
    runner = CliRunner()
    tune_help = flat(runner.invoke(cli, ["tune", "--help"], terminal_width=100).output)
    assert flat(texts.FLOOR_HELP) in tune_help and flat(texts.SEARCH_HELP) in tune_help
    for command in ("extract", "tune", "benchmark"):
        helptext = flat(runner.invoke(cli, [command, "--help"], terminal_width=100).output)
        assert flat(texts.DEVICE_NAME_HELP) in helptext, command


def test_machine_dependent_parts_are_the_only_normalization():
    assert gen.machine_independent("configs/triton_3_6_0/ Triton 3.6.0") == (
        "configs/triton_X_Y_Z/ Triton X.Y.Z"
    )
    assert gen.normalize_paths(f"{ROOT}{os.sep}moetune/data/x.yaml") == "moetune/data/x.yaml"
