"""Split up/down configs: which engines read them, and the rule that picks the pair.

SGLang reads two tables per shape: ``<name>.json`` for the gate/up GEMM and
``<name>_down.json`` for the down GEMM, whose entries may carry ``"USE_TMA"``.
One alignment (sort by expert, padded to BLOCK_SIZE_M) feeds both GEMMs, so
the two configs of one batch size must share BLOCK_SIZE_M. vLLM reads one
table for both GEMMs (`moetune.engines.formats.ENGINE_FORMATS` says which engines
read two), except 0.34 on one serving path: its ``_down.json`` pairs a down config
with the main file's, searched by `moetune.tune.search.split_vllm` with the same
search and the same whole-call confirmation.

The selection rule is SGLang's sep tuner's (TUNE-V2): time each GEMM alone,
keep the fastest config per BLOCK_SIZE_M (over the TMA variants too), then take
the BLOCK_SIZE_M whose up + down time is smallest. The pair is then timed as a
whole call against the best single config in the same harness; the split pair
is written only when it is strictly faster, so it is never slower than what
vLLM's single config gives (`decide`).

When the single config wins, the ``_down`` file repeats it with
``"USE_TMA": false``: SGLang then finds a ``_down`` file (no "down_moe=False"
warning) and runs exactly what the one-config kernel runs. Every ``_down``
entry carries an explicit ``USE_TMA``, as SGLang's tuner writes. The up file
carries ``USE_TMA`` only when it is true (only SGLang since PR #33559 reads it
there; older versions would pass the key on to the kernel).

Everything here is pure: measurements in, choices out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from moetune.engines.formats import ENGINE_FORMATS
from moetune.kernel.config import Candidate
from moetune.kernel.probe import Probe


def reads_down_file(engine: str) -> bool:
    return ENGINE_FORMATS[engine].reads_down_file


def split_engines(engines: Iterable[str]) -> tuple[str, ...]:
    """The engines among `engines` that read a separate down table."""
    return tuple(engine for engine in engines if reads_down_file(engine))


def best_per_block_m(timings: Iterable[tuple[Probe, float]]) -> dict[int, tuple[Probe, float]]:
    """The fastest probe per BLOCK_SIZE_M (ties: the one seen first)."""
    best: dict[int, tuple[Probe, float]] = {}
    for probe, latency in timings:
        block_m = probe.candidate.BLOCK_SIZE_M
        if block_m not in best or latency < best[block_m][1]:
            best[block_m] = (probe, latency)
    return dict(sorted(best.items()))


@dataclass(frozen=True)
class PairChoice:
    """The pair the per-GEMM timings point to, and the sums they were chosen on."""

    block_m: int
    up: Probe
    down: Probe
    estimate_us: float  # up + down, each timed alone
    sums: dict[int, float]  # BLOCK_SIZE_M -> up + down, for every BLOCK_SIZE_M both have

    def pair(self) -> Probe:
        """The whole-call probe that confirms this choice."""
        return Probe(
            "pair", self.up.candidate, self.up.use_tma, self.down.candidate, self.down.use_tma
        )


def choose_pair(
    up: Mapping[int, tuple[Probe, float]], down: Mapping[int, tuple[Probe, float]]
) -> PairChoice | None:
    """The BLOCK_SIZE_M with the smallest up + down time (ties: the smaller BLOCK_SIZE_M).

    `up` and `down` are `best_per_block_m` of each GEMM's timings. None when no
    BLOCK_SIZE_M has both.
    """
    sums = {m: up[m][1] + down[m][1] for m in sorted(set(up) & set(down))}
    if not sums:
        return None
    block_m = min(sums, key=lambda m: (sums[m], m))
    return PairChoice(block_m, up[block_m][0], down[block_m][0], sums[block_m], sums)


def decide(pair_us: float | None, single_us: float | None) -> bool:
    """Whether the split pair is written: only when it is strictly faster as a whole call."""
    if pair_us is None:
        return False
    return single_us is None or pair_us < single_us


@dataclass(frozen=True)
class SplitResult:
    """One batch size's outcome: what goes into the up and down tables, and why."""

    batch_size: int
    single: Candidate
    single_us: float | None  # the single config, whole call in the pair harness
    choice: PairChoice | None
    pair_us: float | None  # the chosen pair, same harness
    split: bool  # True: the pair is written; False: the single config in both tables
    rel_rms: float | None = None
    stopped: str | None = None  # why the search confirmed no pair (fast search's stop rule)
    reference_us: float | None = None  # the single config's up + down, each timed alone
    seeded_us: float | None = None  # the fast search's best up + down before its climb

    @property
    def speedup(self) -> float | None:
        if not self.split or self.pair_us is None or self.single_us is None:
            return None
        return self.single_us / self.pair_us

    def up_entry(self) -> dict[str, Any]:
        if self.split and self.choice is not None:
            return self.choice.pair().up_config()
        return self.single.as_config()

    def down_entry(self) -> dict[str, Any]:
        if self.split and self.choice is not None:
            pair = self.choice.pair()
            assert pair.down is not None
            return {**pair.down.as_config(), "USE_TMA": pair.down_tma}
        return {**self.single.as_config(), "USE_TMA": False}


def single_entries(results: Mapping[int, Candidate]) -> tuple[dict[int, dict], dict[int, dict]]:
    """Up and down tables when nothing was split: the single config in both, no TMA."""
    up = {m: results[m].as_config() for m in results}
    down = {m: {**results[m].as_config(), "USE_TMA": False} for m in results}
    return up, down


def split_entries(splits: Iterable[SplitResult]) -> tuple[dict[int, dict], dict[int, dict]]:
    """The up and down tables of a split tune, batch size -> entry."""
    up, down = {}, {}
    for result in splits:
        up[result.batch_size] = result.up_entry()
        down[result.batch_size] = result.down_entry()
    return up, down
