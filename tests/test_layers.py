"""The package's layers hold: the import-linter contracts of pyproject.toml.

commands > report > tune > extract > engines > kernel > base modules; extraction never
reaches the kernels, the tuner, torch or triton; no import cycle between siblings. Run in
its own process: import-linter configures logging, which other tests read.
"""

import re
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


def test_the_contracts_count_type_checking_imports():
    """An import under ``if TYPE_CHECKING:`` is still an import up the layers (it once closed
    the circle engines/formats -> engines/names -> extract/quant -> engines/formats)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[tool.importlinter]", 1)[1].split("[[", 1)[0]
    settings = re.findall(r"^exclude_type_checking_imports\s*=\s*(\w+)", section, re.M)
    assert settings in ([], ["false"]), settings  # import-linter's default counts them
