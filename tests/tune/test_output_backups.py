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
