"""The timing harness: percentiles, the CPU fallback, and (on a GPU) CUDA-graph timing."""

import contextlib
import os

import pytest

from moetune.tune.measure.timing import FIDELITIES, fidelity_of, summarize, time_fused_moe

GPU = os.environ.get("MOETUNE_GPU_TESTS") == "1"
CONFIG = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 32,
    "BLOCK_SIZE_K": 32,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 2,
}


def test_summarize_gives_median_and_20th_80th_percentiles():
    samples = [float(v) for v in range(1, 12)]  # 1 .. 11
    median, p20, p80 = summarize(samples)
    assert median == 6.0
    assert p20 == pytest.approx(3.0)
    assert p80 == pytest.approx(9.0)
    assert summarize([4.0]) == (4.0, 4.0, 4.0)


def test_unknown_fidelity_is_refused():
    with pytest.raises(ValueError, match="unknown fidelity 'slow'"):
        fidelity_of("slow")
    assert FIDELITIES["full"].replays > FIDELITIES["quick"].replays


@pytest.mark.skipif(GPU, reason="the CPU path runs under the Triton interpreter only")
def test_cpu_fallback_times_eager_calls_and_keeps_compile_apart():
    from moetune.kernel.problem import make_problem

    problem = make_problem(3, 4, 32, 64, 2, "bf16", device="cpu")
    timing = time_fused_moe(problem, CONFIG, "quick")
    assert timing.replays == 1 and timing.calls_per_replay == 1
    assert timing.median_us > 0 and timing.compile_s > 0
    assert timing.p20_us <= timing.median_us <= timing.p80_us


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (MOETUNE_GPU_TESTS=1)")
def test_cuda_graph_timing_is_stable_and_excludes_compile():
    from moetune.kernel.problem import make_problem

    problem = make_problem(64, 8, 256, 512, 2, "bf16", device="cuda")
    first = time_fused_moe(problem, CONFIG, "full")
    second = time_fused_moe(problem, CONFIG, "full")
    assert first.replays == FIDELITIES["full"].replays
    assert first.calls_per_replay >= 1
    # The second run finds the kernels compiled: its latency stays, its compile time drops.
    assert second.compile_s < first.compile_s
    assert second.median_us == pytest.approx(first.median_us, rel=0.25)
    assert first.median_us * 1e-6 < first.compile_s


class _GraphRecorder:
    """Just enough of torch.cuda for the graph path to run on the CPU: eager calls take
    `eager_ms`; a graph remembers the logits its captured calls read, and each replay
    records what they hold then, and whether it ran between two timing events."""

    def __init__(self, eager_ms: float):
        self.eager_ms = eager_ms
        self.capturing = self.armed = self.was_reset = False
        self.eager, self.captured, self.replays = [], [], []
        recorder = self

        class Event:
            def __init__(self, enable_timing=True):
                pass

            def record(self):
                recorder.armed = not recorder.armed  # begin arms, end disarms

            def elapsed_time(self, other):
                return recorder.eager_ms

        class Graph:
            def replay(self):
                snapshot = [logits.clone() for logits in recorder.captured]
                recorder.replays.append((recorder.armed, snapshot))

            def reset(self):
                recorder.was_reset = True

        @contextlib.contextmanager
        def graph(_):
            recorder.capturing = True
            yield
            recorder.capturing = False

        self.Event, self.CUDAGraph, self.graph = Event, Graph, graph

    def call(self, problem, config, logits):
        (self.captured if self.capturing else self.eager).append(logits)

    def install(self, monkeypatch):
        import torch

        from moetune.tune.measure import timing

        monkeypatch.setattr(torch.cuda, "Event", self.Event)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", self.CUDAGraph)
        monkeypatch.setattr(torch.cuda, "graph", self.graph)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
        monkeypatch.setattr(timing, "_call", self.call)


@pytest.mark.parametrize("eager_us, calls", [(150.0, 10), (700.0, 3), (5000.0, 1)])
def test_graph_path_schedule(monkeypatch, eager_us, calls):
    """The CUDA-graph path on a fake device: the compiling call and the one-call sizing
    graph on the problem's own logits (left as they were), a graph of `calls` calls on
    buffers of their own, new
    logits before every replay, warm-up replays untimed, the graph reset at the end."""
    from moetune.kernel.problem import make_problem
    from moetune.tune.measure import timing

    recorder = _GraphRecorder(eager_us / 1000.0)
    recorder.install(monkeypatch)
    problem = make_problem(4, 8, 32, 64, 2, "bf16", device="cpu")
    logits_before = problem.router_logits.clone()
    monkeypatch.setattr(type(problem.x), "is_cuda", property(lambda self: True))  # x says "GPU"
    level = FIDELITIES["full"]
    result = timing.time_fused_moe(problem, CONFIG, "full")

    # The compiling call is eager; the one-call graph that sizes the timed one reads the
    # problem's own logits too, and its replays come first, timed, never refilled.
    assert [logits is problem.router_logits for logits in recorder.eager] == [True]
    sizing, graph_calls = recorder.captured[0], recorder.captured[1:]
    assert sizing is problem.router_logits
    assert torch_equal(problem.router_logits, logits_before)
    assert len(graph_calls) == calls == result.calls_per_replay
    assert all(logits.shape == problem.router_logits.shape for logits in graph_calls)
    assert len({logits.data_ptr() for logits in graph_calls}) == calls
    assert [armed for armed, _ in recorder.replays] == [True] * timing.SIZING_REPLAYS + [
        False
    ] * level.warmup + [True] * level.replays
    snapshots = [snapshot[1:] for _, snapshot in recorder.replays[timing.SIZING_REPLAYS :]]
    for before, after in zip(snapshots, snapshots[1:], strict=False):
        assert not torch_equal(before[0], after[0])  # new logits before every replay
    assert result.replays == level.replays and result.median_us == pytest.approx(eager_us / calls)
    assert recorder.was_reset


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))
