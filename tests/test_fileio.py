import json
import os
import stat

import pytest

from moetune.fileio import atomic_write_bytes, atomic_write_json, atomic_write_text


def test_atomic_write_replaces_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "sub" / "out.json"
    atomic_write_json(target, {"a": 1})
    atomic_write_json(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    assert os.listdir(target.parent) == ["out.json"]


def test_written_file_has_the_umask_mode_not_0600(tmp_path):
    old = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "x.txt", "hi")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "out.json"
    atomic_write_json(target, {"ok": True})
    with pytest.raises(TypeError):
        atomic_write_json(target, {"bad": object()})
    assert json.loads(target.read_text()) == {"ok": True}
    assert os.listdir(tmp_path) == ["out.json"]


def test_atomic_write_bytes_writes_them_unchanged(tmp_path):
    data = bytes(range(256)) + b"\r\n\x00"
    path = atomic_write_bytes(tmp_path / "plot.png", data)
    assert path.read_bytes() == data
    assert os.listdir(tmp_path) == ["plot.png"]
