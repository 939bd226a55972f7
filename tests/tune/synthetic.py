"""A synthetic GPU for strategy tests: an analytic latency landscape with noise and failures.

It is deliberately unlike `moetune.tune.search.costmodel` (which fast search uses to
order candidates): a padded-work roofline times a random bowl in log2
parameter space whose optimum drifts with the batch size, plateaus (GROUP_SIZE_M
matters only with many row blocks, num_warps in steps), a shared-memory
pressure cliff, per-candidate ruggedness, measurement noise (quick noisier
than full) and failing candidates (out of resources, compile errors, crashes).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence

from moetune.device import DeviceLimits
from moetune.kernel.config import Candidate
from moetune.roofline import expected_experts_hit
from moetune.tune.problem import TuneProblem
from moetune.tune.search.space import PARAM_NAMES
from moetune.tune.store import Measurement

# The real shapes the search tests run on, and the device they are pruned for.
H200 = DeviceLimits.h200()
QWEN3_30B = TuneProblem(128, 768, 2048, 8, "bf16")
MIXTRAL_TP2 = TuneProblem(8, 7168, 4096, 2, "bf16")
DEEPSEEK_V3_TP8 = TuneProblem(256, 256, 7168, 8, "fp8_w8a8", (128, 128))

NOISE = {"quick": 0.02, "full": 0.005}


class _Tiles:
    """A candidate as the landscape sees it: its six tile keys, printed as `Candidate` was
    before it carried vLLM 0.34's TMA-B switch, so the landscapes (and the thresholds the
    search tests hold them to) stay the ones those tests were written on."""

    def __init__(self, candidate: Candidate):
        self.candidate = candidate

    def __repr__(self) -> str:
        keys = ", ".join(f"{name}={getattr(self.candidate, name)!r}" for name in PARAM_NAMES)
        return f"Candidate({keys})"


def _unit(*parts: object) -> float:
    """A deterministic pseudo-random number in [0, 1) from `parts`."""
    parts = tuple(_Tiles(part) if isinstance(part, Candidate) else part for part in parts)
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


class SyntheticGPU:
    """`Measurer` over an analytic landscape; `true_us` is the noise-free latency (None = fails).

    The noise is drawn call after call; with `fixed_noise` each (batch size, candidate,
    fidelity) gets its own draw, the same whenever and in whatever order it is timed.
    """

    def __init__(
        self,
        problem: TuneProblem,
        seed: int,
        limits: DeviceLimits | None = None,
        fixed_noise: bool = False,
    ):
        self.problem = problem
        self.seed = seed
        self.limits = limits or DeviceLimits.h200()
        self.rng = random.Random(seed)
        self.fixed_noise = fixed_noise
        rnd = random.Random(seed * 7919 + 1)
        # Bowl optimum per parameter: intercept and drift with log2(M), in log2 units.
        self.opt = {name: (rnd.uniform(-1.0, 1.0), rnd.uniform(-1.0, 1.0)) for name in PARAM_NAMES}
        self.weight = {name: rnd.uniform(0.004, 0.03) for name in PARAM_NAMES}
        self.calls: list[tuple[int, int, str]] = []

    def effective(self, m: int, c: Candidate) -> Candidate:
        """The candidate that does the same work: tiles clamped to the problem, one group if few rows.

        Candidates with the same effective candidate behave alike (same bowl, same
        ruggedness, same compile failures); the larger tiles only pay for padding.
        """
        p = self.problem
        pow2 = lambda x: 1 << max(4, math.ceil(math.log2(x)))  # noqa: E731
        bm = min(c.BLOCK_SIZE_M, pow2(m))
        rows = math.ceil(m * p.top_k / bm) + p.num_experts
        return Candidate(
            bm,
            min(c.BLOCK_SIZE_N, pow2(max(2 * p.intermediate_size, p.hidden_size))),
            min(c.BLOCK_SIZE_K, pow2(max(p.intermediate_size, p.hidden_size))),
            min(c.GROUP_SIZE_M, rows),
            c.num_warps,
            c.num_stages,
        )

    def failure(self, c: Candidate, m: int = 1) -> str | None:
        a_bytes = 1 if self.problem.dtype == "fp8_w8a8" else 2
        buffers = c.num_stages if c.BLOCK_SIZE_M >= 64 else c.num_stages - 1
        smem = buffers * (c.BLOCK_SIZE_M + c.BLOCK_SIZE_N) * c.BLOCK_SIZE_K * a_bytes
        if smem > self.limits.shared_memory_per_block:
            return "out_of_resources"
        u = _unit("fail", self.seed, self.effective(m, c))
        if u < 0.02:
            return "compile_error"
        if u < 0.025:
            return "crashed"
        return None

    def true_us(self, m: int, c: Candidate) -> float | None:
        if self.failure(c, m):
            return None
        p = self.problem
        eff = self.effective(m, c)
        excess = (c.BLOCK_SIZE_M * c.BLOCK_SIZE_N * c.BLOCK_SIZE_K) / (
            eff.BLOCK_SIZE_M * eff.BLOCK_SIZE_N * eff.BLOCK_SIZE_K
        )
        e, n, k, topk = p.num_experts, p.intermediate_size, p.hidden_size, p.top_k
        hit = max(expected_experts_hit(m, e, topk), 1.0)
        tokens = m * topk / hit
        blocks = math.ceil(tokens / c.BLOCK_SIZE_M)
        padding = blocks * c.BLOCK_SIZE_M / tokens
        weight_bytes = hit * 3 * n * k * 2
        reread = 1.0 + 0.35 * (blocks - 1) / (1 + eff.GROUP_SIZE_M / 8)
        memory = weight_bytes * reread / 4.0e12
        mma = 0.55 if c.BLOCK_SIZE_M < 64 else 1.0
        compute = 2 * m * topk * 3 * n * k * padding / (700e12 * mma)
        base = max(memory, compute) + 0.3 * min(memory, compute) + 4e-6

        x = math.log2(m) / 12
        bowl = 0.0
        for name in PARAM_NAMES:
            value = getattr(eff, name)
            coord = math.log2(value) if name != "num_stages" else value - 3.5
            centre = {"BLOCK_SIZE_N": 7, "BLOCK_SIZE_K": 7, "GROUP_SIZE_M": 4, "num_warps": 2}.get(
                name, 0
            )
            a, b = self.opt[name]
            if name == "BLOCK_SIZE_M":
                centre = math.log2(max(16, min(256, tokens)))
            target = centre + a + b * x
            if name == "GROUP_SIZE_M" and blocks * hit < 64:
                continue  # plateau: grouping matters only with many row blocks
            bowl += self.weight[name] * (coord - target) ** 2
        warps = 1.0
        if (eff.BLOCK_SIZE_M * eff.BLOCK_SIZE_N >= 128 * 128) != (c.num_warps == 8):
            warps = 1.06
        smem_use = (c.BLOCK_SIZE_M + c.BLOCK_SIZE_N) * c.BLOCK_SIZE_K * 2 * c.num_stages
        pressure = 1.0 + max(0.0, smem_use / self.limits.shared_memory_per_block - 0.75) * 0.3
        rugged = 1.0 + 0.03 * (_unit("rugged", self.seed, m, eff) - 0.5)
        padding_work = 1.0 + 0.03 * math.log2(excess)
        return base * 1e6 * (1.0 + bowl) * warps * pressure * rugged * padding_work

    def measure(
        self, batch_size: int, candidates: Sequence[Candidate], fidelity: str
    ) -> dict[Candidate, Measurement]:
        out = {}
        for c in candidates:
            self.calls.append((batch_size, hash(c), fidelity))
            truth = self.true_us(batch_size, c)
            common = dict(
                problem_key=self.problem.key(),
                batch_size=batch_size,
                candidate=c,
                fidelity=fidelity,
                device_name="Synthetic GPU",
                triton_version="0.0.0",
                moetune_version="test",
            )
            if truth is None:
                out[c] = Measurement.failure(
                    status=self.failure(c, batch_size), error="synthetic failure", **common
                )
                continue
            rng = self.rng
            if self.fixed_noise:
                rng = random.Random(_unit("noise", self.seed, batch_size, c, fidelity))
            observed = truth * (1.0 + rng.gauss(0.0, NOISE[fidelity]))
            out[c] = Measurement(
                status="ok",
                latency_us=observed,
                p20_us=observed * 0.99,
                p80_us=observed * 1.01,
                compile_s=0.5,
                error=None,
                timestamp=0.0,
                **common,
            )
        return out


class OtherKernelGPU(SyntheticGPU):
    """The same landscape timed on a second kernel that computes the same GEMMs with the same tiles.

    Its latency is the first kernel's times a smooth tilt in log2 parameter
    space (one kernel favours, say, deeper pipelines a little) and its own
    per-candidate ruggedness: configs rank alike but not identically, as vLLM
    0.33.0's and SGLang 0.5.23's kernels do on an H200 (the same config's time
    differs by 0.3-3 % among the best configs of a recorded Qwen3-30B tune on
    each, bench/results/h200-2026-12-02-engine-kernels/; Spearman 0.83-1.0 over
    random configs). A few candidates fail only here (compiler crashes).
    """

    def __init__(
        self,
        problem: TuneProblem,
        seed: int,
        limits: DeviceLimits | None = None,
        tilt: float = 0.02,
        rugged: float = 0.04,
        fixed_noise: bool = False,
    ):
        super().__init__(problem, seed, limits, fixed_noise)
        rnd = random.Random(seed * 104729 + 7)
        self.tilt = {name: rnd.uniform(-tilt, tilt) for name in PARAM_NAMES}
        self.rugged = rugged

    def failure(self, c: Candidate, m: int = 1) -> str | None:
        if _unit("other kernel fails", self.seed, self.effective(m, c)) < 0.005:
            return "crashed"
        return super().failure(c, m)

    def true_us(self, m: int, c: Candidate) -> float | None:
        first = super().true_us(m, c)
        if first is None:
            return None
        eff = self.effective(m, c)
        tilt = sum(
            weight * (math.log2(getattr(eff, name)) - 5) for name, weight in self.tilt.items()
        )
        rugged = self.rugged * (_unit("other kernel", self.seed, m, eff) - 0.5)
        return first * math.exp(tilt) * (1.0 + rugged)


class SyntheticBackend:
    """A `moetune.tune.measure.measurer.Backend` over a synthetic GPU, answering out of order.

    `compile_workers` warmers (compiling never fails but where the GPU's failure is a
    compiler's) and one timer. The units handed over wait together; each step finishes
    one of them chosen at random (`seed`), so outcomes come back in an order unlike any
    real run's. `log` keeps (mode, batch size, candidate) per outcome, `most_warm_held`
    the most warm units held at once; `stop_after` raises KeyboardInterrupt once that
    many outcomes have come back (a run killed midway).
    """

    parallelism = 1

    def __init__(self, gpu, compile_workers: int = 4, seed: int = 0, stop_after=None):
        self.gpu = gpu
        self.compile_workers = compile_workers
        self.rng = random.Random(seed)
        self.stop_after = stop_after
        self.log: list[tuple[str, int, Candidate]] = []
        self.most_warm_held = 0

    def run(self, units, then=None):
        from moetune.tune.measure.timing import Outcome

        held = list(units)
        while held:
            warm = sum(1 for unit in held if unit.mode == "warm")
            self.most_warm_held = max(self.most_warm_held, warm)
            unit = held.pop(self.rng.randrange(len(held)))
            outcomes = []
            for candidate in unit.candidates:
                if self.stop_after is not None and len(self.log) >= self.stop_after:
                    raise KeyboardInterrupt
                self.log.append((unit.mode, unit.batch_size, candidate))
                if unit.mode == "warm":
                    failure = self.gpu.failure(candidate, unit.batch_size)
                    final = failure in ("compile_error", "out_of_resources")
                    outcome = Outcome(candidate, failure if final else "ok", compile_s=0.5)
                else:
                    m = self.gpu.measure(unit.batch_size, [candidate], unit.mode)[candidate]
                    outcome = Outcome(
                        candidate, m.status, m.latency_us, m.p20_us, m.p80_us, error=m.error
                    )
                outcomes.append(outcome)
                yield unit, outcome
            if then is not None:
                held += list(then(unit, outcomes))

    def measure_ceilings(self):
        raise AssertionError("no ceilings on a CPU run")

    def close(self):
        pass
