"""The roofline floor under a replayed routing dump counts the experts the timed windows hit."""

import contextlib

import numpy as np
import pytest
import torch

from moetune.kernel.config import Candidate
from moetune.roofline import Ceilings, expected_experts_hit, moe_roofline
from moetune.tune.measure.routing_dump import RoutingDump, load_routing, with_routing
from moetune.tune.measure.routing_load import (
    beats_floor_note,
    floor_experts_hit,
    floor_hits,
    replayed_experts_hit,
    timed_windows,
)
from moetune.tune.measure.timing import fidelity_of
from moetune.tune.problem import TuneProblem

E, TOP_K = 64, 4
N, K = 32, 64


def zipf_rows(tokens, exponent, seed=0, num_experts=E, top_k=TOP_K):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, num_experts + 1) ** exponent
    p /= p.sum()
    rows = [rng.choice(num_experts, top_k, replace=False, p=p) for _ in range(tokens)]
    return np.array(rows, dtype=np.int32)


def uniform_rows(tokens, seed=0):
    rng = np.random.default_rng(seed)
    return np.array([rng.choice(E, TOP_K, replace=False) for _ in range(tokens)], dtype=np.int32)


def dump_of(rows):
    return RoutingDump("synthetic", (rows,), "d")


CEILINGS = Ceilings(4.8e12, "HBM spec", {"bf16": 700e12}, {"bf16": "measured"})


def floor_us(batch_size, hit=None):
    roof = moe_roofline(batch_size, E, N, K, TOP_K, "bf16", experts_hit=hit)
    return 1e6 * CEILINGS.floor_seconds(roof, "bf16")


def test_uniform_routing_keeps_the_formula_exactly():
    for m in (1, 16, 256, 4096):
        today = moe_roofline(m, 128, 768, 2048, 8, "fp8_w8a8", (128, 128))
        same = moe_roofline(
            m,
            128,
            768,
            2048,
            8,
            "fp8_w8a8",
            (128, 128),
            experts_hit=expected_experts_hit(m, 128, 8),
        )
        assert moe_roofline(m, 128, 768, 2048, 8, "fp8_w8a8", (128, 128), experts_hit=None) == today
        assert same == today
    problem = TuneProblem(E, N, K, TOP_K, "bf16")
    assert floor_hits(problem, (1, 16), []) == {}  # no dump: the runner keeps the formula


def test_a_skewed_dump_lowers_the_floor_at_small_m_only():
    skewed = dump_of(zipf_rows(6000, 1.2))
    uniform = dump_of(uniform_rows(6000))
    for m in (4, 16, 32):
        hit = floor_experts_hit(skewed, m, E)
        assert floor_us(m, hit) < 0.85 * floor_us(m)
        # A uniform dump lands on the formula (less a little: the floor is a low median).
        flat = floor_experts_hit(uniform, m, E)
        assert 0.93 * expected_experts_hit(m, E, TOP_K) < flat <= expected_experts_hit(m, E, TOP_K)
    for m in (512, 2048):
        hit = floor_experts_hit(skewed, m, E)
        assert floor_us(m, hit) == pytest.approx(floor_us(m), rel=0.01)
    assert floor_experts_hit(skewed, 1, E) == TOP_K  # one token: its top-k, whatever the skew


def test_the_floor_is_the_least_over_the_graph_sizes_the_timer_may_pick():
    dump = dump_of(zipf_rows(3000, 1.0, seed=3))
    per_calls = [replayed_experts_hit(dump, 8, E, c) for c in range(1, 11)]
    assert floor_experts_hit(dump, 8, E) == min(per_calls)
    assert len(set(per_calls)) > 1  # the graph size does change which windows are timed


def test_timed_windows_follow_the_harness_schedule():
    level = fidelity_of("full")
    replays = timed_windows(10)
    assert len(replays) == level.replays
    # window 0: eager call, 1..10: capture, then 3 warm-up replays of 10 windows.
    assert replays[0] == range(41, 51) and replays[-1] == range(231, 241)


class _FakeCuda:
    """Just enough of torch.cuda for `time_graph` to run its schedule on the CPU:
    events with a set eager time (it picks the graph size), graphs that record the
    routing slots each replay reads, and which replays were between timing events."""

    def __init__(self, bench, eager_ms):
        self.bench, self.eager_ms = bench, eager_ms
        self.armed, self.timed = False, []
        fake = self

        class Event:
            def __init__(self, enable_timing=True):
                self.begin = None

            def record(self):
                fake.armed = not fake.armed  # begin arms, end disarms

            def elapsed_time(self, other):
                return fake.eager_ms

        class Graph:
            def replay(self):
                if fake.armed:
                    fake.timed.append([s["ids"].clone() for s in fake.bench.slots])

            def reset(self):
                pass

        self.Event, self.CUDAGraph = Event, Graph

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "Event", self.Event)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", self.CUDAGraph)
        monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)


@pytest.mark.parametrize("eager_us, calls", [(200.0, 10), (700.0, 3), (5000.0, 1)])
def test_experts_hit_matches_a_brute_force_count_over_the_timers_draws(
    tmp_path, monkeypatch, eager_us, calls
):
    from moetune.kernel.problem import make_problem
    from moetune.tune.measure.probe_timing import _Bench
    from moetune.tune.measure.timing import SIZING_REPLAYS, time_graph

    path = tmp_path / "skewed.npy"
    np.save(path, zipf_rows(700, 1.1, seed=5))
    problem = with_routing(TuneProblem(E, N, K, TOP_K, "bf16"), path)
    dump = load_routing(problem.routing, E, TOP_K)
    m = 8
    data = make_problem(m, E, N, K, TOP_K, "bf16", device="cpu")
    bench = _Bench(Candidate(16, 32, 32, 1, 4, 2), problem, m, data)
    monkeypatch.setattr(bench, "launch", lambda i: None)  # the schedule, not the kernel
    fake = _FakeCuda(bench, eager_us / 1000.0)
    fake.install(monkeypatch)
    timing = time_graph(bench, fidelity_of("full"))
    assert timing.calls_per_replay == calls
    # The one-call sizing graph's replays come first (slot 0: window 0, never refilled).
    sizing, fake.timed = fake.timed[:SIZING_REPLAYS], fake.timed[SIZING_REPLAYS:]
    assert [len(slots) for slots in sizing] == [1] * SIZING_REPLAYS
    assert len(fake.timed) == fidelity_of("full").replays
    # Brute force: distinct experts of every slot of every timed replay, mean per replay,
    # median over replays (what the latency's median is of).
    per_replay = [np.mean([len(np.unique(ids.numpy())) for ids in slots]) for slots in fake.timed]
    brute = float(np.median(per_replay))
    assert replayed_experts_hit(dump, m, E, calls) == pytest.approx(brute, abs=1e-9)
    assert floor_experts_hit(dump, m, E) <= brute  # a floor whatever graph size was picked


def test_the_summary_gets_the_dumps_counts_and_a_plain_note(tmp_path):
    path = tmp_path / "skewed.npy"
    np.save(path, zipf_rows(2000, 1.2))
    problem = with_routing(TuneProblem(E, N, K, TOP_K, "bf16"), path)
    notes = []
    hits = floor_hits(problem, (1, 16), notes)
    assert set(hits) == {1, 16} and hits[16] < expected_experts_hit(16, E, TOP_K)
    assert "replayed dump" in notes[0] and "M=16" in notes[0]
    path.unlink()
    notes = []
    assert floor_hits(problem, (1,), notes) is None and "no roofline floor" in notes[0]
    note = beats_floor_note(16, 100.0, 120.0, CEILINGS, problem)
    assert "4.80 TB/s (HBM spec)" in note and "replayed dump" in note
    assert "ceilings are too low" not in note


def test_the_json_rows_carry_the_floors_count(tmp_path):
    from moetune.device import DeviceLimits
    from moetune.tune.runner import BatchResult, TuneRequest, TuneSummary, make_plan, summary_json

    a = Candidate(16, 32, 32, 1, 4, 2)
    problem = TuneProblem(E, N, K, TOP_K, "bf16")
    tune = TuneRequest(problem, (16, 32), (a,), tmp_path, device_name="NVIDIA H200")
    plan = make_plan(tune, DeviceLimits.h200())
    summary = TuneSummary(plan, ceilings=CEILINGS)
    summary.rows.append(BatchResult(16, a, 10.0, 8.0, 0, 0.0, {}, experts_hit=21.5))
    summary.rows.append(BatchResult(32, a, 10.0, 8.0, 0, 0.0, {}))
    rows = summary_json(summary)["results"]
    assert [r["floor_experts_hit"] for r in rows] == [21.5, None]
    assert rows[0]["floor_us"] == 8.0 and rows[0]["roofline_fraction"] == 0.8
