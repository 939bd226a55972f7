"""`moetune report` on save dirs that are not as a tune left them: never exit 3, never a
write outside the folder named.

A symlinked ``<save-dir>/report`` (or page, or plot) had the report replace files where it
pointed; a summary.json entry of wrong types (a string batch size or latency, an object as
the problem key, a string as the results) and a lone surrogate in a store row's
device_name exited 3; so did ``report --json > /dev/full``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from moetune.cli import main
from moetune.tune.store import STORE_FILENAME
from moetune.tune.summary_file import SUMMARY_FILENAME

REPO_ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main([*map(str, args)])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def error_line(err):
    lines = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_a_symlinked_report_folder_is_refused_and_its_target_left_alone(capsys, tuned, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "index.html").write_text("mine")
    (tuned / "report").symlink_to(elsewhere)
    code, out, err = run(capsys, "report", tuned)
    assert (code, out) == (1, "")
    assert error_line(err).startswith(
        f"Error: {tuned / 'report'} is a symlink; moetune does not write through it"
    )
    assert sorted(p.name for p in elsewhere.iterdir()) == ["index.html"]
    assert (elsewhere / "index.html").read_text() == "mine"


def test_a_symlinked_page_or_plot_is_refused(capsys, tuned, tmp_path):
    code, _, _ = run(capsys, "report", tuned)
    assert code == 0
    folder = tuned / "report"
    plot = sorted(folder.glob("*.png"))[0]
    for link in (folder / "index.html", plot):
        outside = tmp_path / f"outside-{link.name}"
        outside.write_text("mine")
        link.unlink()
        link.symlink_to(outside)
        code, out, err = run(capsys, "report", tuned)
        assert (code, out) == (1, "")
        assert error_line(err).startswith(f"Error: {link} is a symlink")
        assert outside.read_text() == "mine"
        link.unlink()


def _broken_summary(save_dir, change):
    path = save_dir / SUMMARY_FILENAME
    document = json.loads(path.read_text())
    change(document["shapes"][0])
    path.write_text(json.dumps(document))


def _set_result(field, value):
    def change(entry):
        entry["results"][0][field] = value

    return change


def _set_plan(field, value):
    def change(entry):
        entry["plan"][field] = value

    return change


BROKEN = {
    "string batch size": (_set_result("batch_size", "1"), "results[1].batch_size is '1'"),
    "string latency": (_set_result("latency_us", "fast"), "results[1].latency_us is 'fast'"),
    "negative latency": (_set_result("latency_us", -1.0), "results[1].latency_us is -1.0"),
    "object problem": (_set_plan("problem", {"a": 1}), "plan.problem is {'a': 1}"),
    "surrogate device": (_set_plan("device_name", "H\ud800"), "plan.device_name is 'H\\ud800'"),
    "string results": (lambda e: e.update(results="none"), "results is 'none'"),
    "string baselines": (_set_result("baselines", "x"), "results[1].baselines is 'x'"),
    "bad ceilings": (lambda e: e.update(ceilings={"peak_tflops": "x"}), "ceilings is"),
    "string config": (_set_result("config", "M16"), "results[1].config is 'M16'"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_summary_entry_of_wrong_types_is_a_note_and_rebuilt_from_the_store(capsys, tuned, case):
    change, shown = BROKEN[case]
    _broken_summary(tuned, change)
    code, out, err = run(capsys, "report", tuned, "--json")
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("Note:")]
    assert len(notes) == 1 and "Traceback" not in err
    assert f"{tuned / SUMMARY_FILENAME}: shape 1: {shown}" in notes[0]
    assert notes[0].endswith("; rebuilding it from the store")
    [shape] = json.loads(out)["shapes"]
    assert shape["from"] == "rebuilt from the store and the written files"


def test_a_summary_of_wrong_types_without_a_store_is_one_line_exit_1(capsys, tuned):
    _broken_summary(tuned, _set_result("batch_size", "1"))
    (tuned / STORE_FILENAME).unlink()
    code, out, err = run(capsys, "report", tuned, "--json")
    assert (code, out) == (1, "")
    assert "holds no finished timing to report" in error_line(err)


def test_a_store_row_whose_device_name_is_a_lone_surrogate_is_skipped(capsys, tuned):
    store = tuned / STORE_FILENAME
    row = json.loads(store.read_text().splitlines()[0])
    row["device_name"] = "NVIDIA \ud800"
    with store.open("a") as handle:
        handle.write(json.dumps(row) + "\n")
    (tuned / SUMMARY_FILENAME).unlink()
    code, out, err = run(capsys, "report", tuned, "--json")
    assert code == 0, err
    assert "device_name is not valid Unicode" in err and "Traceback" not in err
    assert all(shape["device_name"] == "NVIDIA H200" for shape in json.loads(out)["shapes"])


def test_report_json_to_a_full_stdout_is_one_line_exit_1(tuned):
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "moetune", "report", str(tuned), "--json"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        )
    assert result.returncode == 1
    assert result.stderr == "Error: cannot write to stdout: No space left on device\n"
