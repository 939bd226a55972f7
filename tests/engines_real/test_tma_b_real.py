"""The release a tune writes the vLLM file for, and its USE_TMA round, with the site's vLLM.

Dry runs of a DeepSeek-V3 TP8 tune (block fp8, the TMA-B path) for the H200 on the CPU:
the plan names the installed release; 0.34's kernel would re-time TMA-B off on a GPU,
which the interpreter has not (the round itself: tests/tune/test_tma_b.py).
"""

import json

import pytest
from click.testing import CliRunner

from moetune.cli import cli
from moetune.engines.installed import find_installed

pytestmark = pytest.mark.engines
ARGS = ["tune", "--model", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--engine", "vllm",
        "--device-name", "NVIDIA_H200", "--batch-size", "1", "--dry-run"]  # fmt: skip


def test_the_vllm_file_is_for_the_installed_release(tmp_path):
    version = find_installed("vllm").version
    result = CliRunner().invoke(cli, [*ARGS, "--save-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"vLLM file:   for vLLM {version} (the installed vLLM's release)" in result.output
    tma_line = "             USE_TMA: not tuned on the CPU (the interpreter has no TMA-B)"
    assert (tma_line in result.output) == (version == "0.34.0")
    result = CliRunner().invoke(
        cli, [*ARGS, "--save-dir", str(tmp_path), "--vllm-release", "0.33.0", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["vllm_release"] == "0.33.0"
