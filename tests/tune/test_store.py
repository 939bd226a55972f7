import json
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest

from moetune.errors import TuneError
from moetune.kernel.config import Candidate
from moetune.tune.store import STORE_FILENAME, Measurement, ResultStore

A = Candidate(16, 64, 128, 1, 4, 3)
B = Candidate(64, 128, 64, 16, 8, 4)
KEY = "E=8,N=7168,K=4096,topk=2,dtype=bf16"


def measurement(
    candidate=A, batch_size=64, fidelity="full", latency=100.0, device="NVIDIA H200", triton="3.6.0"
):
    return Measurement(
        problem_key=KEY,
        batch_size=batch_size,
        candidate=candidate,
        fidelity=fidelity,
        status="ok",
        latency_us=latency,
        p20_us=latency * 0.98,
        p80_us=latency * 1.02,
        compile_s=1.25,
        error=None,
        device_name=device,
        triton_version=triton,
        moetune_version="0.1.0",
        timestamp=1764480000.0,
    )


def lookup(store, m):
    return store.get(
        m.problem_key, m.batch_size, m.candidate, m.fidelity, m.device_name, m.triton_version
    )


def test_add_then_get_and_resume_from_disk(tmp_path):
    store = ResultStore(tmp_path / "results.jsonl")
    first, second = measurement(A), measurement(B, latency=80.0)
    store.add(first)
    store.add(second)
    assert lookup(store, first) == first
    resumed = ResultStore(tmp_path / "results.jsonl")
    assert resumed.all() == [first, second]
    assert lookup(resumed, second) == second
    assert len(resumed) == 2


def test_every_key_field_separates_measurements(tmp_path):
    store = ResultStore(tmp_path / "r.jsonl")
    base = measurement()
    store.add(base)
    for other in (
        measurement(batch_size=128),
        measurement(candidate=B),
        measurement(fidelity="quick"),
        measurement(device="NVIDIA H100 80GB HBM3"),
        measurement(triton="3.5.1"),
    ):
        assert lookup(store, other) is None
    assert (
        store.get("E=8,N=7168,K=2048,topk=2,dtype=bf16", 64, A, "full", "NVIDIA H200", "3.6.0")
        is None
    )


def test_a_failed_candidate_is_a_row(tmp_path):
    store = ResultStore(tmp_path)
    failed = Measurement.failure(
        problem_key=KEY,
        batch_size=64,
        candidate=B,
        fidelity="quick",
        status="out_of_resources",
        error="out of resource: shared memory, Required: 294912, Hardware limit: 232448",
        device_name="NVIDIA H200",
        triton_version="3.6.0",
        moetune_version="0.1.0",
    )
    store.add(failed)
    [row] = ResultStore(tmp_path).all()
    assert row == failed
    assert not row.ok and row.latency_us is None
    assert (tmp_path / STORE_FILENAME).exists()


def test_the_later_line_wins_for_a_repeated_key(tmp_path):
    store = ResultStore(tmp_path / "r.jsonl")
    store.add(measurement(latency=100.0))
    store.add(measurement(latency=90.0))
    assert lookup(ResultStore(tmp_path / "r.jsonl"), measurement()).latency_us == 90.0


def test_a_torn_last_line_is_ignored_with_a_warning_and_cut_before_appending(tmp_path):
    path = tmp_path / "r.jsonl"
    store = ResultStore(path)
    store.add(measurement(A))
    line = json.dumps(measurement(B).to_json())
    with open(path, "a") as handle:
        handle.write(line[: len(line) // 2])  # a kill -9 in the middle of a write
    with pytest.warns(UserWarning, match="torn last line"):
        reopened = ResultStore(path)
    assert reopened.all() == [measurement(A)]
    reopened.add(measurement(B, latency=70.0))
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    assert [json.loads(x)["latency_us"] for x in lines] == [100.0, 70.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(ResultStore(path)) == 2


def test_an_unreadable_middle_line_is_skipped_with_its_line_number(tmp_path):
    path = tmp_path / "r.jsonl"
    good = json.dumps(measurement().to_json())
    path.write_text(good + "\n" + '{"problem_key": 1}\n' + good + "\n")
    with pytest.warns(UserWarning, match=r"r.jsonl:2: skipping an unreadable measurement"):
        store = ResultStore(path)
    assert len(store) == 2


def test_measurement_rejects_unknown_status_and_fidelity():
    with pytest.raises(TuneError, match="status must be one of"):
        Measurement.failure(
            problem_key=KEY,
            batch_size=1,
            candidate=A,
            fidelity="full",
            status="boom",
            error="x",
            device_name="d",
            triton_version="t",
            moetune_version="v",
        )
    with pytest.raises(TuneError, match="fidelity must be one of"):
        measurement(fidelity="slow")


WRITER = """
import sys
from moetune.tune.search.space import default_space
from moetune.tune.store import Measurement, ResultStore
store = ResultStore(sys.argv[1])
for i, c in enumerate(default_space() * 100):
    store.add(Measurement(problem_key="k", batch_size=1, candidate=c, fidelity="quick", status="ok",
        latency_us=float(i), p20_us=None, p80_us=None, compile_s=None, error=None,
        device_name="d", triton_version="t", moetune_version="v", timestamp=0.0))
    if i == 20:
        print("ready", flush=True)
"""


def test_kill_9_loses_at_most_the_line_in_flight(tmp_path):
    path = tmp_path / "r.jsonl"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torn last line is allowed
        rows = ResultStore(path).all()
    assert len(rows) > 20
    # Every complete line is a measurement, in order, none lost before the last one.
    assert [m.latency_us for m in rows] == [float(i) for i in range(len(rows))]
    complete = path.read_bytes().count(b"\n")
    assert len(rows) == complete
