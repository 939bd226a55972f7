"""`write_engine_files` into a folder that already holds files: nothing is lost."""

import json

import pytest

from moetune.errors import TuneError
from moetune.kernel.config import Candidate
from moetune.tune.output import write_engine_files
from moetune.tune.problem import TuneProblem

PROBLEM = TuneProblem(8, 7168, 4096, 2, "bf16")
RESULTS = {1: Candidate(16, 64, 128, 1, 4, 3), 64: Candidate(64, 128, 64, 16, 4, 3)}
NAME = "E=8,N=7168,device_name=NVIDIA_H200.json"


def write(folder, notes):
    return write_engine_files(
        RESULTS, PROBLEM, "NVIDIA H200", "3.6.0", folder, ("vllm",), notes=notes
    )


def test_a_different_file_is_kept_as_a_backup_and_a_note_says_so(tmp_path):
    theirs = tmp_path / NAME
    theirs.write_bytes(b'{"1": {"theirs": true}}\n\xff')  # not even UTF-8: kept as it is
    notes = []
    (path,) = write(tmp_path, notes)
    (backup,) = tmp_path.glob(f"{NAME}.bak-*")
    assert backup.read_bytes() == b'{"1": {"theirs": true}}\n\xff'
    assert json.loads(path.read_text())["64"]["BLOCK_SIZE_M"] == 64
    assert notes == [
        f"{NAME} in {tmp_path} differed from the new file: the old one is kept as {backup.name}"
    ]


def test_an_identical_file_is_left_alone(tmp_path):
    (path,) = write(tmp_path, [])
    inode = path.stat().st_ino
    notes = []
    write(tmp_path, notes)
    assert notes == [] and path.stat().st_ino == inode  # not even rewritten
    assert sorted(p.name for p in tmp_path.iterdir()) == [NAME]


def test_a_folder_in_the_way_is_one_line_that_says_the_results_are_kept(tmp_path):
    (tmp_path / NAME).mkdir()
    with pytest.raises(TuneError) as info:
        write(tmp_path, [])
    message = str(info.value)
    assert message.startswith(f"cannot write {tmp_path / NAME}: Is a directory; ")
    assert "rerun the same command" in message and "\n" not in message


@pytest.mark.parametrize(
    "linked", ["configs", "configs/triton_3_6_0", f"configs/triton_3_6_0/{NAME}"]
)
def test_a_symlink_that_appears_under_the_save_dir_is_refused_when_writing(tmp_path, linked):
    # Pre-flight (`check_outputs`) found nothing; the link appears during the tune.
    save_dir, outside = tmp_path / "out", tmp_path / "outside"
    outside.mkdir()
    link = save_dir / linked
    link.parent.mkdir(parents=True, exist_ok=True)
    folder = not linked.endswith(".json")
    if not folder:
        outside = outside / NAME
        outside.write_text("mine")
    link.symlink_to(outside)
    with pytest.raises(TuneError) as info:
        write_engine_files(RESULTS, PROBLEM, "NVIDIA H200", "3.6.0", save_dir, ("sglang",))
    assert str(info.value) == (
        f"cannot write {save_dir / 'configs' / 'triton_3_6_0' / NAME}: {link} is a symlink; "
        f"moetune does not write through it (it would write to {outside}): remove it, or put "
        f"a real {'folder' if folder else 'file'} in its place, and rerun; the measurements "
        "are in the results store: fix this and rerun the same command to write the files"
    )
    if folder:
        assert list(outside.iterdir()) == []
    else:
        assert outside.read_text() == "mine"
        assert sorted(p.name for p in outside.parent.iterdir()) == [NAME]


def test_the_save_dir_itself_may_be_a_symlink(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "out").symlink_to(real)
    (path,) = write(tmp_path / "out", [])
    assert (real / NAME).is_file() and path == tmp_path / "out" / NAME
