"""The package's layers hold: the import-linter contracts of pyproject.toml.

commands > report > tune > extract > engines > kernel > base modules; extraction never
reaches the kernels, the tuner, torch or triton; no import cycle between siblings. Run in
its own process: import-linter configures logging, which other tests read.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = (
    "import sys; from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(config_filename='pyproject.toml'))"
)


def test_the_import_contracts_hold():
    result = subprocess.run(
        [sys.executable, "-c", LINT], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert "Contracts: 3 kept, 0 broken." in result.stdout, result.stdout + result.stderr
    assert result.returncode == 0
