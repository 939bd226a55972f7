"""`moetune tune`'s pre-flight: what it can refuse without a plan, it refuses before the plan.

A save dir another run holds, no GPU to time on, a bad --space file: each is one
line and exit 1 before the plan is made or printed, and leaves no save dir behind.
"""

from pathlib import Path

import pytest

from moetune.cli import main
from moetune.commands import options
from moetune.tune.dir_lock import save_dir_lock
from moetune.tune.store import STORE_FILENAME

DATA = Path(__file__).parent / "tune" / "data"
# Lines only the plan prints (one layout's plan).
PLAN_LINES = ("Shape:", "Estimate:", "Will write:")


def tune_args(save_dir, *extra):
    return [
        "tune",
        "--model",
        str(DATA / "tiny-moe"),
        "--space",
        str(DATA / "tiny-space.json"),
        "--batch-size",
        "2",
        "--engine",
        "vllm",
        "--save-dir",
        str(save_dir),
        *extra,
    ]


def run_main(capsys, args):
    """Run the CLI in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def error_lines(err):
    return [line for line in err.splitlines() if line.startswith("Error:")]


def no_plan(out, err):
    return not any(line in out + err for line in PLAN_LINES)


@pytest.fixture(autouse=True)
def _no_engine_folders(monkeypatch):
    monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER", raising=False)
    monkeypatch.delenv("SGLANG_MOE_CONFIG_DIR", raising=False)


def test_a_save_dir_another_run_holds_is_refused_before_the_plan(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    save_dir = tmp_path / "out"
    with save_dir_lock(save_dir):  # another run's lock (a second flock in this process)
        code, out, err = run_main(capsys, tune_args(save_dir))
    assert code == 1
    assert len(error_lines(err)) == 1
    assert error_lines(err)[0].startswith(f"Error: {save_dir} is in use by another moetune run")
    assert no_plan(out, err), out
    assert not (save_dir / STORE_FILENAME).exists()


def test_no_gpu_is_refused_before_the_plan_and_leaves_no_save_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(options, "CUDA_DEVICE_FILES", (str(tmp_path / "no-such-device"),))
    code, out, err = run_main(capsys, tune_args(tmp_path / "out"))
    assert code == 1
    assert error_lines(err) == [
        "Error: no CUDA GPU visible: timing needs one (`moetune tune ... --dry-run` shows the "
        "plan without a GPU; TRITON_INTERPRET=1 runs the pipeline on the CPU, for testing only)"
    ]
    assert no_plan(out, err)
    assert not (tmp_path / "out").exists()


def test_with_a_device_file_torch_decides_and_gives_the_same_line(tmp_path, capsys, monkeypatch):
    """A CUDA device file (a driver without a usable GPU) leaves the answer to torch: here
    none is visible, and the line is the same as the one found without asking torch."""
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    device = tmp_path / "nvidiactl"
    device.touch()
    monkeypatch.setattr(options, "CUDA_DEVICE_FILES", (str(device),))
    code, out, err = run_main(capsys, tune_args(tmp_path / "out"))
    assert code == 1
    assert error_lines(err) == [
        "Error: no CUDA GPU visible: timing needs one (`moetune tune ... --dry-run` shows the "
        "plan without a GPU; TRITON_INTERPRET=1 runs the pipeline on the CPU, for testing only)"
    ]
    assert no_plan(out, err)
    assert not (tmp_path / "out").exists()  # its lock was taken and the empty folder removed


def test_gpus_without_a_device_file_is_the_gpus_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(options, "CUDA_DEVICE_FILES", (str(tmp_path / "no-such-device"),))
    code, out, err = run_main(capsys, tune_args(tmp_path / "out", "--gpus", "0,1"))
    assert code == 1
    assert error_lines(err) == [
        "Error: --gpus 0,1: no CUDA GPU is visible here; leave --gpus out (TRITON_INTERPRET=1 "
        "times on the CPU, for testing only)"
    ]
    assert not (tmp_path / "out").exists()


def test_a_bad_space_file_is_refused_before_the_plan(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    space = tmp_path / "space.json"
    space.write_text('{"BLOCK_SIZE_M": [7]}')
    args = tune_args(tmp_path / "out")
    args[args.index("--space") + 1] = str(space)
    code, out, err = run_main(capsys, args)
    assert code == 1
    (line,) = error_lines(err)
    assert line.startswith(f"Error: search space {space}: BLOCK_SIZE_M, item 1: 7 is not a power")
    assert no_plan(out, err)
    assert not (tmp_path / "out").exists()


def test_a_plan_that_fails_after_the_lock_leaves_no_empty_save_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    save_dir = tmp_path / "out"
    code, out, err = run_main(capsys, tune_args(save_dir, "--dtype", "bf16", "--group-size", "64"))
    assert code == 1
    assert error_lines(err) == ["Error: --group-size applies to int4_w4a16, not bf16"]
    assert no_plan(out, err)
    assert not save_dir.exists()


def test_an_existing_save_dir_is_kept_when_the_plan_fails(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    save_dir = tmp_path / "out"
    save_dir.mkdir()
    code, _, _ = run_main(capsys, tune_args(save_dir, "--dtype", "bf16", "--group-size", "64"))
    assert code == 1
    assert save_dir.is_dir()
