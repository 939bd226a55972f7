"""summary.json: a finished tune's summary kept in its save dir for `moetune report`."""

import json
from pathlib import Path

import pytest

from moetune.device import DeviceLimits
from moetune.fileio import LinkedPathError
from moetune.kernel.config import Candidate
from moetune.tune.baselines import Baseline
from moetune.tune.problem import TuneProblem
from moetune.tune.runner import BatchResult, TuneRequest, TuneSummary, make_plan
from moetune.tune.search.space import load_space
from moetune.tune.summary_file import (
    SUMMARY_FILENAME,
    SummaryFileError,
    read_summary_file,
    record_summary,
)

DATA = Path(__file__).parent / "data"
PROBLEM = TuneProblem(4, 32, 64, 2, "bf16")
A = Candidate(16, 32, 32, 1, 4, 2)
FALLBACK = Candidate(16, 64, 64, 1, 4, 2)


def finished(save_dir, problem=PROBLEM, device="NVIDIA H200"):
    """A TuneSummary as `run_tune` returns it, without a GPU."""
    request = TuneRequest(
        problem=problem,
        batch_sizes=(2, 4),
        space=tuple(load_space(DATA / "tiny-space.json")),
        save_dir=save_dir,
        engines=("vllm",),
        device_name=device,
        triton_version="3.6.0",
        source="tiny-moe, TP1 bf16",
    )
    plan = make_plan(request, DeviceLimits.h200())
    summary = TuneSummary(plan)
    summary.baselines = [
        Baseline("vllm_fallback", "vLLM fallback", "get_default_config", {2: FALLBACK, 4: None})
    ]
    summary.rows = [
        BatchResult(2, A, 10.0, 5.0, 0, 0.001, {"vllm_fallback": 12.5}),
        BatchResult(4, A, 20.0, None, 1, 0.002, {"vllm_fallback": None}),
    ]
    summary.files = [save_dir / plan.files[0].name]
    summary.notes = ["M=4: vLLM fallback has no runnable config; not timed"]
    return summary


def test_a_finished_tune_is_kept_with_its_baselines_floor_and_files(tmp_path):
    path = record_summary(finished(tmp_path))
    assert path == tmp_path / SUMMARY_FILENAME
    [entry] = read_summary_file(tmp_path)
    assert entry["plan"]["shape_key"] == "E=4,N=32,K=64,topk=2,dtype=bf16"
    assert entry["plan"]["device_name"] == "NVIDIA H200"
    assert entry["files"] == ["E=4,N=32,device_name=NVIDIA_H200.json"]  # relative: dirs move
    assert entry["engines"] == ["vllm"] and entry["source"] == "tiny-moe, TP1 bf16"
    first, second = entry["results"]
    assert (first["latency_us"], first["floor_us"]) == (10.0, 5.0)
    assert first["baselines"]["vllm_fallback"] == {
        "config": FALLBACK.as_config(),
        "latency_us": 12.5,
        "speedup": 1.25,
        # No confirmation round in this summary: the search's timings, no intervals.
        "search_latency_us": 12.5,
        "latency_interval_us": None,
        "speedup_interval": None,
    }
    assert first["confirmation"] is None and entry["confirmation"] is None
    assert second["baselines"]["vllm_fallback"]["latency_us"] is None
    assert second["verified_rank"] == 1
    assert entry["baselines"] == [
        {"key": "vllm_fallback", "label": "vLLM fallback", "source": "get_default_config"}
    ]
    assert entry["notes"] == ["M=4: vLLM fallback has no runnable config; not timed"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_another_shape_is_added_and_a_rerun_replaces_its_own_entry(tmp_path):
    record_summary(finished(tmp_path))
    record_summary(finished(tmp_path, problem=TuneProblem(8, 32, 64, 2, "bf16")))
    record_summary(finished(tmp_path, device="NVIDIA H100 80GB HBM3"))
    rerun = finished(tmp_path)
    rerun.rows[0] = BatchResult(2, A, 9.0, 5.0, 0, 0.001, {"vllm_fallback": 12.5})
    record_summary(rerun)
    entries = read_summary_file(tmp_path)
    keys = [(e["plan"]["problem"][:4], e["plan"]["device_name"]) for e in entries]
    assert keys == [
        ("E=8,", "NVIDIA H200"),
        ("E=4,", "NVIDIA H100 80GB HBM3"),
        ("E=4,", "NVIDIA H200"),
    ]
    assert entries[-1]["results"][0]["latency_us"] == 9.0


def test_an_unreadable_summary_is_kept_aside_not_lost(tmp_path):
    (tmp_path / SUMMARY_FILENAME).write_text("{not json")
    with pytest.raises(SummaryFileError, match="is not valid JSON"):
        read_summary_file(tmp_path)
    record_summary(finished(tmp_path))
    assert len(read_summary_file(tmp_path)) == 1
    [aside] = tmp_path.glob(f"{SUMMARY_FILENAME}.unreadable-*")
    assert aside.read_text() == "{not json"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[]", "is not a moetune tune summary"),
        ('{"format": "moetune-tune-summary", "version": 99, "shapes": []}', "format version 99"),
        ('{"format": "moetune-tune-summary", "version": 1}', "has no list of shapes"),
        ('{"format": "moetune-tune-summary", "version": 1, "shapes": [{}]}', "shape 1 has no plan"),
    ],
)
def test_a_file_of_another_format_is_refused_in_one_line(tmp_path, content, message):
    (tmp_path / SUMMARY_FILENAME).write_text(content)
    with pytest.raises(SummaryFileError, match=message) as error:
        read_summary_file(tmp_path)
    assert "\n" not in str(error.value)


def test_no_summary_file_reads_as_no_entries(tmp_path):
    assert read_summary_file(tmp_path) == []


def test_the_entry_is_the_tunes_json(tmp_path):
    """The same keys as `moetune tune --json`, so scripts read both alike."""
    from moetune.tune.runner import summary_json

    summary = finished(tmp_path)
    record_summary(summary)
    [entry] = json.loads((tmp_path / SUMMARY_FILENAME).read_text())["shapes"]
    assert set(summary_json(summary)) <= set(entry)


@pytest.mark.parametrize("linked", [SUMMARY_FILENAME, SUMMARY_FILENAME + ".lock"])
def test_a_symlinked_summary_or_lock_is_refused_and_its_target_untouched(tmp_path, linked):
    save_dir, outside = tmp_path / "out", tmp_path / "outside.json"
    save_dir.mkdir()
    outside.write_text("mine")
    (save_dir / linked).symlink_to(outside)
    with pytest.raises(LinkedPathError) as info:
        record_summary(finished(save_dir))
    assert str(info.value) == (
        f"{save_dir / linked} is a symlink; moetune does not write through it (it would write "
        f"to {outside}): remove it, or put a real file in its place, and rerun"
    )
    assert isinstance(info.value, OSError)  # the runner keeps the tune, adding a note
    assert outside.read_text() == "mine"
    assert sorted(p.name for p in save_dir.iterdir()) == [linked]
