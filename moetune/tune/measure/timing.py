"""How long one fused-MoE call takes: the tuner's timing harness.

On a GPU the whole fused call (routing, alignment, both GEMMs, SiLU-and-mul,
top-k sum) is captured in a CUDA graph several times over, each copy reading
its own router-logits buffer. Before every replay those buffers are refilled
with fresh random logits (uniform routing in expectation), outside the timed
region; each replay is timed with CUDA events and divided by the calls in the
graph. The first call, which compiles the Triton kernels, is timed separately
(`compile_s`) and never enters the latency; warm-up replays are dropped.

The graph loop itself (`time_graph`, `capture_graph`) takes any `Bench`: slots of
inputs, refilled in place before every replay, one launch per slot. The whole call
is one such bench; `moetune.tune.measure.probe_timing` times lone GEMMs and split
pairs through it, and bench/kernel.py and bench/parity.py their variants.

Without CUDA (CI, ``TRITON_INTERPRET=1``) the same function falls back to
wall-clock timing of a few eager calls, so the whole tuning pipeline runs on a
CPU; those numbers only rank candidates for tests, they mean nothing else.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Protocol

from moetune.roofline import Ceilings  # noqa: F401 - re-exported, the workers' reply type


@dataclass(frozen=True)
class Fidelity:
    """How hard to look: warm-up replays, timed replays, and calls per graph at most."""

    warmup: int
    replays: int
    max_calls_per_graph: int


# "quick" ranks candidates in cheap first rounds; "full" decides between the survivors.
FIDELITIES = {
    "quick": Fidelity(warmup=1, replays=5, max_calls_per_graph=10),
    "full": Fidelity(warmup=3, replays=20, max_calls_per_graph=10),
}
# Calls per graph are cut so one replay lasts about this long (large M calls take ms each).
TARGET_REPLAY_US = 2000.0
# Eager calls timed per fidelity when there is no GPU.
CPU_CALLS = {"quick": 1, "full": 3}


@dataclass(frozen=True)
class Timing:
    """Latency of one call in microseconds (median and 20th/80th percentiles of replays)."""

    median_us: float
    p20_us: float
    p80_us: float
    compile_s: float
    replays: int
    calls_per_replay: int


def fidelity_of(name: str) -> Fidelity:
    try:
        return FIDELITIES[name]
    except KeyError:
        raise ValueError(
            f"unknown fidelity {name!r}; expected one of {sorted(FIDELITIES)}"
        ) from None


def summarize(samples_us: list[float]) -> tuple[float, float, float]:
    """(median, p20, p80) of a list of per-call latencies."""
    if len(samples_us) == 1:
        return samples_us[0], samples_us[0], samples_us[0]
    deciles = statistics.quantiles(samples_us, n=10, method="inclusive")
    return statistics.median(samples_us), deciles[1], deciles[7]


def time_fused_moe(problem: Any, config: dict, fidelity: str = "full") -> Timing:
    """Time `fused_moe` on `problem` (a `moetune.kernel.problem.MoEProblem`) with `config`.

    Raises whatever the kernel raises (compile errors, OutOfResources, CUDA
    errors); the worker turns those into a measurement status.
    """
    level = fidelity_of(fidelity)
    if problem.x.is_cuda:
        return _time_cuda_graph(problem, config, level)
    return _time_wall_clock(problem, config, fidelity)


def _call(problem: Any, config: dict, router_logits: Any) -> Any:
    from moetune.kernel.fused_moe import fused_moe

    return fused_moe(
        problem.x,
        problem.w1,
        problem.w2,
        router_logits,
        problem.top_k,
        config=config,
        quant=problem.quant,
        gemm=problem.gemm,
    )


class _WholeCalls:
    """`fused_moe` on `problem` with `config`, as a bench of `time_graph`: the compile and
    sizing calls read the problem's own router logits (never refilled); a graph's calls
    each read a buffer of their own, redrawn by `refill`."""

    def __init__(self, problem: Any, config: dict) -> None:
        self.problem, self.config = problem, config
        self.logits: Any = None

    def allocate(self, count: int) -> None:
        import torch

        own = self.problem.router_logits
        if self.logits is None:
            self.logits = [own]
            return
        self.logits = torch.empty((count, *own.shape), dtype=own.dtype, device=own.device)
        self.refill()

    def refill(self) -> None:
        self.logits.normal_()

    def launch(self, slot: int) -> Any:
        return _call(self.problem, self.config, self.logits[slot])

    def release(self) -> None:
        self.logits = None


def _time_cuda_graph(problem: Any, config: dict, level: Fidelity) -> Timing:
    return time_graph(_WholeCalls(problem, config), level)


class Bench(Protocol):
    """What `time_graph` times: slots of inputs, one launch per slot.

    ``allocate(n)`` gives n slots their inputs; ``refill()`` gives every slot new inputs
    in place (it runs before each replay, outside the timed region); ``launch(i)`` runs
    one call on slot i; ``release()`` drops the slots.
    """

    def allocate(self, count: int) -> None: ...

    def refill(self) -> None: ...

    def launch(self, slot: int) -> Any: ...

    def release(self) -> None: ...


@dataclass
class CapturedGraph:
    """A CUDA graph of `calls` launches of `bench`, one per slot, ready to replay."""

    bench: Any
    graph: Any
    calls: int
    compile_s: float

    def replay(self, timed: bool = True) -> tuple[Any, Any] | None:
        """New inputs (outside the timed region), then one replay; its two events if timed."""
        import torch

        self.bench.refill()
        if not timed:
            self.graph.replay()
            return None
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        self.graph.replay()
        end.record()
        return begin, end

    def per_call_us(self, events: tuple[Any, Any]) -> float:
        """Microseconds per call of one timed replay (after a synchronize)."""
        begin, end = events
        return begin.elapsed_time(end) * 1000.0 / self.calls

    def close(self) -> None:
        """Free the graph's private memory pool and the bench's slots."""
        self.graph.reset()
        self.bench.release()


# Replays of the one-call graph that sizes the timed graph; the least of them is taken.
SIZING_REPLAYS = 2


def one_call_us(bench: Bench) -> float:
    """The device time of one launch on slot 0, from a CUDA graph of that one call (the
    least of `SIZING_REPLAYS` replays, slot 0 left as it is).

    An eager call's time, which sized the graph before, holds the host's launch latency:
    at decode sizes that is most of it and moves from one timing to the next, so the
    graph held 1 to 6 calls at M = 1 by chance, and a replay of one call reads 25 %
    slower per call than one of three or more (bench/decode_stability.py).
    """
    import torch

    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            bench.launch(0)
        samples = []
        for _ in range(SIZING_REPLAYS):
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            samples.append(begin.elapsed_time(end) * 1000.0)
    finally:
        graph.reset()
    return min(samples)


def capture_graph(bench: Bench, level: Fidelity) -> CapturedGraph:
    """Compile (timed apart), size the graph from a one-call graph (`one_call_us`), capture it.

    One slot serves the compile call and the sizing graph; the timed graph then holds as many
    calls (slots) as last about `TARGET_REPLAY_US`, at most ``level.max_calls_per_graph``.
    """
    import torch

    bench.allocate(1)
    torch.cuda.synchronize()
    start = time.perf_counter()
    bench.launch(0)  # compiles the kernels (or loads them from Triton's cache)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - start

    call_us = one_call_us(bench)
    calls = max(1, min(level.max_calls_per_graph, round(TARGET_REPLAY_US / max(call_us, 1.0))))

    bench.allocate(calls)
    graph = torch.cuda.CUDAGraph()
    captured = CapturedGraph(bench, graph, calls, compile_s)
    try:
        with torch.cuda.graph(graph):
            for i in range(calls):
                bench.launch(i)
    except BaseException:
        captured.close()
        raise
    return captured


def time_graph(bench: Bench, level: Fidelity) -> Timing:
    """The harness: `capture_graph`, then ``level.warmup`` untimed and ``level.replays``
    timed replays, each after a `refill`; per-call latency of the timed ones."""
    import torch

    captured = capture_graph(bench, level)
    try:
        events = []
        for replay in range(level.warmup + level.replays):
            timed = captured.replay(timed=replay >= level.warmup)
            if timed is not None:
                events.append(timed)
        torch.cuda.synchronize()
        samples = [captured.per_call_us(timed) for timed in events]
    finally:
        # Graphs hold private memory pools; drop them now so memory stays flat.
        captured.close()
    median, p20, p80 = summarize(samples)
    return Timing(median, p20, p80, captured.compile_s, level.replays, captured.calls)


def time_bench(bench: Bench, fidelity: str, on_gpu: bool) -> Timing:
    """`time_graph` on a GPU; without one, `CPU_CALLS` eager launches of slot 0, each after
    a `refill`, wall clock (the first launch, which compiles, timed apart)."""
    level = fidelity_of(fidelity)
    if on_gpu:
        return time_graph(bench, level)
    bench.allocate(1)
    try:
        start = time.perf_counter()
        bench.launch(0)
        compile_s = time.perf_counter() - start
        samples = []
        for _ in range(CPU_CALLS[fidelity]):
            bench.refill()
            start = time.perf_counter()
            bench.launch(0)
            samples.append((time.perf_counter() - start) * 1e6)
    finally:
        bench.release()
    median, p20, p80 = summarize(samples)
    return Timing(median, p20, p80, compile_s, len(samples), 1)


def _time_wall_clock(problem: Any, config: dict, fidelity: str) -> Timing:
    import torch

    start = time.perf_counter()
    _call(problem, config, problem.router_logits)
    compile_s = time.perf_counter() - start
    samples = []
    for _ in range(CPU_CALLS[fidelity]):
        logits = torch.randn_like(problem.router_logits)
        start = time.perf_counter()
        _call(problem, config, logits)
        samples.append((time.perf_counter() - start) * 1e6)
    median, p20, p80 = summarize(samples)
    return Timing(median, p20, p80, compile_s, len(samples), 1)


def measure_ceilings(device: Any = None) -> Ceilings:
    """Read bandwidth and matmul peaks of the current GPU (see `moetune.tune.measure.ceilings`)."""
    from moetune.tune.measure.ceilings import measure_ceilings as measure

    return measure(device)


@dataclass(frozen=True)
class Outcome:
    """What happened to one candidate of a unit."""

    candidate: Any
    status: str
    latency_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    compile_s: float | None = None
    error: str | None = None
    rel_rms: float | None = None
    max_abs: float | None = None
