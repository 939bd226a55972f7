"""Timing the probes of `moetune.kernel.probe` (one GEMM alone, or the call with split configs).

Same method as `moetune.tune.measure.timing`, with the routing taken out of the graph:
the graph holds `calls` launches, each reading its own routing slot (top-k ids
and weights, and for a lone GEMM the alignment too). Before every replay,
outside the timed region, each slot is refilled with the next routing: fresh
uniform random routing (the kernel's softmax top-k of random logits), or the
next window of a real-routing dump (`moetune.tune.measure.routing_dump`). So the
whole-call timings of the split pair and of the single config, and the lone
GEMM timings, all see the same routings.

- `up`: the gate/up GEMM on pre-aligned routings, x quantized once outside the
  graph (fp8), TMA on the weights when `use_tma`;
- `down`: the down GEMM on pre-aligned routings reading a random activation of
  the right shape (SiLU-and-mul does not run), weighted by the routing weights;
  with TMA, A and w2 are read through tensor descriptors from the sorted,
  block-padded layout the up GEMM writes when the down GEMM uses TMA;
- `pair`/`whole`: `fused_experts` with ``config`` and ``down_config``.

A TMA probe that cannot run here (compute capability below 9.0, no tensor
descriptors in this Triton, no TMA path in the kernel, or a dtype SGLang does
not run with TMA) is answered ``unsupported`` with the reason, which the store
records; the tuner moves on. Triton's interpreter emulates descriptors, so the
CPU runs TMA probes when its Triton has them.

Without CUDA the slots are timed one eager call at a time (wall clock), which
only ranks candidates for tests.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from moetune.kernel.probe import Probe
from moetune.tune.measure.routing_dump import RoutingDump, load_routing, random_weights, window
from moetune.tune.measure.timing import Outcome, time_bench


class Unsupported(Exception):
    """This device or kernel cannot run the probe (TMA); the reason is recorded, not an error."""


# ---------------------------------------------------------------------------
# What the kernel and the device can do
# ---------------------------------------------------------------------------


def tma_unsupported_reason(device: Any, quant_dtype: str | None, block_shape: Any) -> str | None:
    """Why TMA cannot run here (device, Triton, kernel or dtype), or None when it can.

    Triton's interpreter emulates tensor descriptors, so on the CPU TMA runs (slowly)
    whenever this Triton has them; on a GPU it needs compute capability 9.0+.
    """
    from moetune.kernel.tma import SplitConfigError, check_tma_quant, tma_supported

    if not tma_supported():
        import triton

        return f"Triton {triton.__version__} has no host tensor descriptors"
    try:
        check_tma_quant(quant_dtype, block_shape)
    except SplitConfigError as exc:
        return str(exc)
    if device.type == "cuda":
        import torch

        major, minor = torch.cuda.get_device_capability(device)
        if major < 9:
            return f"TMA needs compute capability 9.0+, this GPU has {major}.{minor}"
    return None


# ---------------------------------------------------------------------------
# Routing slots
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _dump(path: str, digest: str, num_experts: int, top_k: int) -> RoutingDump:
    dump = load_routing(path, num_experts, top_k)
    if dump.digest != digest:
        raise RuntimeError(f"the routing dump {path} changed since the tune started")
    return dump


class RoutingFeed:
    """The next routings for one problem and batch size: uniform random, or dump windows."""

    def __init__(self, problem: Any, batch_size: int, device: Any, seed: int = 0) -> None:
        import torch

        self.problem, self.batch_size, self.device = problem, batch_size, device
        self.dump = None
        if problem.routing is not None:
            self.dump = _dump(
                problem.routing, problem.routing_digest, problem.num_experts, problem.top_k
            )
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.index = 0

    def next(self) -> tuple[Any, Any]:
        """(topk_weights [M, top_k] float32, topk_ids [M, top_k] int32) on the device."""
        import torch

        m, p = self.batch_size, self.problem
        if self.dump is None:
            from moetune.kernel.routing import topk_routing

            logits = torch.randn(m, p.num_experts, generator=self.generator, device=self.device).to(
                torch.bfloat16
            )
            return topk_routing(logits, p.top_k, True)
        ids = torch.from_numpy(window(self.dump, m, self.index)).to(self.device)
        weights = torch.from_numpy(random_weights(m, p.top_k, self.index)).to(self.device)
        self.index += 1
        return weights, ids


# ---------------------------------------------------------------------------
# The routing stream: drawn and aligned once per batch size, read by every bench
# ---------------------------------------------------------------------------

# Routing names a slot holds: the draw, then (lone GEMMs) its alignment at BLOCK_SIZE_M.
DRAWN = ("weights", "ids")
ALIGNED = ("sorted_token_ids", "expert_ids", "num_tokens_post_padded")
# Device bytes the cached streams may hold in one process; the oldest go first beyond it.
STREAM_CACHE_BYTES = 4 << 30
# Each slot of a bench starts at this alignment, as a tensor of its own would (PyTorch's CUDA
# allocator hands out 512-byte blocks). Triton specializes pointers on 16-byte alignment: a
# slot at an odd offset of a shared buffer would run another variant of the kernel than the
# one the warmers compiled, compiled again in the timer (on the H200 that was 0.36-0.39 s
# for every new probe config; BENCHMARKS.md, Tune time).
SLOT_ALIGN_BYTES = 512


class RoutingStream:
    """The sequence of routings every bench of one batch size reads, kept once drawn.

    Every bench draws from a `RoutingFeed` seeded alike, so every probe at one batch
    size reads the same routings in the same order (draw j goes to whichever slot
    the harness's j-th refill fills). Drawing a routing (random logits, softmax
    top-k) and aligning it to a BLOCK_SIZE_M take about ten small launches each,
    and a full timing refills up to 241 slots: on the H200 that was most of a lone
    GEMM's timing (~0.056 s a timing, for GEMMs of 10-300 us). So the
    draws and their alignments are kept as stacked tensors, grown on demand; a
    bench's refill is then one copy per routing name. The numbers each bench reads
    are the ones it would have drawn itself.
    """

    def __init__(self, feed: RoutingFeed) -> None:
        self.feed = feed
        # group (None: the draws; a BLOCK_SIZE_M: their alignments) -> stacked tensors
        self.stacked: dict[int | None, tuple[Any, ...]] = {}
        self.nbytes = 0

    def take(self, start: int, count: int, block_size_m: int | None) -> dict[str, Any]:
        """Draws start .. start + count - 1 by routing name, stacked ([count, ...] each);
        with `block_size_m`, their alignments too."""
        from moetune.kernel.align import align_block_size

        end = start + count
        drawn = self._grow(None, end, lambda _: self.feed.next())  # drawn in order
        out = dict(zip(DRAWN, (t[start:end] for t in drawn), strict=True))
        if block_size_m is not None:
            experts = self.feed.problem.num_experts
            ids = drawn[1]  # a row of the stack may sit off 16 bytes: aligned from a copy
            problem = self.feed.problem
            aligned = self._grow(
                block_size_m,
                end,
                lambda j: align_block_size(
                    ids[j].clone(),
                    block_size_m,
                    experts,
                    engine_size(problem, "align_slots", ids[j].numel(), block_size_m, experts),
                ),
            )
            out.update(zip(ALIGNED, (t[start:end] for t in aligned), strict=True))
        return out

    def _grow(self, group: int | None, end: int, make: Callable[[int], tuple]) -> tuple:
        """The group's stacks, holding draws 0 .. `end` - 1 at least (grown in order)."""
        import torch

        stacks = self.stacked.get(group)
        have = 0 if stacks is None else stacks[0].shape[0]
        if have >= end:
            return stacks
        # Doubling keeps the stacking linear; alignments stop at the draws already made.
        limit = None if group is None else self.stacked[None][0].shape[0]
        end = max(end, 2 * have if limit is None else min(2 * have, limit))
        fresh = tuple(
            torch.stack(column) for column in zip(*map(make, range(have, end)), strict=True)
        )
        if stacks is not None:
            fresh = tuple(torch.cat([old, new]) for old, new in zip(stacks, fresh, strict=True))
            self.nbytes -= sum(t.numel() * t.element_size() for t in stacks)
        self.nbytes += sum(t.numel() * t.element_size() for t in fresh)
        self.stacked[group] = fresh
        _evict_past_budget()
        return fresh


# This process's streams, the most recently used last (`routing_stream`).
_STREAMS: dict[tuple, RoutingStream] = {}


def routing_stream(problem: Any, batch_size: int, device: Any, seed: int = 0) -> RoutingStream:
    """The process's `RoutingStream` for this routing source and batch size (kept while
    the streams' stacked tensors fit `STREAM_CACHE_BYTES`, the oldest dropped first)."""
    key = (
        getattr(problem.kernel, "engine", None),  # its alignment length (`engine_size`)
        problem.num_experts,
        problem.top_k,
        problem.routing,
        problem.routing_digest,
        batch_size,
        str(device),
        seed,
    )
    stream = _STREAMS.pop(key, None)
    if stream is None:
        stream = RoutingStream(RoutingFeed(problem, batch_size, device, seed))
    _STREAMS[key] = stream  # the most recently used last
    _evict_past_budget()
    return stream


def drop_routing_streams() -> None:
    """Forget every kept stream: the next bench draws its routings afresh."""
    _STREAMS.clear()


def _evict_past_budget() -> None:
    """Drop the least recently used streams while all of them hold more than
    `STREAM_CACHE_BYTES` (the one in use, the last, always stays)."""
    while len(_STREAMS) > 1 and sum(s.nbytes for s in _STREAMS.values()) > STREAM_CACHE_BYTES:
        del _STREAMS[next(iter(_STREAMS))]


def engine_size(problem: Any, rule: str, *args: int) -> int | None:
    """A buffer length as the engine release of `problem`'s kernel sizes it (`rule` of its
    launch module, e.g. SGLang's ``align_slots``), or None: moetune's own."""
    kernel = getattr(problem, "kernel", None)
    if kernel is None:
        return None
    from moetune.engines.launch import release_module

    sizing = getattr(release_module(kernel.engine, kernel.release), rule, None)
    return None if sizing is None else sizing(*args)


def _aligned_rows(stacked: Any) -> Any:
    """`stacked` ([count, ...]) copied into rows that each start at `SLOT_ALIGN_BYTES`:
    a [count, n] view of a wider buffer, one row a slot."""
    import torch

    count, size = stacked.shape[0], stacked.element_size()
    per_slot = stacked[0].numel()
    width = -(-per_slot * size // SLOT_ALIGN_BYTES) * SLOT_ALIGN_BYTES // size
    rows = torch.empty(count, width, dtype=stacked.dtype, device=stacked.device)[:, :per_slot]
    rows.copy_(stacked.reshape(count, per_slot))
    return rows


# ---------------------------------------------------------------------------
# Benches: static slots, a refill outside the timed region, one launch per slot
# ---------------------------------------------------------------------------


def _quantize(a: Any, quant: Any) -> tuple[Any, Any]:
    from moetune.kernel.fused_moe import quantize_activation

    return quantize_activation(a, quant)


def split_fused_experts(
    data: Any, weights: Any, ids: Any, config: dict, down_config: dict | None
) -> Any:
    """`fused_experts` with an up and a down config, on `data`'s GEMM launcher."""
    from moetune.kernel.fused_moe import fused_experts

    return fused_experts(
        data.x,
        data.w1,
        data.w2,
        weights,
        ids,
        config=config,
        down_config=down_config,
        quant=data.quant,
        gemm=data.gemm,
    )


class _Bench:
    """Static routing slots for `item` at one batch size; `refill` then `launch(i)`.

    The slots are views of one stacked buffer per routing name, refilled from the
    batch size's `RoutingStream` (the next `count` draws each time).
    """

    def __init__(self, item: Any, problem: Any, batch_size: int, data: Any, seed: int = 0):
        self.item, self.problem, self.data = item, problem, data
        self.batch_size = batch_size
        self.stream = routing_stream(problem, batch_size, data.x.device, seed)
        self.kind = getattr(item, "kind", "whole")
        self.block_size_m = item.candidate.BLOCK_SIZE_M if self.kind in ("up", "down") else None
        self.position = 0  # the stream's next draw
        self.buffers: dict[str, Any] = {}
        self.slots: list[dict[str, Any]] = []
        self.seen_ids: list[Any] = []  # every routing a launch read (tests check the load)

    def allocate(self, count: int) -> None:
        routings = self._next(count)
        self.buffers = {name: _aligned_rows(value) for name, value in routings.items()}
        self.slots = [
            {name: rows[i].view(routings[name].shape[1:]) for name, rows in self.buffers.items()}
            for i in range(count)
        ]
        if self.kind in ("up", "down"):
            self._gemm_buffers()

    def release(self) -> None:
        self.slots, self.buffers = [], {}

    def refill(self) -> None:
        for name, value in self._next(len(self.slots)).items():
            self.buffers[name].copy_(value.reshape(value.shape[0], -1))

    def _next(self, count: int) -> dict[str, Any]:
        routings = self.stream.take(self.position, count, self.block_size_m)
        self.position += count
        self.seen_ids.extend(routings["ids"].unbind(0))
        return routings

    def _gemm_buffers(self) -> None:
        import torch

        data, p, m = self.data, self.problem, self.batch_size
        x = data.x
        slots = m * p.top_k
        padded = self.slots[0]["sorted_token_ids"].numel()
        quant = data.quant
        self.common = dict(
            quant_dtype=quant.dtype if quant is not None else None,
            block_shape=quant.block_shape if quant is not None else None,
        )
        from moetune.kernel.fused_moe import weight_launch_args

        # per_channel, or int4's zero points and group size: the launcher's other keywords
        zp = None if quant is None else quant.w1_zp if self.kind == "up" else quant.w2_zp
        self.common.update(weight_launch_args(quant, zp))
        if self.kind == "up":
            self.a, self.a_scale = _quantize(x, quant)
            self.c = torch.empty(slots, 2 * p.intermediate_size, dtype=x.dtype, device=x.device)
            self.w, self.w_scale = data.w1, quant.w1_scale if quant is not None else None
        else:
            rows = slots
            if self.item.use_tma:  # the sorted layout, as many rows as the engine allocates
                bm = self.item.candidate.BLOCK_SIZE_M
                rows = engine_size(p, "sorted_rows", slots, bm, p.num_experts) or padded
            generator = torch.Generator(device=x.device).manual_seed(7)
            act = torch.randn(rows, p.intermediate_size, generator=generator, device=x.device).to(
                x.dtype
            )
            if self.common["block_shape"] is not None:
                from moetune.kernel.quant import per_token_group_quant_fp8

                self.a, self.a_scale = per_token_group_quant_fp8(act, self.common["block_shape"][1])
            else:
                self.a, self.a_scale = _quantize(act, quant)
            self.c = torch.empty(m, p.top_k, p.hidden_size, dtype=x.dtype, device=x.device)
            self.w, self.w_scale = data.w2, quant.w2_scale if quant is not None else None

    def launch(self, i: int) -> Any:
        slot = self.slots[i]
        if self.kind in ("whole", "pair"):
            item = self.item
            if isinstance(item, Probe):
                return split_fused_experts(
                    self.data, slot["weights"], slot["ids"], item.up_config(), item.down_config()
                )
            return split_fused_experts(
                self.data, slot["weights"], slot["ids"], item.as_config(), None
            )
        return self._launch_gemm(slot)

    def _launch_gemm(self, slot: dict[str, Any]) -> Any:
        from moetune.kernel.fused_moe import gemm_launcher

        # The engine's kernel, else moetune's (int4 w4a16: its own kernel).
        invoke_fused_moe_gemm = self.data.gemm or gemm_launcher(self.data.quant)
        probe = self.item
        up = self.kind == "up"
        extra = {}
        if probe.use_tma:
            # up: w1 through a descriptor (SGLang PR #33559), output unsorted as SGLang's
            # tuner times it; down: the sorted-layout A and w2 through descriptors.
            extra = {"w_use_tma": True} if up else {"a_use_tma": True, "w_use_tma": True}
        return invoke_fused_moe_gemm(
            self.a,
            self.w,
            self.c,
            a_scale=self.a_scale,
            w_scale=self.w_scale,
            topk_weights=None if up else slot["weights"],
            mul_routed_weight=not up,
            top_k=self.problem.top_k if up else 1,
            config=probe.candidate.as_config(),
            sorted_token_ids=slot["sorted_token_ids"],
            expert_ids=slot["expert_ids"],
            num_tokens_post_padded=slot["num_tokens_post_padded"],
            **self.common,
            **extra,
        )


# ---------------------------------------------------------------------------
# Checking and measuring (timing: `moetune.tune.measure.timing.time_bench`)
# ---------------------------------------------------------------------------


def verify_pair(item: Any, data: Any, dtype: str, corrupt: bool = False) -> Any:
    """`moetune.tune.measure.verify.Check` of the split call against the PyTorch reference."""
    from moetune.kernel.naive import naive_fused_moe
    from moetune.kernel.routing import topk_routing
    from moetune.tune.measure.verify import compare

    weights, ids = topk_routing(data.router_logits, data.top_k, True)
    if isinstance(item, Probe):
        out = split_fused_experts(data, weights, ids, item.up_config(), item.down_config())
    else:
        out = split_fused_experts(data, weights, ids, item.as_config(), None)
    ref = naive_fused_moe(
        data.x, data.w1, data.w2, data.router_logits, data.top_k, quant=data.quant
    )
    if corrupt:
        out = out + 1.0
    return compare(out, ref, dtype)


def measure_probe(
    problem: Any, batch_size: int, mode: str, item: Any, data: Any, corrupt: bool = False
) -> Outcome:
    """One worker measurement of `item` (a `Probe`, or a candidate under a routing dump)."""
    if isinstance(item, Probe) and item.uses_tma:
        quant = data.quant
        reason = tma_unsupported_reason(
            data.x.device,
            quant.dtype if quant is not None else None,
            quant.block_shape if quant is not None else None,
        )
        if reason is not None:
            return Outcome(item, "unsupported", error=reason)
    try:
        if mode == "verify":
            check = verify_pair(item, data, problem.dtype, corrupt)
            return Outcome(
                item,
                "ok" if check.ok else "wrong_result",
                error=None if check.ok else check.describe(),
                rel_rms=check.rel_rms,
                max_abs=check.max_abs,
            )
        bench = _Bench(item, problem, batch_size, data)
        if mode == "warm":
            bench.allocate(1)
            start = time.perf_counter()
            bench.launch(0)
            if data.x.is_cuda:
                import torch

                torch.cuda.synchronize()
            return Outcome(item, "ok", compile_s=time.perf_counter() - start)
        timing = time_bench(bench, mode, data.x.is_cuda)
    except Unsupported as exc:
        return Outcome(item, "unsupported", error=str(exc))
    return Outcome(item, "ok", timing.median_us, timing.p20_us, timing.p80_us, timing.compile_s)


def uses_probe_timing(problem: Any, item: Any, mode: str) -> bool:
    """Whether the worker times `item` here rather than with `moetune.tune.measure.timing`."""
    if isinstance(item, Probe):
        return True
    return getattr(problem, "routing", None) is not None and mode in ("quick", "full")
