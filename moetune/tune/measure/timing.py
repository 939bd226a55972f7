"""How long one fused-MoE call takes: the tuner's timing harness.

On a GPU the whole fused call (routing, alignment, both GEMMs, SiLU-and-mul,
top-k sum) is captured in a CUDA graph several times over, each copy reading
its own router-logits buffer. Before every replay those buffers are refilled
with fresh random logits (uniform routing in expectation), outside the timed
region; each replay is timed with CUDA events and divided by the calls in the
graph. The first call, which compiles the Triton kernels, is timed separately
(`compile_s`) and never enters the latency; warm-up replays are dropped.

Without CUDA (CI, ``TRITON_INTERPRET=1``) the same function falls back to
wall-clock timing of a few eager calls, so the whole tuning pipeline runs on a
CPU; those numbers only rank candidates for tests, they mean nothing else.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

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


def _time_cuda_graph(problem: Any, config: dict, level: Fidelity) -> Timing:
    import torch

    logits = problem.router_logits
    torch.cuda.synchronize()
    start = time.perf_counter()
    _call(problem, config, logits)  # compiles the kernels (or loads them from Triton's cache)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - start

    # One eager call, timed, to size the graph.
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    _call(problem, config, logits)
    end.record()
    torch.cuda.synchronize()
    eager_us = begin.elapsed_time(end) * 1000.0
    calls = max(1, min(level.max_calls_per_graph, round(TARGET_REPLAY_US / max(eager_us, 1.0))))

    buffers = torch.empty((calls, *logits.shape), dtype=logits.dtype, device=logits.device)
    buffers.normal_()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for i in range(calls):
                _call(problem, config, buffers[i])
        events = []
        for replay in range(level.warmup + level.replays):
            buffers.normal_()  # fresh routing, before the start event
            if replay < level.warmup:
                graph.replay()
                continue
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            graph.replay()
            end.record()
            events.append((begin, end))
        torch.cuda.synchronize()
        samples = [b.elapsed_time(e) * 1000.0 / calls for b, e in events]
    finally:
        # Graphs hold private memory pools; drop them now so memory stays flat.
        graph.reset()
        del graph, buffers
    median, p20, p80 = summarize(samples)
    return Timing(median, p20, p80, compile_s, level.replays, calls)


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
