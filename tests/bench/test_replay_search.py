"""bench/replay_search.py on a store filled by an exhaustive sweep of the synthetic GPU."""

import sys
from dataclasses import replace
from pathlib import Path

import replay_search as replay  # bench/ is on sys.path (conftest.py)

from moetune.device import DeviceLimits
from moetune.tune.problem import TuneProblem
from moetune.tune.search.space import default_space, prune
from moetune.tune.search.strategy import exhaustive_search
from moetune.tune.store import ResultStore

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "tune"))
from synthetic import SyntheticGPU  # noqa: E402


def test_replay_reports_the_gap_to_the_exhaustive_best(tmp_path, capsys):
    problem = TuneProblem(128, 768, 2048, 8, "bf16")
    assert replay.problem_from_key(problem.key()) == problem
    block = TuneProblem(256, 256, 7168, 8, "fp8_w8a8", (128, 128))
    assert replay.problem_from_key(block.key()) == block

    gpu = SyntheticGPU(problem, seed=1)
    store = ResultStore(tmp_path / "measurements.jsonl")

    class Recording:
        def measure(self, batch_size, candidates, fidelity):
            out = gpu.measure(batch_size, candidates, fidelity)
            for m in out.values():
                store.add(m)
            return out

    spaces = {m: prune(default_space(), problem, m, DeviceLimits.h200()).kept for m in (16, 512)}
    exhaustive = exhaustive_search(sorted(spaces), spaces.__getitem__, Recording())

    assert replay.main([str(tmp_path / "measurements.jsonl")]) == 0
    rows = replay.replay(ResultStore(tmp_path / "measurements.jsonl"))
    assert [r["batch_size"] for r in rows] == [16, 512]
    for row in rows:
        assert row["space"] == len(spaces[row["batch_size"]])
        assert row["exhaustive_best_us"] == exhaustive[row["batch_size"]].best.latency_us
        assert 0 <= row["gap"] <= 0.03
        assert row["timed"] < row["space"] * 0.3
    assert f"| {problem.key()} | 16 |" in capsys.readouterr().out


def test_keys_of_every_kind_parse_and_probe_rows_are_not_whole_calls(tmp_path):
    for problem in (
        TuneProblem(128, 768, 2048, 8, "int4_w4a16", group_size=64, has_zp=True),
        TuneProblem(16, 2048, 5120, 1, "fp8_w8a8", per_channel=True),
        TuneProblem(128, 768, 2048, 8, "bf16", routing_digest="3f9a0c21"),
    ):
        assert replay.problem_from_key(problem.key()) == problem, problem.key()

    problem = TuneProblem(128, 768, 2048, 8, "bf16")
    gpu = SyntheticGPU(problem, seed=2)
    store = ResultStore(tmp_path / "measurements.jsonl")
    space = prune(default_space(), problem, 64, DeviceLimits.h200()).kept
    timed = gpu.measure(64, space, "full")
    for m in timed.values():
        store.add(m)
    ok = [m for m in timed.values() if m.ok]  # the synthetic GPU fails some, as a GPU would
    best = min(ok, key=lambda m: m.latency_us)
    # A split tune's lone-GEMM timing of the slowest config: far faster than any whole call.
    slowest = max(ok, key=lambda m: m.latency_us)
    store.add(replace(slowest, kind="up", latency_us=best.latency_us / 10))
    (row,) = replay.replay(ResultStore(tmp_path / "measurements.jsonl"))
    assert row["exhaustive_best_us"] == best.latency_us
    assert row["space"] == len(space)
