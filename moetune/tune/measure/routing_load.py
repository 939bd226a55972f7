"""The expert load a routing dump's timings replay, for the roofline floor.

The floor's weight bytes scale with the number of distinct experts a call hits.
Under uniform routing that is ``E * (1 - (1 - top_k / E) ** M)``
(`moetune.roofline.expected_experts_hit`). A replayed dump is skewed: at small M
its windows hit fewer experts (a synthetic Zipf dump, E = 128, top-8, hottest
expert 10 % of slots, hits 58 experts at M = 16 where uniform routing hits 82),
so the call reads fewer bytes, and a floor on the uniform count came out above
the measured time (an H200, a skewed Qwen3-30B dump, M = 4..128).

Which windows are timed (`moetune.tune.measure.probe_timing`): every measurement makes a
fresh routing feed, window 0, 1, 2, ... (`routing_dump.window`). With ``c``
calls in the CUDA graph, window 0 serves the compiling eager call and the
one-call graph that sizes the timed one (`timing.one_call_us`), windows
``1..c`` the graph's capture, then each replay takes the next ``c`` windows:
the ``warmup`` first replays are dropped, and replay r of the ``replays`` timed
ones reads windows ``1 + c (1 + warmup + r)`` to ``c (2 + warmup + r)``. The
latency is the median over timed replays of the replay's time over ``c``.

So the floor's count is, at the full fidelity the summary reports, the median
over the timed replays of the mean experts hit by each replay's ``c`` windows:
each replay's time is at least its own floor, so the median time is at least
the median floor. ``c`` is chosen at run time from the one-call graph's time
(``TARGET_REPLAY_US``, at most ``max_calls_per_graph``), which the host does
not know afterwards, so the floor takes the smallest count over every possible
``c``: still a floor whichever ``c`` the timer used. Deterministic, computed
from the dump alone.
"""

from __future__ import annotations

import statistics
from typing import Any

from moetune.tune.measure.routing_dump import RoutingDump, load_routing, window
from moetune.tune.measure.timing import fidelity_of


def timed_windows(calls: int, fidelity: str = "full") -> list[range]:
    """The window indices each timed replay reads, with `calls` launches in the graph."""
    level = fidelity_of(fidelity)
    first = 1 + calls * (1 + level.warmup)
    return [range(first + r * calls, first + (r + 1) * calls) for r in range(level.replays)]


def window_experts_hit(dump: RoutingDump, batch_size: int, num_experts: int, count: int) -> Any:
    """Distinct experts hit by windows ``0..count-1`` of the dump at `batch_size` (numpy int)."""
    import numpy as np

    hits = np.zeros(count, dtype=np.int64)
    for j in range(count):
        ids = window(dump, batch_size, j).reshape(-1)
        hits[j] = np.count_nonzero(np.bincount(ids, minlength=num_experts))
    return hits


def replayed_experts_hit(
    dump: RoutingDump, batch_size: int, num_experts: int, calls: int, fidelity: str = "full"
) -> float:
    """Median over the timed replays of the mean experts hit per call, at `calls` per graph."""
    replays = timed_windows(calls, fidelity)
    hits = window_experts_hit(dump, batch_size, num_experts, replays[-1].stop)
    return float(statistics.median(float(hits[r.start : r.stop].mean()) for r in replays))


def floor_experts_hit(
    dump: RoutingDump, batch_size: int, num_experts: int, fidelity: str = "full"
) -> float:
    """The experts hit that the floor counts: the least `replayed_experts_hit` over every
    graph size the timer may pick (1 to ``max_calls_per_graph`` calls)."""
    level = fidelity_of(fidelity)
    most = level.max_calls_per_graph
    hits = window_experts_hit(dump, batch_size, num_experts, timed_windows(most, fidelity)[-1].stop)
    best = float("inf")
    for calls in range(1, most + 1):
        per_replay = (float(hits[r.start : r.stop].mean()) for r in timed_windows(calls, fidelity))
        best = min(best, float(statistics.median(per_replay)))
    return best


def problem_experts_hit(problem: Any, batch_sizes: Any) -> dict[int, float]:
    """{M: experts hit} for a problem replaying a dump; {} under uniform routing."""
    if getattr(problem, "routing", None) is None:
        return {}
    dump = load_routing(problem.routing, problem.num_experts, problem.top_k)
    return {m: floor_experts_hit(dump, m, problem.num_experts) for m in batch_sizes}


def floor_hits(problem: Any, batch_sizes: Any, notes: list[str]) -> dict[int, float] | None:
    """`problem_experts_hit` for the tuner's summary, with a note giving the counts.

    {} under uniform routing (the floor keeps its formula); None when the dump
    cannot be read any more (no floor then: a uniform one would be wrong).
    """
    from moetune.roofline import expected_experts_hit

    try:
        hits = problem_experts_hit(problem, batch_sizes)
    except Exception as exc:  # noqa: BLE001 - a missing floor must not lose a finished tune
        notes.append(f"no roofline floor: could not read the routing dump again ({exc})")
        return None
    if hits:
        e, top_k = problem.num_experts, problem.top_k
        counts = ", ".join(
            f"M={m}: {hit:.1f} (uniform {expected_experts_hit(m, e, top_k):.1f})"
            for m, hit in hits.items()
        )
        notes.append(
            f"the floor reads the weights of the experts the replayed dump's timed windows "
            f"hit, of E={e}: {counts}"
        )
    return hits


def beats_floor_note(
    batch_size: int, latency_us: float, floor_us: float, ceilings: Any, problem: Any
) -> str:
    """The summary's note for a time below the floor: which assumptions it rests on."""
    routing = (
        "uniform routing"
        if getattr(problem, "routing", None) is None
        else "the replayed dump's timed windows"
    )
    bandwidth = ceilings.read_bandwidth_bytes_per_s / 1e12
    peak = ceilings.peak_for(problem.dtype)[0] / 1e12
    return (
        f"M={batch_size}: {latency_us:.1f} us beats the floor {floor_us:.1f} us, so one of the "
        f"floor's assumptions did not hold: read bandwidth {bandwidth:.2f} TB/s "
        f"({ceilings.bandwidth_source}), matmul peak {peak:.0f} TFLOP/s, or the experts hit "
        f"under {routing}; shown as 100 % of roofline"
    )
