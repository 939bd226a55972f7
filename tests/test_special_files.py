"""Special files given as inputs: refused in one line at once, never read without bound.

A FIFO with no writer hung every command that read one (--model, --mappings,
$MOETUNE_MAPPINGS, --space, --routing, benchmark --config, a FIFO named
measurements.jsonl in the save dir while the tune held its lock); a --model linked to
/dev/zero read until memory ran out; a directory named measurements.jsonl got the
store nested inside it. Each command runs as a subprocess under `timeout` (and a memory
bound), so that a regression fails instead of hanging CI.
"""

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from moetune.errors import MoetuneError
from moetune.fileio import InputFileError, open_input, read_input_bytes, read_input_text

REPO_ROOT = Path(__file__).resolve().parent.parent
TINY_MOE = REPO_ROOT / "tests" / "tune" / "data" / "tiny-moe"
HANG_S = 60  # far above the second or two a refusal takes, far below CI's patience
MEMORY_BOUND = 3 << 30


def _bound_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BOUND, MEMORY_BOUND))


def moetune(*args, env=None, cwd=None):
    """Run `python -m moetune ARGS` offline; (exit code, stdout, stderr)."""
    environment = {
        "PYTHONPATH": str(REPO_ROOT),
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": "/nonexistent-hf-home",
        "PATH": "/usr/bin:/bin",
        "TRITON_INTERPRET": "1",
        **(env or {}),
    }
    result = subprocess.run(
        [sys.executable, "-m", "moetune", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=environment,
        cwd=cwd,
        preexec_fn=_bound_memory,
    )
    return result.returncode, result.stdout, result.stderr


def error_line(err):
    lines = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def fifo(tmp_path):
    def make(name="input"):
        path = tmp_path / name
        os.mkfifo(path)
        return path

    return make


# --- the helper every reader uses -------------------------------------------------


def test_open_input_refuses_a_fifo_without_waiting_for_a_writer(fifo):
    path = fifo()
    with pytest.raises(InputFileError) as info:
        open_input(path)
    assert isinstance(info.value, OSError) and isinstance(info.value, MoetuneError)
    assert info.value.strerror == "a named pipe (FIFO), not a regular file"
    assert str(info.value) == f"{path}: a named pipe (FIFO), not a regular file"


@pytest.mark.parametrize(
    ("target", "kind"),
    [("/dev/zero", "a character device"), ("/dev/null", "a character device"), (".", "dir")],
)
def test_open_input_refuses_devices_and_directories_even_through_a_link(tmp_path, target, kind):
    link = tmp_path / "config.json"
    link.symlink_to(tmp_path if target == "." else target)
    with pytest.raises(InputFileError) as info:
        read_input_bytes(link)
    expected = "a directory" if kind == "dir" else kind
    assert info.value.strerror == f"{expected}, not a regular file"


def test_read_input_bounds_the_size(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b" " * 2049)
    with pytest.raises(InputFileError) as info:
        read_input_bytes(path, limit=2048)
    assert info.value.errno == errno.EFBIG
    assert "2,049 bytes, more than the 2,048 bytes such a file can be" in str(info.value)
    assert read_input_bytes(path, limit=4096) == b" " * 2049


def test_a_link_to_a_regular_file_is_read(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert read_input_text(link) == "{}"


def test_a_missing_file_is_the_usual_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_input_bytes(tmp_path / "absent.json")


# --- every command that reads an input file ---------------------------------------


def test_extract_refuses_a_fifo_as_model(fifo):
    path = fifo("config.json")
    code, out, err = moetune("extract", "--model", path)
    assert (code, out) == (1, "")
    assert error_line(err) == f"Error: cannot read {path}: a named pipe (FIFO), not a regular file"


def test_extract_refuses_a_model_linked_to_dev_zero(tmp_path):
    link = tmp_path / "config.json"
    link.symlink_to("/dev/zero")
    code, out, err = moetune("extract", "--model", link)
    assert (code, out) == (1, "")
    assert "a character device, not a regular file" in error_line(err)


def test_extract_refuses_a_model_folder_whose_config_is_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "config.json")
    code, _, err = moetune("extract", "--model", tmp_path)
    assert code == 1
    assert "a named pipe (FIFO), not a regular file" in error_line(err)


def test_mappings_fifo_given_as_option_or_environment_is_refused(fifo):
    path = fifo("m.yaml")
    expected = f"Error: {path}: cannot read mappings file (a named pipe (FIFO), not a regular file)"
    code, _, err = moetune("extract", "--model", TINY_MOE, "--mappings", path)
    assert (code, error_line(err)) == (1, expected)
    code, _, err = moetune("extract", "--model", TINY_MOE, env={"MOETUNE_MAPPINGS": str(path)})
    assert (code, error_line(err)) == (1, expected)
    code, _, err = moetune("validate", path)
    assert code == 1 and "a named pipe (FIFO), not a regular file" in err


def test_tune_refuses_a_fifo_as_space(fifo, tmp_path):
    path = fifo("space.yaml")
    code, _, err = moetune(
        "tune", "--model", TINY_MOE, "--dry-run", "--space", path, "--save-dir", tmp_path / "out"
    )
    assert code == 1
    assert error_line(err) == (
        f"Error: cannot read search space {path}: a named pipe (FIFO), not a regular file"
    )


@pytest.mark.parametrize("suffix", [".npy", ".pt"])
def test_tune_refuses_a_fifo_as_routing_dump(fifo, tmp_path, suffix):
    path = fifo("routing" + suffix)
    code, _, err = moetune(
        "tune", "--model", TINY_MOE, "--dry-run", "--routing", path, "--save-dir", tmp_path / "out"
    )
    assert code == 1
    assert error_line(err) == (
        f"Error: {path}: cannot read a routing dump: a named pipe (FIFO), not a regular file"
    )


def test_benchmark_refuses_a_fifo_as_config(fifo):
    path = fifo("E=4,N=32,device_name=NVIDIA_H200.json")
    code, _, err = moetune("benchmark", "--model", TINY_MOE, "--dry-run", "--config", path)
    assert code == 1
    assert error_line(err) == (
        f"Error: {path}: cannot read a tuned config: a named pipe (FIFO), not a regular file"
    )


@pytest.mark.parametrize("make", [os.mkfifo, os.mkdir])
def test_tune_refuses_a_store_that_is_a_fifo_or_a_folder(tmp_path, make):
    save_dir = tmp_path / "out"
    save_dir.mkdir()
    make(save_dir / "measurements.jsonl")
    code, _, err = moetune(
        "tune", "--model", TINY_MOE, "--save-dir", save_dir, "--batch-size", "1", "--search", "fast"
    )
    assert code == 1
    assert error_line(err) == (
        f"Error: the results store {save_dir / 'measurements.jsonl'} is not a regular file; "
        "move it away"
    )
    assert sorted(p.name for p in save_dir.iterdir()) == ["measurements.jsonl"]
    if (save_dir / "measurements.jsonl").is_dir():
        assert list((save_dir / "measurements.jsonl").iterdir()) == []


def test_report_notes_a_fifo_named_summary_json_and_does_not_hang(tmp_path):
    save_dir = tmp_path / "out"
    save_dir.mkdir()
    (save_dir / "measurements.jsonl").write_text("")
    os.mkfifo(save_dir / "summary.json")
    code, out, err = moetune("report", save_dir, "--json")
    assert (code, out) == (1, "")
    assert "summary.json: a named pipe (FIFO), not a regular file" in err
    assert "Traceback" not in err
