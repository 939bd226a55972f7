import json
import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moetune.errors import MoetuneError
from moetune.fileio import (
    LinkedPathError,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    refuse_links_under,
)


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


# --- no write through a symlink below the folder named ---------------------------------


def test_a_linked_folder_or_file_below_the_root_is_refused(tmp_path):
    root, outside = tmp_path / "save", tmp_path / "outside"
    (root / "a").mkdir(parents=True)
    outside.mkdir()
    (root / "a" / "b").symlink_to(outside)
    with pytest.raises(LinkedPathError) as info:
        refuse_links_under(root, root / "a" / "b" / "c" / "f.json")
    assert str(info.value) == (
        f"{root / 'a' / 'b'} is a symlink; moetune does not write through it (it would write "
        f"to {outside}): remove it, or put a real folder in its place, and rerun"
    )
    assert isinstance(info.value, OSError) and isinstance(info.value, MoetuneError)
    (root / "f.json").symlink_to(tmp_path / "gone.json")  # dangling: refused just the same
    with pytest.raises(LinkedPathError, match="put a real file in its place"):
        refuse_links_under(root, root / "f.json")


def test_the_root_itself_and_paths_not_yet_there_are_fine(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "save").symlink_to(real)
    refuse_links_under(tmp_path / "save", tmp_path / "save" / "new" / "deeper" / "f.json")
    refuse_links_under(tmp_path / "save", tmp_path / "save")
    with pytest.raises(ValueError, match="is not under"):
        refuse_links_under(tmp_path / "save", tmp_path / "elsewhere")


@pytest.mark.parametrize("write", [atomic_write_text, atomic_write_bytes])
def test_atomic_write_within_a_root_makes_no_folder_and_writes_nothing_through_a_link(
    tmp_path, write
):
    root, outside = tmp_path / "save", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "configs").symlink_to(outside)
    content = "x" if write is atomic_write_text else b"x"
    with pytest.raises(LinkedPathError):
        write(root / "configs" / "triton" / "f.json", content, within=root)
    assert list(outside.iterdir()) == []
    write(root / "configs" / "triton" / "f.json", content)  # without `within`: followed
    assert (outside / "triton" / "f.json").exists()


def test_atomic_write_within_a_root_refuses_a_linked_file_and_keeps_its_target(tmp_path):
    target = tmp_path / "theirs.json"
    target.write_text("theirs")
    (tmp_path / "save").mkdir()
    (tmp_path / "save" / "f.json").symlink_to(target)
    with pytest.raises(LinkedPathError):
        atomic_write_json(tmp_path / "save" / "f.json", {"a": 1}, within=tmp_path / "save")
    assert target.read_text() == "theirs" and (tmp_path / "save" / "f.json").is_symlink()


# Each component below the root: a real folder, a link to a real folder, a dangling link,
# a regular file, or nothing.
COMPONENTS = st.lists(
    st.sampled_from(["dir", "link", "dangling", "file", "missing"]), min_size=1, max_size=5
)


@settings(max_examples=60, deadline=None)
@given(COMPONENTS)
def test_refused_exactly_when_an_existing_component_is_a_link(kinds):
    with tempfile.TemporaryDirectory() as temp:
        base = Path(temp)
        root, real = base / "root", base / "real"
        root.mkdir()
        real.mkdir()
        current, expected = root, None
        for index, kind in enumerate(kinds):
            current = current / f"c{index}"
            if kind == "dir":
                current.mkdir()
            elif kind == "link":
                (real / f"c{index}").mkdir()
                current.symlink_to(real / f"c{index}")
            elif kind == "dangling":
                current.symlink_to(base / f"gone{index}")
            elif kind == "file":
                current.write_text("")
            if kind in ("link", "dangling") and expected is None:
                expected = current
            if kind in ("dangling", "file", "missing"):
                break  # nothing can lie below it
        path = current / "leaf.json"
        if expected is None:
            refuse_links_under(root, path)
        else:
            with pytest.raises(LinkedPathError) as info:
                refuse_links_under(root, path)
            assert info.value.filename == str(expected)
