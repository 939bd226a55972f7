"""README.md and the docs pages are real: their console blocks match fresh runs, and every
command in them runs.

The files are scripts/gen_readme.py's DOCUMENTS; see that script for the block markers.
`python scripts/gen_readme.py` regenerates the blocks.
"""

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
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
DOCUMENTS = [pytest.param(path, id=str(path.relative_to(ROOT))) for path in gen.DOCUMENTS]


def flat(text: str) -> str:
    return " ".join(text.split())


def test_readme_has_the_generated_blocks():
    readme = [block.name for block in gen.blocks(gen.README.read_text())]
    for name in ("extract-qwen", "check-missing", "tune-dry-run", "acme-valid"):
        assert name in readme
    names = [block.name for path in gen.DOCUMENTS for block in gen.blocks(path.read_text())]
    assert len(names) == len(set(names)), names
    for name in ("extract-kimi", "archs", "acme-unknown", "report-h200", "tune-sweep-h200"):
        assert name in names


def test_every_file_with_console_blocks_is_generated():
    """A marked block anywhere in the README or docs/ is regenerated and tested."""
    marked = {
        path
        for path in [gen.README, *sorted((ROOT / "docs").glob("*.md"))]
        if gen.blocks(path.read_text())
    }
    assert marked == set(gen.DOCUMENTS), sorted(str(p) for p in marked ^ set(gen.DOCUMENTS))
    assert gen.DOCUMENTS[0] == gen.README


@pytest.mark.slow
@pytest.mark.parametrize("document", DOCUMENTS)
def test_generated_blocks_match_a_fresh_run(document):
    text = document.read_text()
    fresh = gen.render(text)
    assert gen.machine_independent(fresh) == gen.machine_independent(text), (
        f"{document.name} drifted from the commands' real output: run python scripts/gen_readme.py"
    )


EXIT_STATUS = re.compile(r"\(exit status (\d+)\)")
MARKER = re.compile(r"<!-- moetune-console: [\w.-]+(?P<attrs>[^>]*?)\s*-->\n$")
# A bash line that needs this repository's files says so in its comment.
IN_A_CHECKOUT = "# in a checkout"
# What only a checkout of this repository holds (the README must say where it runs).
CHECKOUT_PATHS = ("examples/", "bench/", "tests/")


@dataclass(frozen=True)
class ReadmeCommand:
    command: str  # without the prompt, comments or the `| head` a block may show
    status: int  # the exit status its shown output implies
    checkout: bool  # the document says it runs in a checkout of this repository


def readme_commands(document: Path = gen.README) -> list[ReadmeCommand]:
    """Every moetune command of `document` in order, the exit status its shown output implies
    (1 for an ``Error:``, N where the output says ``(exit status N)``, else 0), and whether the
    document says it runs in a checkout (a console block marked ``checkout``, a bash line with
    ``# in a checkout``)."""
    text = document.read_text()
    commands = []
    for match in CODE_BLOCK.finditer(text):
        language, body = match.group(1), match.group(2)
        if language == "bash":
            for line in body.splitlines():
                if line.startswith("moetune "):
                    command = " ".join(shlex.split(line, comments=True))
                    commands.append(ReadmeCommand(command, 0, IN_A_CHECKOUT in line))
        elif language == "console":
            marker = MARKER.search(text, 0, match.start())
            checkout = bool(marker) and "checkout" in marker["attrs"].split()
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
                    commands.append(ReadmeCommand(line[2:], code, checkout))
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


def a_checkout(folder: Path) -> Path:
    """What of this repository the README's checkout commands read, copied to `folder`."""
    for part in ("examples", "bench/vllm_configs", "tests/tune/data"):
        shutil.copytree(ROOT / part, folder / part)
    return folder


@pytest.mark.parametrize("document", DOCUMENTS)
def test_a_command_that_needs_the_checkout_says_so(document):
    """Paths only a checkout has are shown only where the text says to run in one."""
    commands = readme_commands(document)
    for item in commands:
        uses = [path for path in CHECKOUT_PATHS if path in item.command]
        assert item.checkout or not uses, f"{item.command}: say it runs in a checkout"
    # A marked console block's section says it too, in the text above the block.
    text = document.read_text()
    for block in gen.blocks(text):
        marker = text.rfind("<!-- moetune-console:", 0, block.span[0])
        if "checkout" in text[marker : text.index("-->", marker)].split():
            section = text[text.rfind("\n#", 0, marker) : marker]
            prose = re.sub(r"^```.*?^```", "", section, flags=re.S | re.M)
            assert "in a checkout" in prose, f"{block.name}: the text above must say where it runs"


@pytest.mark.slow
@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_command_runs_in_order_outside_the_checkout_or_in_one_as_marked(document, tmp_path):
    """A user outside the checkout runs every unmarked command of a document, in order, in a
    fresh folder; the marked ones in a checkout."""
    outside = tmp_path / "outside"
    outside.mkdir()
    checkout = a_checkout(tmp_path / "checkout")
    commands = readme_commands(document)
    assert commands, f"{document.name} shows no moetune command"
    ran = []
    for item in commands:
        command = gen.HEAD.sub("", item.command)
        argv = shlex.split(command)[1:]
        if argv[0] in GPU_COMMANDS and "--dry-run" not in argv:
            argv.append("--dry-run")
        cwd = checkout if item.checkout else outside
        result = subprocess.run(
            [sys.executable, "-m", "moetune", *argv],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=gen.environment(str(tmp_path / "hf_home")),
            timeout=300,
        )
        assert result.returncode == item.status, f"{command} (in {cwd.name})\n{result.stderr}"
        if argv[0] == "tune":
            _write_planned_files(result.stdout, cwd)
        ran.append(argv[0])
    if document == gen.README:
        assert {"extract", "tune", "benchmark", "validate", "check", "report"} <= set(ran)


@pytest.mark.slow
def test_the_cpu_try_it_runs_in_a_checkout(tmp_path):
    """The first screen's `TRITON_INTERPRET=1 moetune tune ...`, as shown (--save-dir moved)."""
    (line,) = [
        line
        for line in gen.README.read_text().splitlines()
        if line.startswith("TRITON_INTERPRET=1 moetune tune ")
    ]
    argv = shlex.split(line)[2:]
    save = argv.index("--save-dir")
    argv[save + 1] = str(tmp_path / "try")
    env = {**gen.environment(str(tmp_path / "hf_home")), "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "moetune", *argv],
        capture_output=True,
        text=True,
        cwd=a_checkout(tmp_path / "checkout"),
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "try" / "E=4,N=32,device_name=cpu.json").is_file()
    assert "Geomean speedup" in result.stdout


def test_shell_completion_works_as_the_readme_shows(tmp_path):
    readme = gen.README.read_text()
    assert 'eval "$(_MOETUNE_COMPLETE=bash_source moetune)"' in readme
    env = {**gen.environment(str(tmp_path / "hf_home")), "_MOETUNE_COMPLETE": "bash_source"}
    script = subprocess.run(
        [sys.executable, "-m", "moetune"], capture_output=True, text=True, env=env, timeout=60
    )
    assert script.returncode == 0 and "complete " in script.stdout
    env.update(_MOETUNE_COMPLETE="bash_complete", COMP_WORDS="moetune tu", COMP_CWORD="1")
    words = subprocess.run(
        [sys.executable, "-m", "moetune"], capture_output=True, text=True, env=env, timeout=60
    )
    assert words.stdout.split() == ["plain,tune"]


def test_help_texts_and_docs_say_the_same():
    from click.testing import CliRunner

    from moetune.cli import cli
    from moetune.commands import texts
    from moetune.engines.names import FALLBACK_DEVICE_NAME

    readme = flat(gen.README.read_text())
    for name in ("FAST_SEARCH_SHARE", "DEVICE_NAME_DEFAULT"):
        assert flat(getattr(texts, name)) in readme, f"README does not say texts.{name}"
    docs = [flat(path.read_text()) for path in gen.DOCUMENTS]
    assert any(flat(texts.FLOOR_HELP) in doc for doc in docs), "no document says texts.FLOOR_HELP"
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


# The README is a new user's first hour (install, the two commands, the YAML format with a
# worked example, measured numbers); detail belongs in docs/.
README_MAX_LINES = 250


def test_the_readme_stays_a_first_hour_read():
    lines = gen.README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move detail to docs/"


def test_the_readme_says_to_pick_one_install():
    """`make install` and the pip lines are alternatives, and the README says which is which."""
    install = gen.README.read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "**one** of the two" in install
    assert "`make install`" in install and 'pip install -e ".[kernel]"' in install
    assert install.index("run the tests") < install.index("`make install`")
    assert install.index("GPU machine you serve on") < install.index("pip install torch")
