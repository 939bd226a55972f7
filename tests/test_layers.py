"""The package's layers hold: the import-linter contracts of pyproject.toml.

commands > report > tune > extract > engines > kernel > base modules; extraction never
reaches the kernels, the tuner, torch or triton; no import cycle between siblings.
"""

from pathlib import Path

from importlinter import cli as importlinter_cli

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the contracts live in pyproject.toml
    status = importlinter_cli.lint_imports(config_filename=str(ROOT / "pyproject.toml"))
    out = capsys.readouterr().out
    assert "Contracts: 3 kept, 0 broken." in out, out
    assert status == importlinter_cli.EXIT_STATUS_SUCCESS
