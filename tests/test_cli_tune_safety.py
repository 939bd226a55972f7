"""`moetune tune` on bad machines and bad folders: one line and nothing lost, never a crash.

CPU tunes of the tiny bundled model (tests/tune/data/tiny-moe) under the
Triton interpreter, as in test_cli_tune.py; errors that stop a run before any
work are checked in-process through `moetune.cli.main`.
"""

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moetune.cli import main
from moetune.engines.names import installed_triton_version
from moetune.kernel.config import Candidate
from moetune.tune.dir_lock import LOCK_FILENAME
from moetune.tune.measure.worker import FAULTS_ENV
from moetune.tune.problem import TuneProblem
from moetune.tune.store import STORE_FILENAME, Measurement, ResultStore

DATA = Path(__file__).parent / "tune" / "data"
# The store key of the tiny model's problem on moetune's twin of vLLM's kernel (no engine here).
KEY = TuneProblem(4, 32, 64, 2, "bf16").key()
# The three candidates of tiny-space.json, in its order.
SPACE = [
    Candidate(16, 32, 32, 1, 4, 2),
    Candidate(16, 64, 64, 1, 4, 2),
    Candidate(16, 32, 64, 1, 4, 3),
]
# One batch size, the vLLM file only: the 3 candidates and vLLM's fallback config.
MEASUREMENTS = 4


def tune_args(save_dir, *extra):
    return [
        "tune",
        "--model",
        str(DATA / "tiny-moe"),
        "--space",
        str(DATA / "tiny-space.json"),
        "--batch-size",
        "2",
        "--search",
        "exhaustive",
        "--engine",
        "vllm",
        "--save-dir",
        str(save_dir),
        "--device-name",
        "NVIDIA H200",
        *extra,
    ]


def run_main(capsys, args):
    """Run the CLI in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def last_line(text):
    return [line for line in text.splitlines() if line.strip()][-1]


def moetune(args, env=None, **kwargs):
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VLLM_TUNED_CONFIG_FOLDER", "SGLANG_MOE_CONFIG_DIR")
    }
    return subprocess.run(
        [sys.executable, "-m", "moetune", *args],
        capture_output=True,
        text=True,
        env={**base, "TRITON_INTERPRET": "1", **(env or {})},
        **kwargs,
    )


@pytest.fixture(autouse=True)
def _no_engine_folders(monkeypatch):
    monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER", raising=False)
    monkeypatch.delenv("SGLANG_MOE_CONFIG_DIR", raising=False)


# --- 1. an environment failure is not a config outcome ---------------------------------


def test_a_missing_module_stops_the_tune_in_one_line_and_the_rerun_measures_again(tmp_path):
    # A Python without numpy, as a fresh venv was before numpy joined the kernel extra.
    shim = tmp_path / "no-numpy"
    shim.mkdir()
    (shim / "numpy.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n"
    )
    pythonpath = os.pathsep.join([str(shim), *filter(None, [os.environ.get("PYTHONPATH")])])
    save_dir = tmp_path / "out"
    broken = moetune(tune_args(save_dir), env={"PYTHONPATH": pythonpath})
    assert broken.returncode == 1, broken.stderr
    assert last_line(broken.stderr) == (
        "Error: the worker cannot run the kernel: No module named 'numpy' (an environment "
        "problem, not a config; install numpy, e.g. with moetune's kernel extra (in the "
        "moetune checkout: pip install -e '.[kernel]'), and rerun)"
    )
    rows = ResultStore(save_dir).all()
    assert [m.status for m in rows] == ["environment"]  # stopped at the first one

    fixed = moetune(tune_args(save_dir, "--json"))
    assert fixed.returncode == 0, fixed.stderr
    summary = json.loads(fixed.stdout)
    assert (summary["reused"], summary["measured"]) == (0, MEASUREMENTS)


# --- 2. a symlinked store is not followed ----------------------------------------------


def test_a_symlinked_store_is_refused_and_its_target_untouched(tmp_path, capsys):
    target = tmp_path / "elsewhere.jsonl"
    target.write_text('{"not": "a measurement"}\n{"torn": ')
    save_dir = tmp_path / "out"
    save_dir.mkdir()
    (save_dir / STORE_FILENAME).symlink_to(target)
    code, _, err = run_main(capsys, tune_args(save_dir))
    assert code == 1
    assert last_line(err) == (  # the rule for every link under the save dir, before any work
        f"Error: {save_dir / STORE_FILENAME} is a symlink; moetune does not write through it "
        f"(it would write to {target}): remove it, or put a real file in its place, and rerun"
    )
    assert target.read_text() == '{"not": "a measurement"}\n{"torn": '


# --- 3. one tune at a time per save dir ------------------------------------------------


def test_a_second_tune_on_the_same_save_dir_exits_1_naming_the_first(tmp_path, capsys):
    save_dir = tmp_path / "out"
    first = subprocess.Popen(
        [sys.executable, "-m", "moetune", *tune_args(save_dir, "--timeout", "600")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TRITON_INTERPRET": "1", FAULTS_ENV: "hang:BLOCK_SIZE_K=32"},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        lock = save_dir / LOCK_FILENAME
        while time.monotonic() < deadline and first.poll() is None:
            if lock.exists() and str(first.pid) in lock.read_text():
                break
            time.sleep(0.1)
        else:
            time.sleep(5)  # no lock file (before the fix): let the first tune get going
        assert first.poll() is None
        code, _, err = run_main(capsys, tune_args(save_dir))
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert code == 1, err
    line = last_line(err)
    assert line.startswith(f"Error: {save_dir} is in use by another moetune run (host ")
    assert f", pid {first.pid}, started " in line
    assert line.endswith("; wait for it to finish, or use another --save-dir")
    assert not (save_dir / STORE_FILENAME).exists()  # the second one measured nothing


# --- 5. bad values give one line -------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "0", "1e300"])
@pytest.mark.parametrize("command", ["tune", "benchmark"])
def test_a_timeout_that_is_not_a_finite_positive_number_is_a_usage_error(
    tmp_path, capsys, command, value
):
    args = (
        tune_args(tmp_path)
        if command == "tune"
        else ["benchmark", "--model", str(DATA / "tiny-moe")]
    )
    code, _, err = run_main(capsys, [*args, "--timeout", value])
    assert code == 2, err
    assert "Invalid value for '--timeout'" in err and "Traceback" not in err
    assert not tmp_path.joinpath(STORE_FILENAME).exists()


@pytest.mark.parametrize("command", ["tune", "benchmark"])
def test_gpus_that_are_not_gpu_ids_are_a_usage_error(tmp_path, capsys, command):
    args = (
        tune_args(tmp_path)
        if command == "tune"
        else ["benchmark", "--model", str(DATA / "tiny-moe")]
    )
    code, _, err = run_main(capsys, [*args, "--gpus", "abc"])
    assert code == 2, err
    assert last_line(err) == (
        "Error: Invalid value for '--gpus': 'abc' is not a GPU index (0, 1, ...) "
        "or a GPU-/MIG- UUID"
    )


def test_gpus_on_a_machine_without_cuda_is_one_line_before_any_work(tmp_path, capsys):
    code, _, err = run_main(capsys, tune_args(tmp_path / "out", "--gpus", "0"))
    assert code == 1
    assert last_line(err) == (
        "Error: --gpus 0: no CUDA GPU is visible here; leave --gpus out (TRITON_INTERPRET=1 "
        "times on the CPU, for testing only)"
    )
    assert not (tmp_path / "out").exists()


def _drop_file_permission_override():
    """In the child, as root: lose the right to ignore file modes (as any other user has)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        libc.prctl(24, capability, 0, 0, 0)  # PR_CAPBSET_DROP; exec then lacks them


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux prctl")
def test_a_read_only_save_dir_fails_before_the_first_measurement(tmp_path):
    save_dir = tmp_path / "read-only"
    save_dir.mkdir()
    save_dir.chmod(0o555)
    try:
        result = moetune(
            tune_args(save_dir),
            preexec_fn=_drop_file_permission_override if os.geteuid() == 0 else None,
            timeout=300,
        )
    finally:
        save_dir.chmod(0o755)
    assert result.returncode == 1, result.stderr
    assert last_line(result.stderr) == (
        f"Error: cannot write to the save dir {save_dir} (Permission denied); "
        "pass a --save-dir you can write to"
    )
    assert "tuning" not in result.stderr  # stopped before the progress bar, before any work
    assert list(save_dir.iterdir()) == []


def test_a_store_line_of_the_wrong_type_is_skipped_naming_it_and_kept(tmp_path):
    rows = [
        Measurement(
            problem_key=KEY,
            batch_size=2,
            candidate=candidate,
            fidelity="full",
            status="ok",
            latency_us=latency,
            p20_us=latency,
            p80_us=latency,
            compile_s=0.5,
            error=None,
            device_name="NVIDIA H200",
            triton_version=installed_triton_version() or "unknown",
            moetune_version="0.1.0",
            timestamp=1764480000.0,
        ).to_json()
        for candidate, latency in zip(SPACE, (900.0, 800.0, 700.0), strict=True)
    ]
    rows[1]["latency_us"] = "fast"
    store = tmp_path / STORE_FILENAME
    text = "".join(json.dumps(row) + "\n" for row in rows)
    store.write_text(text)
    result = moetune(tune_args(tmp_path, "--json"))
    assert result.returncode == 0, result.stderr
    assert (
        f"Warning: {store}:2: skipping an unreadable measurement (latency_us must be a "
        "number, got 'fast'); skipped lines stay in the file\n"
    ) in result.stderr
    summary = json.loads(result.stdout)
    # The two good rows are reused; the bad one's candidate and vLLM's fallback are measured.
    assert (summary["reused"], summary["measured"]) == (2, 2)
    assert store.read_text().startswith(text)  # the bad line is still there, untouched


# --- 6. nothing is written through a symlink under the save dir, or over a linked --install target


# The tiny model's vLLM file name (as the plan's "Will write:" names it).
VLLM_FILE = "E=4,N=32,device_name=NVIDIA_H200.json"


def _outside(tmp_path, folder):
    """Where a link under the save dir points: a folder, or a file holding "mine"."""
    outside = tmp_path / "outside"
    if folder:
        outside.mkdir()
    else:
        outside.write_text("mine")
    return outside


def _untouched(outside, folder):
    if folder:
        return list(outside.iterdir()) == []
    return outside.read_text() == "mine"


@pytest.mark.parametrize(
    "linked",
    [
        "configs",  # SGLang's engine folder (configs/triton_X_Y_Z/)
        VLLM_FILE,
        "summary.json",
        "summary.json.lock",
        STORE_FILENAME + ".lock",
    ],
)
def test_a_symlink_under_the_save_dir_is_refused_before_any_work(tmp_path, capsys, linked):
    folder = linked == "configs"
    outside = _outside(tmp_path, folder)
    save_dir = tmp_path / "out"
    save_dir.mkdir()
    (save_dir / linked).symlink_to(outside)
    args = tune_args(save_dir, "--engine", "both", "--confirm-rounds", "0")
    code, _, err = run_main(capsys, args)
    assert code == 1, err
    assert last_line(err) == (
        f"Error: {save_dir / linked} is a symlink; moetune does not write through it (it would "
        f"write to {outside}): remove it, or put a real {'folder' if folder else 'file'} in its "
        "place, and rerun"
    )
    assert "Traceback" not in err
    assert _untouched(outside, folder)
    assert sorted(p.name for p in save_dir.iterdir()) == [linked]  # no store: before any work


def test_a_dry_run_names_the_symlink_too(tmp_path, capsys):
    outside = _outside(tmp_path, folder=True)
    save_dir = tmp_path / "out"
    save_dir.mkdir()
    (save_dir / "configs").symlink_to(outside)
    code, _, err = run_main(capsys, tune_args(save_dir, "--engine", "sglang", "--dry-run"))
    assert code == 1, err
    assert last_line(err).startswith(f"Error: {save_dir / 'configs'} is a symlink; ")


def _install_args(save_dir, engine_dir):
    return tune_args(
        save_dir, "--confirm-rounds", "0", "--install", "vllm", "--install-dir", str(engine_dir)
    )


def test_a_dangling_install_target_is_refused_before_tuning(tmp_path, capsys):
    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    gone = tmp_path / "gone.json"
    link = engine_dir / VLLM_FILE
    link.symlink_to(gone)
    save_dir = tmp_path / "out"
    code, _, err = run_main(capsys, _install_args(save_dir, engine_dir))
    assert code == 1, err
    assert last_line(err) == (
        f"Error: {link} is a dangling symlink (to {gone}); moetune does not replace it "
        "unasked: remove it, or point it at a file, and rerun"
    )
    assert link.is_symlink() and not gone.exists()
    assert not (save_dir / STORE_FILENAME).exists()  # refused before the first measurement


def test_an_install_target_linked_to_a_real_file_is_refused_before_tuning(tmp_path, capsys):
    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    real = tmp_path / "real.json"
    real.write_text('{"1": {}}\n')
    link = engine_dir / VLLM_FILE
    link.symlink_to(real)
    save_dir = tmp_path / "out"
    code, _, err = run_main(capsys, [*_install_args(save_dir, engine_dir), "--overwrite-installed"])
    assert code == 1, err
    assert last_line(err) == (
        f"Error: {link} is a symlink (to {real}); moetune does not replace a link with its own "
        "file: remove it and rerun, or pass another --install-dir"
    )
    assert link.is_symlink() and real.read_text() == '{"1": {}}\n'
    assert not (save_dir / STORE_FILENAME).exists()


@pytest.mark.parametrize("named_by", ["--install-dir", "$VLLM_TUNED_CONFIG_FOLDER"])
def test_a_dangling_install_folder_is_refused_before_tuning(
    tmp_path, capsys, monkeypatch, named_by
):
    gone = tmp_path / "gone"
    link = tmp_path / "engine"
    link.symlink_to(gone)
    save_dir = tmp_path / "out"
    if named_by == "--install-dir":
        args = _install_args(save_dir, link)
    else:
        monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(link))
        args = tune_args(save_dir, "--confirm-rounds", "0", "--install", "vllm")
    code, _, err = run_main(capsys, args)
    assert code == 1, err
    assert last_line(err) == (
        f"Error: --install vllm: {link} is a dangling symlink (to {gone}); moetune does not "
        "replace it unasked: remove it, or point it at a folder, and rerun"
    )
    assert link.is_symlink() and not gone.exists()
    assert not (save_dir / STORE_FILENAME).exists()
