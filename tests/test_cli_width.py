"""At 80 columns nothing a user types is cut: architecture names, command summaries."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def moetune(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "80"}
    result = subprocess.run(
        [sys.executable, "-m", "moetune", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_archs_prints_every_name_whole_at_80_columns():
    from moetune.extract.mappings import load_registry

    text = moetune("archs")
    assert max(map(len, text.splitlines())) <= 80
    words = {word.strip(",:") for word in text.split()}
    registry = load_registry(None)
    for entry in registry.entries:
        assert entry.name in words
        for name in (*entry.architectures, *entry.model_types):
            assert name in words, f"{name} cut"
    assert "…" not in text


def test_help_lists_each_command_summary_whole_at_80_columns():
    from moetune.cli import cli, summary_line

    text = moetune("--help")
    commands = text.split("Commands:")[1]
    assert "..." not in commands
    flat = " ".join(commands.split())
    ctx = cli.make_context("moetune", [], resilient_parsing=True)
    for name in cli.list_commands(ctx):
        summary = summary_line(cli.get_command(ctx, name))
        assert f"{name} {summary}" in flat


def test_short_options_mean_the_same_on_every_command():
    import click

    from moetune.cli import cli

    ctx = cli.make_context("moetune", [], resilient_parsing=True)
    meaning: dict[str, tuple[str, str]] = {}
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        params = [p for p in command.params if isinstance(p, click.Option)]
        longs = {opt for p in params for opt in p.opts if opt.startswith("--")}
        if "--model" in longs:
            assert any("-m" in p.opts and "--model" in p.opts for p in params), name
        for param in params:
            long = next((opt for opt in param.opts if opt.startswith("--")), None)
            for short in (opt for opt in param.opts if not opt.startswith("--")):
                first = meaning.setdefault(short, (long, name))
                assert first[0] == long, f"{short} is {long} in {name} but {first[0]} in {first[1]}"
