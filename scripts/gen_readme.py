"""Regenerate the console blocks of README.md and the docs pages from real runs of their commands.

The files are `DOCUMENTS` (README.md, then the docs/ pages that show console output). A
console block they mark like this is generated, never edited by hand:

    <!-- moetune-console: extract-qwen -->
    ```console
    $ moetune extract --model Qwen/Qwen3-30B-A3B --tp 1 --device-name NVIDIA_H200
    ...output, replaced by this script...
    ```

Each ``$ `` line is run (``moetune`` is this checkout's ``python -m moetune``; a
trailing ``| head -n N`` keeps the first N lines) from the repository root, with
no GPU visible, no network (``HF_HUB_OFFLINE=1``, an empty HF cache) and 120
columns, and its output (stdout and stderr, in order) replaces the lines under it.
Commands pass ``--device-name`` so the file names do not depend on the machine.

A block marked ``checkout`` (``<!-- moetune-console: NAME checkout -->``) reads files
only a checkout of this repository has (``examples/``, ``bench/``); the text says so
above it, and `tests/test_readme.py` runs it in a copy of those files, every other
command in a folder outside the checkout.

A block marked ``recorded="<machine>, <date>"`` holds output recorded on a GPU
(a tune's summary): this script leaves it alone, and `tests/test_readme.py` only
checks that its commands parse (tune with ``--dry-run``).

    python scripts/gen_readme.py            # rewrite every file of DOCUMENTS
    python scripts/gen_readme.py --check    # exit 1 if one of them would change

`tests/test_readme.py` re-runs the CPU blocks and fails when one of these files drifts.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# Every file whose console blocks are generated (the README first); block names are unique
# across them. A docs page that shows a marked block belongs here.
DOCUMENTS = [README] + [
    ROOT / "docs" / name
    for name in ("extract.md", "mappings.md", "tuning.md", "engines.md", "report.md")
]
WIDTH = "120"

BLOCK = re.compile(
    r"(?P<head><!-- moetune-console: (?P<name>[\w.-]+)(?P<attrs>[^>]*?)\s*-->\n```console\n)"
    r"(?P<body>.*?)(?P<tail>^```)",
    re.S | re.M,
)
RECORDED = re.compile(r'recorded="([^"]+)"')
HEAD = re.compile(r"\s*\|\s*head -n (\d+)\s*$")
# What honestly differs between machines, and nothing else.
MACHINE_DEPENDENT = [
    (re.compile(r"triton_\d+_\d+_\d+"), "triton_X_Y_Z"),
    (re.compile(r"Triton \d+\.\d+\.\d+"), "Triton X.Y.Z"),
]
# Environment that would change the output, removed for every run.
DROPPED_ENV = (
    "TRITON_INTERPRET",
    "MOETUNE_MAPPINGS",
    "VLLM_TUNED_CONFIG_FOLDER",
    "SGLANG_MOE_CONFIG_DIR",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_ENDPOINT",
    "XDG_CACHE_HOME",
)


@dataclass(frozen=True)
class Block:
    name: str
    recorded: str | None  # "<machine>, <date>" for GPU output, None for generated blocks
    commands: list[str]  # without the "$ " prompt
    body: str
    span: tuple[int, int]  # of the body in the document's text


def blocks(text: str) -> list[Block]:
    found = []
    for match in BLOCK.finditer(text):
        recorded = RECORDED.search(match["attrs"])
        commands = [line[2:] for line in match["body"].splitlines() if line.startswith("$ ")]
        found.append(
            Block(
                match["name"],
                recorded.group(1) if recorded else None,
                commands,
                match["body"],
                match.span("body"),
            )
        )
    return found


def environment(hf_home: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env.update(
        COLUMNS=WIDTH,
        LINES="50",
        PYTHONUNBUFFERED="1",
        CUDA_VISIBLE_DEVICES="",
        HF_HUB_OFFLINE="1",
        HF_HOME=hf_home,
        PYTHONPATH=str(ROOT),
        TERM="dumb",
    )
    return env


def run_command(command: str, cwd: Path = ROOT) -> str:
    """The output of one documented command line, as a user at `cwd` would see it."""
    keep = None
    head = HEAD.search(command)
    if head:
        keep = int(head.group(1))
        command = command[: head.start()]
    argv = shlex.split(command)
    if not argv or argv[0] != "moetune":
        raise SystemExit(f"documented command does not start with moetune: {command!r}")
    with tempfile.TemporaryDirectory() as hf_home:
        result = subprocess.run(
            [sys.executable, "-m", "moetune", *argv[1:]],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            env=environment(hf_home),
            timeout=300,
        )
    lines = [line.rstrip() for line in result.stdout.splitlines()]
    if keep is not None:
        lines = lines[:keep]
    return normalize_paths("\n".join(lines))


def normalize_paths(text: str) -> str:
    """This checkout's absolute path, as the relative path a user in the checkout sees."""
    return text.replace(str(ROOT) + os.sep, "")


def render_block(block: Block) -> str:
    out = []
    for command in block.commands:
        out.append(f"$ {command}")
        output = run_command(command)
        if output:
            out.append(output)
    return "\n".join(out) + "\n"


def machine_independent(text: str) -> str:
    for pattern, replacement in MACHINE_DEPENDENT:
        text = pattern.sub(replacement, text)
    return text


def render(text: str) -> str:
    """The document with every generated block's output replaced by a fresh run."""
    pieces, last = [], 0
    for block in blocks(text):
        if block.recorded is not None:
            continue
        start, end = block.span
        pieces += [text[last:start], render_block(block)]
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


def main(argv: list[str]) -> int:
    stale = []
    for document in DOCUMENTS:
        text = document.read_text()
        fresh = render(text)
        name = document.relative_to(ROOT)
        if "--check" in argv:
            if machine_independent(fresh) != machine_independent(text):
                stale.append(str(name))
            continue
        document.write_text(fresh)
        print(f"wrote {name} ({len(blocks(text))} console blocks)", file=sys.stderr)
    if stale:
        print(f"out of date: {', '.join(stale)}: run python scripts/gen_readme.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
