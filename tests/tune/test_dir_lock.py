"""The save-dir lock: one run per folder, a dead holder's lock taken over, the holder named."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from moetune.errors import TuneError
from moetune.tune import dir_lock
from moetune.tune.dir_lock import LOCK_FILENAME, Holder, SaveDirBusy, save_dir_lock

HOLD = """
import sys, time
from pathlib import Path
from moetune.tune.dir_lock import save_dir_lock
with save_dir_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


def dead_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def write_holder(save_dir, host, pid):
    save_dir.mkdir(parents=True, exist_ok=True)
    (save_dir / LOCK_FILENAME).write_text(
        json.dumps({"host": host, "pid": pid, "started": 1764480000.0})
    )


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SaveDirBusy) as exc:
            with save_dir_lock(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder_started(exc.value)))
    assert str(exc.value) == (
        f"{tmp_path} is in use by another moetune run (host {socket.gethostname()}, "
        f"pid {holder.pid}, started {started}); wait for it to finish, or use another --save-dir"
    )
    # Killed (kill -9): the kernel dropped its lock, so the folder is free again.
    with save_dir_lock(tmp_path) as path:
        assert Holder.parse(path.read_text()).pid == os.getpid()
    assert not (tmp_path / LOCK_FILENAME).exists()  # removed when the run ends


def holder_started(error):
    text = str(error)
    stamp = text.split("started ")[1].split(")")[0]
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path):
    write_holder(tmp_path, socket.gethostname(), dead_pid())
    with save_dir_lock(tmp_path) as path:
        assert Holder.parse(path.read_text()).pid == os.getpid()


def test_without_flock_the_recorded_holder_decides(tmp_path, monkeypatch):
    monkeypatch.setattr(dir_lock, "_flock", lambda fd: False)  # a file system without flock
    write_holder(tmp_path, socket.gethostname(), dead_pid())
    with save_dir_lock(tmp_path):  # dead here: taken over
        pass
    write_holder(tmp_path, socket.gethostname(), os.getppid())  # alive here: kept
    with pytest.raises(SaveDirBusy, match=f"pid {os.getppid()}, started"):
        with save_dir_lock(tmp_path):
            pass
    write_holder(tmp_path, "another-host", dead_pid())  # cannot be checked from here: kept
    with pytest.raises(SaveDirBusy, match="host another-host") as exc:
        with save_dir_lock(tmp_path):
            pass
    assert str(exc.value).endswith(f" (if that run is gone, delete {tmp_path / LOCK_FILENAME})")


def test_an_unwritable_save_dir_is_a_one_line_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(TuneError) as exc:
        with save_dir_lock(tmp_path / "file" / "out"):
            pass
    assert str(exc.value) == (
        f"cannot write to the save dir {tmp_path / 'file' / 'out'} (Not a directory); "
        "pass a --save-dir you can write to"
    )


def test_a_symlinked_lock_file_is_refused(tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / LOCK_FILENAME).symlink_to(target)
    with pytest.raises(TuneError, match="is a symlink; remove it and rerun"):
        with save_dir_lock(tmp_path / "out"):
            pass
    assert target.read_text() == "keep me\n"
