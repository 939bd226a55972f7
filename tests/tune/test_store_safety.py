"""The results store never loses or misreads data: symlinks, wrong types, environment failures."""

import json
import os
import subprocess
import sys
import warnings

import pytest

from moetune.errors import MoetuneWarning, TuneError
from moetune.fileio import LinkedPathError
from moetune.kernel.config import Candidate
from moetune.tune.environment import (
    ENVIRONMENT,
    WorkerEnvironmentError,
    is_environment_error,
    is_environment_failure,
)
from moetune.tune.store import STORE_FILENAME, Measurement, ResultStore

A = Candidate(16, 64, 128, 1, 4, 3)
B = Candidate(64, 128, 64, 16, 8, 4)
KEY = "E=8,N=7168,K=4096,topk=2,dtype=bf16"


def row(config=A, latency=100.0, **changes):
    m = Measurement(
        problem_key=KEY,
        batch_size=64,
        candidate=config,
        fidelity="full",
        status="ok",
        latency_us=latency,
        p20_us=latency,
        p80_us=latency,
        compile_s=1.0,
        error=None,
        device_name="NVIDIA H200",
        triton_version="3.6.0",
        moetune_version="0.1.0",
        timestamp=1764480000.0,
    )
    return {**m.to_json(), **changes}


def line(data):
    return json.dumps(data) + "\n"


def lookup(store, candidate):
    return store.get(KEY, 64, candidate, "full", "NVIDIA H200", "3.6.0")


# --- symlinks --------------------------------------------------------------------------


def test_a_symlinked_store_is_refused_and_its_target_left_alone(tmp_path):
    target = tmp_path / "elsewhere.jsonl"
    content = line(row(A)) + '{"torn": '  # a torn tail the store would cut off
    target.write_text(content)
    save_dir = tmp_path / "run"
    save_dir.mkdir()
    (save_dir / STORE_FILENAME).symlink_to(target)
    with pytest.raises(TuneError) as exc:
        ResultStore(save_dir).add(Measurement.from_json(row(B)))
    assert str(exc.value) == (
        f"the results store {save_dir / STORE_FILENAME} is a symlink; moetune does not follow "
        "it (it would append to and cut the target): replace it with the file itself, or use "
        "another --save-dir"
    )
    assert target.read_text() == content


def test_a_symlink_swapped_in_after_loading_is_not_followed_either(tmp_path):
    store = ResultStore(tmp_path)
    store.add(Measurement.from_json(row(A)))
    target = tmp_path / "target.jsonl"
    target.write_text("precious\n")
    (tmp_path / STORE_FILENAME).unlink()
    (tmp_path / STORE_FILENAME).symlink_to(target)
    with pytest.raises(TuneError, match="is a symlink"):
        store.add(Measurement.from_json(row(B)))
    assert target.read_text() == "precious\n"


def test_a_symlinked_store_lock_is_refused(tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious\n")
    (tmp_path / (STORE_FILENAME + ".lock")).symlink_to(target)
    with pytest.raises(TuneError, match="the results store's lock .* is a symlink"):
        ResultStore(tmp_path)
    assert target.read_text() == "precious\n"


@pytest.mark.parametrize("when", ["loading", "adding"])
def test_a_symlinked_folder_between_the_save_dir_and_the_store_is_refused(tmp_path, when):
    save_dir, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    save_dir.mkdir()
    path = save_dir / "sub" / STORE_FILENAME
    if when == "loading":
        (save_dir / "sub").symlink_to(outside)
        with pytest.raises(LinkedPathError) as exc:
            ResultStore(path, within=save_dir)
    else:
        store = ResultStore(path, within=save_dir)  # nothing there yet
        (save_dir / "sub").symlink_to(outside)  # appears during the tune
        with pytest.raises(LinkedPathError) as exc:
            store.add(Measurement.from_json(row(A)))
    assert str(exc.value).startswith(f"{save_dir / 'sub'} is a symlink; moetune does not write ")
    assert list(outside.iterdir()) == []


def test_the_save_dir_of_a_store_may_itself_be_a_symlink(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "run").symlink_to(real)
    store = ResultStore(tmp_path / "run" / STORE_FILENAME, within=tmp_path / "run")
    store.add(Measurement.from_json(row(A)))
    assert len(ResultStore(real)) == 1


def test_a_store_that_is_a_folder_is_a_one_line_error(tmp_path):
    (tmp_path / "sub" / STORE_FILENAME).mkdir(parents=True)
    with pytest.raises(TuneError, match="is not a regular file"):
        ResultStore(tmp_path / "sub")


# --- wrong types -----------------------------------------------------------------------


def test_a_latency_that_is_not_a_number_is_skipped_naming_its_line_and_kept(tmp_path):
    path = tmp_path / STORE_FILENAME
    text = line(row(A)) + line(row(B, latency_us="fast")) + line(row(B, latency=90.0))
    path.write_text(text)
    with pytest.warns(MoetuneWarning) as caught:
        store = ResultStore(path)
    assert [str(w.message) for w in caught] == [
        f"{path}:2: skipping an unreadable measurement (latency_us must be a number, got "
        "'fast'); skipped lines stay in the file"
    ]
    assert store.skipped == [2]
    assert [m.latency_us for m in store.all()] == [100.0, 90.0]
    store.add(Measurement.from_json(row(A, latency=50.0)))
    assert path.read_text().startswith(text)  # the bad line is still there, untouched


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"batch_size": "64"}, "batch_size must be a positive integer, got '64'"),
        ({"batch_size": True}, "batch_size must be a positive integer, got True"),
        ({"latency_us": 1e999}, "latency_us must be a finite number >= 0, got inf"),
        ({"latency_us": -1}, "latency_us must be a finite number >= 0, got -1.0"),
        ({"compile_s": 10**400}, "compile_s is out of range"),
        ({"status": 3}, "status must be a string, got 3"),
        ({"status": "great"}, "status must be one of"),
        ({"error": ["x"]}, "error must be a string or null"),
        ({"use_tma": "no"}, "use_tma must be true or false"),
        ({"candidate": {"BLOCK_SIZE_M": 16}}, "candidate: config"),
        ({"kind": "pair"}, "a pair probe needs a down config"),
        ({"timestamp": None}, "timestamp must be a number, got None"),
    ],
)
def test_every_field_is_type_checked(tmp_path, changes, reason):
    path = tmp_path / STORE_FILENAME
    path.write_text(line(row(B, **changes)) + line(row(A)))
    with pytest.warns(MoetuneWarning, match=f":1: skipping an unreadable measurement \\({reason}"):
        store = ResultStore(path)
    assert [m.candidate for m in store.all()] == [A]


def test_many_bad_lines_make_one_warning(tmp_path):
    path = tmp_path / STORE_FILENAME
    path.write_text("junk\n" * 9 + line(row(A)))
    with pytest.warns(MoetuneWarning) as caught:
        store = ResultStore(path)
    assert len(caught) == 1
    assert str(caught[0].message).endswith(
        "; 8 more: line 2, 3, 4, 5 and 4 more; skipped lines stay in the file"
    )
    assert store.skipped == list(range(1, 10)) and len(store) == 1


def test_a_whole_last_row_without_its_newline_is_kept_not_cut(tmp_path):
    path = tmp_path / STORE_FILENAME
    text = line(row(A)) + json.dumps(row(B))  # hand-edited: the last newline is gone
    path.write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = ResultStore(path)
    assert len(store) == 2
    added = Measurement.from_json(row(A, latency=1.0))
    store.add(added)
    assert (
        path.read_text() == text + "\n" + json.dumps(added.to_json(), separators=(",", ":")) + "\n"
    )
    assert len(ResultStore(path)) == 3


def test_a_whole_bad_last_line_is_fenced_not_cut(tmp_path):
    path = tmp_path / STORE_FILENAME
    text = line(row(A)) + json.dumps(row(B, latency_us="fast"))
    path.write_text(text)
    with pytest.warns(MoetuneWarning, match=":2: skipping"):
        store = ResultStore(path)
    store.add(Measurement.from_json(row(B)))
    assert path.read_text().startswith(text + "\n")


def test_an_unreadable_store_path_is_a_one_line_error(tmp_path):
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / STORE_FILENAME
    with pytest.raises(TuneError) as exc:
        ResultStore(path)
    assert str(exc.value) == f"cannot read the results store {path}: Not a directory"


# --- environment failures --------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        "ModuleNotFoundError: No module named 'numpy'",
        "ImportError: cannot import name 'x' from 'triton'",
        "RuntimeError: No CUDA GPUs are available",
        "RuntimeError: Found no NVIDIA driver on your system.",
        "AssertionError: Torch not compiled with CUDA enabled",
        "RuntimeError: CUDA error: no CUDA-capable device is detected",
        "RuntimeError: 0 active drivers ([]). There should only be one.",
        "RuntimeError: CUDA error: invalid device ordinal",
    ],
)
def test_machine_errors_are_environment_failures(error):
    assert is_environment_error(error)
    assert is_environment_failure("runtime_error", error)


@pytest.mark.parametrize(
    "error",
    [
        "CompilationError: at 12:4: invalid tile",
        "OutOfResources: out of resource: shared memory, Required: 294912",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "worker process died (exit code 11)",
        "no result within 120 s; worker killed",
    ],
)
def test_config_errors_are_not(error):
    assert not is_environment_error(error)
    assert not is_environment_failure("runtime_error", error)


def test_environment_rows_are_stored_but_never_reused(tmp_path):
    """Old rows (runtime_error + an import error) and new ones (status environment) alike."""
    path = tmp_path / STORE_FILENAME
    old = row(A, status="runtime_error", latency_us=None, p20_us=None, p80_us=None)
    old["error"] = "ModuleNotFoundError: No module named 'numpy'"
    new = {**old, "candidate": B.as_config(), "status": ENVIRONMENT}
    config_failure = {**old, "candidate": Candidate(16, 16, 16, 1, 4, 2).as_config()}
    config_failure["error"] = "RuntimeError: injected fault"
    path.write_text(line(old) + line(new) + line(config_failure))
    store = ResultStore(path)
    assert len(store) == 3  # all kept, readable
    assert lookup(store, A) is None and lookup(store, B) is None  # measured again
    assert lookup(store, Candidate(16, 16, 16, 1, 4, 2)).status == "runtime_error"
    assert [m.environment_failure for m in store.all()] == [True, True, False]
    store.add(Measurement.from_json(row(A)))
    assert lookup(store, A).ok


def test_the_environment_error_is_one_line_saying_what_to_do():
    assert str(WorkerEnvironmentError("ModuleNotFoundError: No module named 'numpy'")) == (
        "the worker cannot run the kernel: No module named 'numpy' (an environment problem, "
        "not a config; install numpy, e.g. with moetune's kernel extra (in the moetune "
        "checkout: pip install -e '.[kernel]'), and rerun)"
    )
    message = str(WorkerEnvironmentError("RuntimeError: No CUDA GPUs are available"))
    assert message.endswith(
        "check the GPU, its driver and --gpus / CUDA_VISIBLE_DEVICES, and rerun)"
    )
    assert "\n" not in message


CHECK_WRITABLE = """
import sys
from moetune.errors import TuneError
from moetune.tune.store import ResultStore
try:
    ResultStore(sys.argv[1]).check_writable()
except TuneError as exc:
    print(exc)
"""


def _as_an_ordinary_user():
    """In a child running as root: lose the right to ignore file modes (PR_CAPBSET_DROP)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        libc.prctl(24, capability, 0, 0, 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux prctl")
def test_a_read_only_store_is_found_before_any_measurement(tmp_path):
    path = tmp_path / STORE_FILENAME
    path.write_text(line(row(A)))
    path.chmod(0o444)
    result = subprocess.run(
        [sys.executable, "-c", CHECK_WRITABLE, str(path)],
        capture_output=True,
        text=True,
        preexec_fn=_as_an_ordinary_user if os.geteuid() == 0 else None,
    )
    assert result.stdout == (
        f"cannot write to the results store {path} (Permission denied); make it writable "
        "or pass another --save-dir\n"
    ), result.stderr
