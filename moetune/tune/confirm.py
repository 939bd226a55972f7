"""The confirmation round: written configs and engine baselines re-timed side by side.

A search picks the fastest of many noisy timings, and the engines' baselines
competed in that same pick, so its own timings flatter the winner. After the
search, `moetune tune` times the configs it would write and every engine
baseline again, interleaved, and takes its speedups (and its decisions) from
those timings only:

plan        `round_orders`: every round times each distinct config once at each
            batch size, in one work unit (one process, one GPU, back to back), the
            order rotated from round to round so that no config is always first;
            every config of a round reads the same routing draws (the round's seed,
            `moetune.tune.measure.worker`'s ``confirm`` mode; the same as long as the
            configs' graphs hold as many calls, which a call over 200 us may change:
            `moetune.tune.measure.timing.TARGET_REPLAY_US`) and gets a CUDA graph
            captured afresh.
statistics  per config the median over the rounds; per pair of configs the ratio
            of their medians with a `CONFIDENCE` interval from a *paired*
            bootstrap: whole rounds are resampled, so a drift (clocks, a neighbour
            on the machine) that slows every config of a round moves both medians
            together and cancels in the ratio, as it would not if each config's
            rounds were resampled on their own. Seeded (`seed_for`): the same
            timings always give the same interval.
decision    `decide`: at each batch size the tuned config replaces an engine's own
            (the file the engine would load, else its fallback) only where the
            interval of engine / tuned lies wholly above 1; otherwise that
            engine's file keeps the engine's config at that batch size.

Pure functions over recorded timings; the runner and `moetune benchmark --repeat`
do the timing.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Rounds of the confirmation in every tune (`moetune tune --confirm-rounds`; 0: none).
DEFAULT_ROUNDS = 5
CONFIDENCE = 0.95
RESAMPLES = 2000
BASE_SEED = 30  # the bootstrap's seed at batch size M is BASE_SEED + M
TUNED = "tuned"  # the name of the tuned config among a confirmation's timings
INTERVAL_METHOD = (
    f"{CONFIDENCE:.0%} paired bootstrap of the ratio of medians over interleaved rounds "
    f"({RESAMPLES} resamples of whole rounds, seeded)"
)


@dataclass(frozen=True)
class Interval:
    """A statistic and its `CONFIDENCE` interval."""

    value: float
    low: float
    high: float

    def to_json(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Interval:
        return cls(float(data["value"]), float(data["low"]), float(data["high"]))

    def short(self, digits: int = 2, suffix: str = "x") -> str:
        """``1.03x [1.01-1.05]``."""
        return f"{self.value:.{digits}f}{suffix} [{self.low:.{digits}f}-{self.high:.{digits}f}]"


def seed_for(batch_size: int) -> int:
    return BASE_SEED + batch_size


def round_orders(names: Sequence[Any], rounds: int) -> list[tuple[Any, ...]]:
    """The order each round times `names` in (duplicates dropped): rotated by one a round."""
    distinct = list(dict.fromkeys(names))
    if not distinct:
        return []
    return [
        tuple(distinct[r % len(distinct) :] + distinct[: r % len(distinct)]) for r in range(rounds)
    ]


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """The `q` quantile by linear interpolation (numpy's default)."""
    position = q * (len(sorted_values) - 1)
    lower = int(position)
    upper = min(lower + 1, len(sorted_values) - 1)
    return sorted_values[lower] + (sorted_values[upper] - sorted_values[lower]) * (position - lower)


def _bootstrap(
    rounds: Sequence[tuple[float, ...]], statistic: Any, seed: int, resamples: int = RESAMPLES
) -> Interval:
    """`statistic(rounds)` and its percentile interval over `resamples` resamples of whole
    rounds (with replacement), drawn from `random.Random(seed)`."""
    value = statistic(rounds)
    if len(rounds) < 2:
        return Interval(value, value, value)
    draw = random.Random(seed)
    count = len(rounds)
    values = sorted(
        statistic([rounds[draw.randrange(count)] for _ in range(count)]) for _ in range(resamples)
    )
    tail = (1.0 - CONFIDENCE) / 2
    return Interval(value, _quantile(values, tail), _quantile(values, 1.0 - tail))


def median_interval(samples: Sequence[float], seed: int) -> Interval:
    """The median of `samples` (one per round) with its bootstrap interval."""
    rows = [(float(s),) for s in samples]
    return _bootstrap(rows, lambda rs: statistics.median(r[0] for r in rs), seed)


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float], seed: int) -> Interval:
    """median(numerator) / median(denominator), the two timed in the same rounds (paired:
    element i of each is round i), with its paired-bootstrap interval."""
    if len(numerator) != len(denominator):
        raise ValueError("paired timings need one value per round on each side")
    rows = list(zip(map(float, numerator), map(float, denominator), strict=True))

    def ratio(rs: Sequence[tuple[float, ...]]) -> float:
        return statistics.median(r[0] for r in rs) / statistics.median(r[1] for r in rs)

    return _bootstrap(rows, ratio, seed)


@dataclass(frozen=True)
class Confirmation:
    """One batch size's interleaved rounds: per name (`TUNED`, a baseline key, a file), its
    time in each round (None: that timing failed). Names with the same config share one
    series: the config was timed once a round."""

    batch_size: int
    timings_us: Mapping[str, tuple[float | None, ...]]
    configs: Mapping[str, Any] = field(default_factory=dict)  # name -> config (for the JSON)

    @property
    def rounds(self) -> int:
        return max((len(series) for series in self.timings_us.values()), default=0)

    def _series(self, *names: str) -> list[tuple[float, ...]] | None:
        """The rounds in which every one of `names` was timed, as tuples; None if none was."""
        if any(name not in self.timings_us for name in names):
            return None
        rows = [
            values
            for values in zip(*(self.timings_us[name] for name in names), strict=True)
            if all(v is not None for v in values)
        ]
        return rows or None

    def median(self, name: str) -> Interval | None:
        rows = self._series(name)
        if rows is None:
            return None
        return median_interval([r[0] for r in rows], seed_for(self.batch_size))

    def ratio(self, numerator: str, denominator: str) -> Interval | None:
        """median(numerator) / median(denominator) over the rounds both were timed in; the
        speedup of `denominator` over `numerator` when both are times."""
        if numerator == denominator or self.same_config(numerator, denominator):
            return Interval(1.0, 1.0, 1.0) if self._series(numerator) else None
        rows = self._series(numerator, denominator)
        if rows is None:
            return None
        return ratio_interval([r[0] for r in rows], [r[1] for r in rows], seed_for(self.batch_size))

    def same_config(self, a: str, b: str) -> bool:
        config_a, config_b = self.configs.get(a), self.configs.get(b)
        return config_a is not None and config_a == config_b

    def to_json(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "timings_us": {name: list(series) for name, series in self.timings_us.items()},
            "median_us": {
                name: None if (found := self.median(name)) is None else found.to_json()
                for name in self.timings_us
            },
        }


def faster_beyond_noise(confirmation: Confirmation, tuned: str, engine: str) -> bool:
    """Whether `tuned` is faster than `engine`'s config beyond the noise: the interval of
    engine / tuned lies wholly above 1."""
    ratio = confirmation.ratio(engine, tuned)
    return ratio is not None and ratio.low > 1.0


@dataclass(frozen=True)
class Decision:
    """What one engine's file holds at one batch size."""

    engine: str
    written: str  # TUNED, or the baseline key whose config is kept
    against: str | None  # the engine's own config it was compared with (None: none timed)
    ratio: Interval | None  # engine's time / tuned time

    @property
    def kept_engine_config(self) -> bool:
        return self.written != TUNED


def engine_reference(engine: str, confirmation: Confirmation) -> str | None:
    """The engine's own config at this batch size: the file it would load, else its
    fallback (the one of them that was timed)."""
    for key in (f"{engine}_file", f"{engine}_fallback"):
        if confirmation.median(key) is not None:
            return key
    return None


def decide(
    confirmation: Confirmation, engines: Sequence[str], tuned: str = TUNED
) -> list[Decision]:
    """Per engine, the config its file gets at this batch size (see the module docstring).

    The tuned config is written where it beats the engine's own beyond the noise, where
    it is that very config, or where the engine's own was not timed (none runnable, or
    it failed); a tuned config that was not timed at all is never written over one that was.
    """
    decisions = []
    for engine in engines:
        reference = engine_reference(engine, confirmation)
        if reference is None:
            decisions.append(Decision(engine, tuned, None, None))
            continue
        ratio = confirmation.ratio(reference, tuned)
        same = confirmation.same_config(reference, tuned)
        wins = same or faster_beyond_noise(confirmation, tuned, reference)
        decisions.append(Decision(engine, tuned if wins else reference, reference, ratio))
    return decisions


def written_speedup(
    confirmation: Confirmation, decisions: Sequence[Decision], baseline: str, tuned: str = TUNED
) -> Interval | None:
    """The speedup of what the baseline's engine's file holds over `baseline`: baseline time
    over the written config's time (the tuned one, or the engine config kept)."""
    engine = baseline.split("_", 1)[0]
    written = next((d.written for d in decisions if d.engine == engine), tuned)
    return confirmation.ratio(baseline, written)


ROUND_STRIDE = 7919


def round_seed(round_index: int, batch_size: int) -> int:
    """The routing draws of one round at one batch size (every config of it reads them)."""
    return ROUND_STRIDE * (round_index + 1) + batch_size


def round_of(seed: int, batch_size: int) -> int:
    """The round a unit's seed belongs to (`round_seed` read back)."""
    return (seed - batch_size) // ROUND_STRIDE - 1


def confirmation_units(
    problem: Any, named: Mapping[int, Mapping[str, Any]], rounds: int
) -> list[Any]:
    """The work units of `rounds` interleaved rounds: per round, per batch size, one unit
    timing each distinct config of ``named[M]`` (name -> config) once, in `round_orders`."""
    from moetune.tune.measure.worker import WorkUnit

    orders = {m: round_orders(list(configs.values()), rounds) for m, configs in named.items()}
    return [
        WorkUnit(problem, m, orders[m][r], "confirm", seed=round_seed(r, m))
        for r in range(rounds)
        for m in named
        if orders[m]
    ]


def time_rounds(
    backend: Any, problem: Any, named: Mapping[int, Mapping[str, Any]], rounds: int
) -> dict[int, Confirmation]:
    """Run the confirmation's units on `backend` (`moetune.tune.measure.measurer.Backend`)
    and gather, per batch size, each name's time in each round (None: failed)."""
    from moetune.tune.environment import ENVIRONMENT, WorkerEnvironmentError

    times: dict[int, dict[Any, list[float | None]]] = {
        m: {config: [None] * rounds for config in configs.values()} for m, configs in named.items()
    }
    for unit, outcome in backend.run(confirmation_units(problem, named, rounds)):
        if outcome.status == ENVIRONMENT:
            raise WorkerEnvironmentError(outcome.error or "an unknown environment error")
        index = round_of(unit.seed, unit.batch_size)
        ok = outcome.status == "ok" and outcome.latency_us is not None
        times[unit.batch_size][outcome.candidate][index] = outcome.latency_us if ok else None
    return {
        m: Confirmation(
            m,
            {name: tuple(times[m][config]) for name, config in configs.items()},
            dict(configs),
        )
        for m, configs in named.items()
    }


# Finalists: the search's runners-up whose full-fidelity time is within FINALIST_SPREAD of its
# pick are confirmed with it, and the one with the lowest median is written.
FINALIST_SPREAD = 0.02
MAX_FINALISTS = 3  # the pick included
FINALIST = "finalist"  # names "finalist 2", "finalist 3" ... in a confirmation's timings


def finalists(
    ranking: Sequence[tuple[Any, float]], pick: Any, spread: float = FINALIST_SPREAD
) -> list[Any]:
    """The configs ranked after `pick` in `ranking` ((config, search time), fastest first)
    whose time is within `spread` of the pick's, at most ``MAX_FINALISTS - 1`` of them:
    within the noise of one timing, the search cannot tell them from its pick."""
    order = [config for config, _ in ranking]
    if pick not in order:
        return []
    start = order.index(pick)  # those ranked above the pick failed the check against the reference
    limit = ranking[start][1] * (1.0 + spread)
    others = [config for config, us in ranking[start + 1 :] if config != pick and us <= limit]
    return others[: MAX_FINALISTS - 1]


def choose_finalist(confirmation: Confirmation) -> Confirmation:
    """The confirmation with `TUNED` naming the finalist of lowest median (the search's pick
    and its runners-up named ``finalist N``); the others keep ``finalist N`` names, the
    pick's becomes ``finalist 1``. Unchanged when the pick has the lowest median."""
    names = [TUNED] + [name for name in confirmation.timings_us if name.startswith(FINALIST)]
    medians = {name: confirmation.median(name) for name in names}
    timed = {name: median.value for name, median in medians.items() if median is not None}
    if not timed:
        return confirmation
    best = min(timed, key=lambda name: (timed[name], name != TUNED))
    if best == TUNED:
        return confirmation
    swap = {TUNED: f"{FINALIST} 1", best: TUNED}
    return Confirmation(
        confirmation.batch_size,
        {swap.get(name, name): series for name, series in confirmation.timings_us.items()},
        {swap.get(name, name): config for name, config in confirmation.configs.items()},
    )
