"""The plan's time estimate: every stage a tune goes through, priced at measured rates.

The rates are data (``moetune/data/estimate_rates.yaml``, read by `rate_table`): per GPU,
seconds of each kind of work, each citing the run and the bench/ script it was fitted
with; beside them the counts of timings a search takes, which are the search's and not
the machine's. A device with no entry (another GPU, or the CPU interpreter) is priced at
the default GPU's rates, and the plan says so (`estimate_note`).

The stages of one plan (`estimate`), in the order they run:

- start-up, once a run: the command's imports and plan, the worker processes loading
  torch, Triton and CUDA, the first compiles;
- search: the whole-call searches of every batch size run side by side
  (`moetune.tune.search.strategy`), so compile processes and the GPU's timer work
  together, and a search takes the longer of its compiling (CPU seconds per timing by
  kernel dtype family, over the compile processes) and its timings on the timer, times a
  tail factor for the rounds that wait on a last slow compile. Fast and thorough search
  time a share of the pruned (candidate, batch size) pairs; a transfer (a second kernel's
  plan of the same problem, seeded from the first one's results) about a fixed number per
  batch size; exhaustive search times every pair one after another;
- baselines: each engine's fallback config and the file it loads today, one timing per
  batch size each (timed alongside the search, so mostly spent inside it);
- split (engines that read a down table, `moetune.tune.search.split_search`): lone-GEMM
  timings and whole calls with split configs, each at its rate, waits included: the batch
  sizes run side by side and each round asks every GEMM variant at once;
- confirm (`moetune.tune.confirm`, ``--confirm-rounds``; none with 0): each round times
  at every batch size the pick, its runners-up and every baseline once, in a fresh CUDA
  graph each;
- fixed, per plan: the check against the reference, the ceilings, the files.

Long calls: those rates hold while one call is shorter than a replay
(`moetune.tune.measure.timing.TARGET_REPLAY_US`: the graph then holds several calls). A
longer call (a large M on a large shape) is replayed alone, so a timing at that M takes
at least its calls: the compile call, the sizing call and the full fidelity's warm-up and
timed replays, each a measured factor over the roofline floor at the GPU's ceilings.

It is an estimate for the machine the rates were measured on: fewer CPU cores compile
slower, and a search that needs more rounds takes longer. BENCHMARKS.md's "Tune time"
holds it against measured walls.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from moetune.dtypes import compile_family as dtype_compile_family
from moetune.errors import InvalidMappingsError

if TYPE_CHECKING:
    from moetune.tune.problem import TuneProblem
    from moetune.tune.runner import TunePlan, TuneRequest

RATES_PATH = Path(__file__).resolve().parents[1] / "data" / "estimate_rates.yaml"
BASELINES_PER_ENGINE = 2  # its fallback config and the file it would load today
# A CPU plan with more pruned pairs than this is a full-size tune: the plan hints at --space.
CPU_HINT_PAIRS = 200

# How a plan's rates were chosen: the device's own, another GPU's, or the CPU interpreter's
# (which has none).
MEASURED, OTHER_GPU, CPU = "measured", "other_gpu", "cpu_interpreter"

# The rates of a GPU entry and the counts, by kind of value.
SCALAR_RATES = (
    "startup_s",
    "seconds_per_plan",
    "seconds_per_timed",
    "compile_workers",
    "timer_s_per_timing",
    "seconds_per_lone",
    "seconds_per_pair",
    "confirm_s_per_timing",
    "call_over_floor",
    "read_bytes_per_s",
)
TABLE_RATES = ("compile_s_per_timing", "search_tail", "peak_flops")
COUNTS = (
    "fast_search_share",
    "thorough_search_share",
    "transfer_per_batch",
    "fast_split_lone",
    "thorough_split_share",
    "confirm_runners_up",
)
_SOURCE_KEYS = {"value", "what", "source", "script", "measured_on"}


@dataclass(frozen=True)
class RateSource:
    """Where one rate comes from: the run (`source`), the script that fits it, the GPU."""

    source: str
    script: str | None = None
    measured_on: str | None = None
    what: str | None = None


@dataclass(frozen=True)
class Rates:
    """One GPU's rates and the search's counts: everything `estimate` prices with.

    Seconds unless named otherwise; `compile_s_per_timing` by compile family
    (`moetune.dtypes.compile_family`), `search_tail` by compile family, ``fast`` (any
    other) or ``transfer``, `peak_flops` by `moetune.roofline.peak_kind`.
    """

    gpu: str
    machine: str
    startup_s: float
    seconds_per_plan: float
    seconds_per_timed: float
    compile_workers: float
    timer_s_per_timing: float
    seconds_per_lone: float
    seconds_per_pair: float
    confirm_s_per_timing: float
    call_over_floor: float
    read_bytes_per_s: float
    compile_s_per_timing: Mapping[str, float]
    search_tail: Mapping[str, float]
    peak_flops: Mapping[str, float]
    fast_search_share: float
    thorough_search_share: float
    transfer_per_batch: float
    fast_split_lone: float
    thorough_split_share: float
    confirm_runners_up: float
    sources: Mapping[str, RateSource] = field(default_factory=dict, compare=False)

    def search_share(self, search: str) -> float:
        """The share of the pruned (candidate, batch size) pairs a whole-call search times."""
        return {"exhaustive": 1.0, "thorough": self.thorough_search_share}.get(
            search, self.fast_search_share
        )


@dataclass(frozen=True)
class RateTable:
    """The rates of every GPU measured (`gpus`), and which one prices the others."""

    gpus: tuple[Rates, ...]
    matches: Mapping[str, str]  # GPU name -> the word of a torch device name that picks it
    default: str

    @property
    def default_rates(self) -> Rates:
        return next(rates for rates in self.gpus if rates.gpu == self.default)

    def for_device(self, device_name: str) -> Rates | None:
        """The rates measured on `device_name`'s GPU (its torch name), or None."""
        words = set(re.split(r"[\s_]+", device_name.strip().upper()))
        return next((r for r in self.gpus if self.matches[r.gpu].upper() in words), None)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidMappingsError(f"{where}: {value!r} is not a positive number")
    return float(value)


def _entry(data: Any, where: str, table: bool) -> tuple[Any, RateSource]:
    """One rate's value and its citation, checked."""
    if not isinstance(data, dict):
        raise InvalidMappingsError(f"{where}: expected a mapping with value and source")
    unknown = sorted(set(data) - _SOURCE_KEYS)
    if unknown:
        raise InvalidMappingsError(f"{where}: unknown key {unknown[0]!r}")
    source = data.get("source")
    if not isinstance(source, str) or not source.strip():
        raise InvalidMappingsError(f"{where}: no source (the run the rate was fitted on)")
    for key in ("what", "script", "measured_on"):
        if key in data and not isinstance(data[key], str):
            raise InvalidMappingsError(f"{where}.{key}: expected text")
    value = data.get("value")
    if table:
        if not isinstance(value, dict) or not value:
            raise InvalidMappingsError(f"{where}.value: expected a mapping of names to numbers")
        checked: Any = {str(k): _number(v, f"{where}.value.{k}") for k, v in value.items()}
    else:
        checked = _number(value, f"{where}.value")
    cited = RateSource(source, data.get("script"), data.get("measured_on"), data.get("what"))
    return checked, cited


def _section(data: Any, names: Sequence[str], where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InvalidMappingsError(f"{where}: expected a mapping")
    missing = [name for name in names if name not in data]
    if missing:
        raise InvalidMappingsError(f"{where}: no {missing[0]}")
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise InvalidMappingsError(f"{where}: unknown rate {unknown[0]!r}")
    return data


def load_rates(path: Path | str | None = None) -> RateTable:
    """The rate table at `path` (default: the packaged one), checked: one line per problem."""
    source = Path(path) if path else RATES_PATH
    try:
        data = yaml.safe_load(source.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidMappingsError(f"{source}: cannot read the estimate's rates: {exc}") from exc
    top = _section(data, ("default", "counts", "gpus"), str(source))
    counts = _section(top["counts"], COUNTS, f"{source}: counts")
    count_values: dict[str, Any] = {}
    cited: dict[str, RateSource] = {}
    for name in COUNTS:
        count_values[name], cited[name] = _entry(counts[name], f"{source}: counts.{name}", False)
    if not isinstance(top["gpus"], list) or not top["gpus"]:
        raise InvalidMappingsError(f"{source}: gpus: expected a list of GPU entries")
    gpus: list[Rates] = []
    matches: dict[str, str] = {}
    for index, gpu in enumerate(top["gpus"]):
        where = f"{source}: gpus[{index}]"
        entry = _section(gpu, ("name", "match", "machine", "rates"), where)
        for key in ("name", "match", "machine"):
            if not isinstance(entry[key], str) or not entry[key].strip():
                raise InvalidMappingsError(f"{where}.{key}: expected text")
        rates = _section(entry["rates"], SCALAR_RATES + TABLE_RATES, f"{where}.rates")
        values = dict(count_values)
        sources = dict(cited)
        for name in SCALAR_RATES + TABLE_RATES:
            values[name], sources[name] = _entry(
                rates[name], f"{where}.rates.{name}", name in TABLE_RATES
            )
        gpus.append(Rates(gpu=entry["name"], machine=entry["machine"], sources=sources, **values))
        matches[entry["name"]] = entry["match"]
    if top["default"] not in matches:
        raise InvalidMappingsError(
            f"{source}: default: {top['default']!r} names no GPU entry ({', '.join(matches)})"
        )
    return RateTable(tuple(gpus), matches, top["default"])


@lru_cache(maxsize=1)
def rate_table() -> RateTable:
    """The packaged rate table (read once)."""
    return load_rates()


def default_rates() -> Rates:
    """The rates a device without its own is priced at."""
    return rate_table().default_rates


def device_rates(request: TuneRequest, table: RateTable | None = None) -> tuple[Rates, str]:
    """The rates that price `request`'s run and how they were chosen (`MEASURED`,
    `OTHER_GPU` or `CPU`: the last two are the default GPU's rates)."""
    table = table or rate_table()
    if not request.on_gpu:
        return table.default_rates, CPU
    found = table.for_device(request.device_name)
    return (found, MEASURED) if found is not None else (table.default_rates, OTHER_GPU)


@dataclass(frozen=True)
class Estimate:
    """Expected wall time of one plan, and what it is made of."""

    seconds: float
    pairs: int  # (candidate, batch size) pairs left after pruning
    timed: int  # whole-call timings the search is expected to take
    split: bool = False  # an SGLang split search runs (its share is in `seconds`)
    lone: int = 0  # lone-GEMM timings the split search is expected to take
    stages: tuple[tuple[str, float], ...] = ()  # (stage, seconds), in the order they run
    # Batch size -> least seconds of one timing there, where its calls outlast the rates.
    long_timing_s: Mapping[int, float] = field(default_factory=dict)
    # Seconds of the search stage each of its whole-call timings stands for (progress bar).
    search_rate: float | None = None
    rates: Rates = field(default_factory=default_rates)  # what priced it
    basis: str = MEASURED  # how `rates` were chosen for the device (`device_rates`)
    confirms: int = 0  # the confirmation's timings

    def __post_init__(self) -> None:
        if self.search_rate is None:
            object.__setattr__(self, "search_rate", self.rates.seconds_per_timed)

    def stage_seconds(self, name: str) -> float:
        return dict(self.stages).get(name, 0.0)

    def timing_seconds(self, rate: float, batch_size: int | None = None) -> float:
        """Seconds of one timing at `rate` and `batch_size` (its calls' time where longer)."""
        return max(rate, self.long_timing_s.get(batch_size, 0.0)) if batch_size else rate


def long_timing_seconds(problem: TuneProblem, batch_size: int, rates: Rates | None = None) -> float:
    """Least seconds of one whole-call timing at `batch_size`: its calls' time."""
    from moetune.roofline import moe_roofline, peak_kind
    from moetune.tune.measure.timing import FIDELITIES

    rates = rates or default_rates()
    full = FIDELITIES["full"]
    calls = 2 + full.warmup + full.replays  # compile, size the graph, then one call a replay
    roof = moe_roofline(
        batch_size,
        problem.num_experts,
        problem.intermediate_size,
        problem.hidden_size,
        problem.top_k,
        problem.dtype,
        problem.engine_block_shape,
        per_channel=problem.per_channel,
    )
    peak = rates.peak_flops[peak_kind(problem.dtype)]
    return calls * rates.call_over_floor * roof.floor_seconds(rates.read_bytes_per_s, peak)


def compile_family(problem: TuneProblem) -> str:
    """The kernel dtype family whose compile rate prices `problem` (`compile_s_per_timing`):
    its quant_rules.yaml ``kernels:`` row's ``compile_family`` (`moetune.dtypes.compile_family`)."""
    return dtype_compile_family(
        problem.dtype, block_shape=problem.block_shape, per_channel=problem.per_channel
    )


def search_seconds(
    problem: TuneProblem,
    timed_per_m: Mapping[int, float],
    long: Mapping[int, float],
    tail: float,
    rates: Rates | None = None,
) -> float:
    """A whole-call search's wall: compiling over the compile processes or timing on the
    timer, whichever is longer (a long call's timing takes its calls' time), times `tail`."""
    rates = rates or default_rates()
    per_timing = rates.compile_s_per_timing[compile_family(problem)]
    compiling = sum(timed_per_m.values()) * per_timing / rates.compile_workers
    timing = sum(
        n * max(rates.timer_s_per_timing, long.get(m, 0.0)) for m, n in timed_per_m.items()
    )
    return tail * max(compiling, timing)


def split_variant_count(plan: TunePlan) -> int:
    """The GEMM variants the split search times (TMA ones the shape rules out left out)."""
    from moetune.tune.search.split_fast import tma_rule_out
    from moetune.tune.search.split_search import SplitOptions, variants

    found = variants(SplitOptions(up_tma=plan.request.up_tma))
    return sum(1 for kind, tma in found if not tma or tma_rule_out(plan.problem, kind) is None)


def estimate(plan: TunePlan, *, first: bool = True, rates: Rates | None = None) -> Estimate:
    """Expected wall time of one plan (module docstring); `first`: the run's first plan, which
    pays the start-up of the worker processes; `rates`: instead of the device's."""
    from moetune.tune.search.split import split_engines

    found, basis = device_rates(plan.request)
    rates = rates or found
    request = plan.request
    batch_sizes = len(request.batch_sizes)
    kept = {m: len(report.kept) for m, report in plan.pruning.items()}
    pairs = sum(kept.values())
    exhaustive = request.search == "exhaustive"
    share = rates.search_share(request.search)
    timed_per_m = {m: share * count for m, count in kept.items()}
    if plan.seeded_from is not None:  # a transfer: about as many timings per batch size
        timed_per_m = {m: min(rates.transfer_per_batch, count) for m, count in kept.items()}
        timed = math.ceil(sum(timed_per_m.values()))
    else:
        timed = math.ceil(pairs * share)  # exhaustive: every pair (share 1)
    per_engine = BASELINES_PER_ENGINE * len(request.engines)
    baselines = per_engine * batch_sizes
    split = bool(split_engines(request.engines))
    lone = split_confirms = 0
    lone_per_m: dict[int, float] = {}
    if split:
        gemms = split_variant_count(plan)
        if exhaustive:
            lone = pairs * gemms
            lone_per_m = {m: kept.get(m, 0) * gemms for m in request.batch_sizes}
        elif request.search == "thorough":
            lone = math.ceil(rates.thorough_split_share * timed * gemms)
            lone_per_m = {
                m: rates.thorough_split_share * share * kept.get(m, 0) * gemms
                for m in request.batch_sizes
            }
        else:
            lone = math.ceil(rates.fast_split_lone * gemms * batch_sizes)
            lone_per_m = dict.fromkeys(request.batch_sizes, rates.fast_split_lone * gemms)
        split_confirms = 2 * batch_sizes  # the pair and the single config, as whole calls
    # The confirmation: each round times the pick, its runners-up and the baselines once.
    confirm_per_m = request.confirm_rounds * (1 + rates.confirm_runners_up + per_engine)
    confirms = math.ceil(confirm_per_m * batch_sizes)
    # Where a batch size's calls outlast the rates, its timings take their calls' time.
    long = {m: long_timing_seconds(plan.problem, m, rates) for m in request.batch_sizes}

    def beyond(rate: float, count: Callable[[int], float]) -> float:
        return sum(count(m) * max(0.0, long[m] - rate) for m in request.batch_sizes)

    timed_rate = rates.seconds_per_timed
    if exhaustive:
        search_s = timed_rate * timed + beyond(timed_rate, lambda m: timed_per_m.get(m, 0))
    else:
        if plan.seeded_from is not None:
            tail = rates.search_tail["transfer"]
        else:
            tail = rates.search_tail.get(compile_family(plan.problem), rates.search_tail["fast"])
        search_s = search_seconds(plan.problem, timed_per_m, long, tail, rates)
    split_s = rates.seconds_per_lone * lone + rates.seconds_per_pair * split_confirms
    if split:
        split_s += beyond(rates.seconds_per_lone, lambda m: lone_per_m.get(m, 0))
        split_s += beyond(rates.seconds_per_pair, lambda m: 2)
    confirm_rate = rates.confirm_s_per_timing
    stages = (
        ("start-up", rates.startup_s if first else 0.0),
        ("search", search_s),
        ("baselines", timed_rate * baselines + beyond(timed_rate, lambda m: per_engine)),
        ("split", split_s),
        ("confirm", confirm_rate * confirms + beyond(confirm_rate, lambda m: confirm_per_m)),
        ("fixed", rates.seconds_per_plan),
    )
    seconds = sum(value for _, value in stages)
    rate = search_s / timed if timed else timed_rate
    return Estimate(seconds, pairs, timed, split, lone, stages, long, rate, rates, basis, confirms)


def estimates(plans: Sequence[TunePlan], rates: Rates | None = None) -> list[Estimate]:
    """Each plan's estimate; the first pays the run's start-up (one worker pool serves all)."""
    return [estimate(plan, first=index == 0, rates=rates) for index, plan in enumerate(plans)]


def estimate_s(plans: Sequence[TunePlan], rates: Rates | None = None) -> float:
    """The run's estimate in seconds: every plan's, in order."""
    return sum(est.seconds for est in estimates(plans, rates))


def estimate_note(est: Estimate) -> str:
    """What the estimate is for: the rates' GPU, and why when the device is another."""
    gpu = est.rates.gpu
    if est.basis == CPU:
        return f"for an {gpu}: the CPU interpreter has no rates"
    if est.basis == OTHER_GPU:
        return f"for an {gpu}: no rates measured on this GPU"
    return f"at the rates measured on an {gpu}; other machines differ"


def cpu_hint(ests: Sequence[Estimate]) -> list[str]:
    """On the CPU interpreter, for a full-size plan: that it takes hours, and what to pass."""
    if not any(est.basis == CPU and est.pairs > CPU_HINT_PAIRS for est in ests):
        return []
    return [
        "TRITON_INTERPRET=1 runs a full-size tune for hours; pass a small",
        "--space (like tests/tune/data/tiny-space.json) to try it out",
    ]


def with_rates(rates: Rates, **changes: Any) -> Rates:
    """`rates` with some values changed (a table's entries merged, not replaced)."""
    merged = {
        name: {**getattr(rates, name), **value} if name in TABLE_RATES else value
        for name, value in changes.items()
    }
    return dataclasses.replace(rates, **merged)
