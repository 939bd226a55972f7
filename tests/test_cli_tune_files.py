"""`moetune tune` loses neither a file already in --save-dir nor the tuning work (CPU, interpreter).

The tiny bundled model and its 3-candidate space, as in test_cli_tune.py; one batch size.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "tune" / "data"
VLLM_NAME = "E=4,N=32,device_name=NVIDIA_H200.json"
ROW = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 64,
    "GROUP_SIZE_M": 1,
    "num_warps": 8,
    "num_stages": 5,
}


def tune(save_dir, env, cwd, space=DATA / "tiny-space.json", *extra):
    args = [
        *("tune", "--model", str(DATA / "tiny-moe"), "--space", str(space), *extra),
        *("--batch-size", "2", "--engine", "vllm", "--save-dir", str(save_dir)),
        *("--device-name", "NVIDIA H200", "--json"),
    ]
    base = {k: v for k, v in os.environ.items() if k != "SGLANG_MOE_CONFIG_DIR"}
    return subprocess.run(
        [sys.executable, "-m", "moetune", *args],
        capture_output=True,
        text=True,
        env={**base, "PYTHONPATH": str(ROOT), **env},
        cwd=cwd,
    )


@pytest.mark.slow
def test_a_different_file_the_engine_loads_from_save_dir_is_kept_as_a_backup(tmp_path):
    # vLLM loads DIR/<name> today (the plan compares with it), and the tune writes into DIR.
    folder = tmp_path / "engine"
    folder.mkdir()
    theirs = folder / VLLM_NAME
    old = json.dumps({"1": ROW}, indent=2) + "\n"
    theirs.write_text(old)
    env = {"VLLM_TUNED_CONFIG_FOLDER": str(folder)}
    # No confirmation round: the rerun below then writes what the first run wrote, from the
    # store alone (on the CPU's wall clock a confirmation may flip a tie between the runs).
    no_confirmation = ("--confirm-rounds", "0")

    result = tune(folder, env, tmp_path, DATA / "tiny-space.json", *no_confirmation)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    (backup,) = folder.glob(f"{VLLM_NAME}.bak-*")
    assert backup.read_text() == old  # byte for byte
    # The tuned file took its place (its row may be ROW: the file it replaces competes).
    assert list(json.loads(theirs.read_text())) == ["triton_version", "2"]
    (note,) = [n for n in summary["notes"] if "differed from the new file" in n]
    assert note == (
        f"{VLLM_NAME} in {folder} differed from the new file: the old one is kept as {backup.name}"
    )

    # Rewriting moetune's own identical output (everything comes from the store) keeps no copy.
    written = theirs.read_text()
    again = tune(folder, env, tmp_path, DATA / "tiny-space.json", *no_confirmation)
    assert again.returncode == 0, again.stderr
    assert list(folder.glob(f"{VLLM_NAME}.bak-*")) == [backup]
    assert theirs.read_text() == written
    assert not [n for n in json.loads(again.stdout)["notes"] if "differed" in n]


def test_a_space_the_files_cannot_hold_is_refused_before_tuning(tmp_path):
    # num_stages 20 is a valid Candidate but no valid tuned file: the write would fail
    # after the whole tune. The space's schema holds the tuned files' ranges.
    space = tmp_path / "space.json"
    space.write_text(json.dumps([{**ROW, "num_stages": 20}]))
    result = tune(tmp_path / "out", {}, tmp_path, space, "--dry-run")
    assert result.returncode == 1
    assert result.stderr == (
        f"Error: search space {space}: config 1, num_stages: 20 is not an integer from 1 to 16 "
        "(see docs/search-space.md)\n"
    )
