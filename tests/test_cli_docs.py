"""docs/cli.md is generated from the CLI's --help; it must match the code."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gen_cli_docs.py"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_docs_match_the_help_text():
    gen = _generator()
    assert gen.DOC.read_text() == gen.render(), "run: python scripts/gen_cli_docs.py"


def test_cli_docs_cover_every_command():
    text = _generator().DOC.read_text()
    for command in ("extract", "check", "tune", "benchmark", "archs", "validate"):
        assert f"## `moetune {command}`" in text
