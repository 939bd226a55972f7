"""How far a tune has come, in the estimate's seconds: what `moetune tune`'s progress bar counts.

The plan's estimate (`moetune.tune.estimate.estimate`) prices every stage: each
whole-call, lone-GEMM and pair timing at its measured rate, the run's start-up
(the worker processes, on the first plan) and the fixed part (the check against
the reference, ceilings, files). The meter adds each timing's price as it
arrives (its calls' time at a batch size whose calls outlast the rates), the
start-up at the first timing, the fixed part in four equal shares: at the
first timing, and as the stages after the check, the ceilings and the files
begin or the run ends, and the confirmation (whose timings are not reported one
by one) as the stage after it begins. When a run needs more than the estimate, the total grows
with it.

`SweepMeter` puts the plans of one run (each engine's kernel, each shape of a
sweep) end to end, so one bar and one ETA cover the whole command.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Stages whose time is the fixed part; each is credited as the next one begins.
FIXED_STAGES = ("verify", "ceilings", "files")


class WorkMeter:
    """Estimated seconds done out of `total`; `stage` names come from `runner.STAGES`."""

    def __init__(self, estimate: Any) -> None:
        self.estimate = estimate
        self.total = float(estimate.seconds)
        self.fixed_share = estimate.stage_seconds("fixed") / (len(FIXED_STAGES) + 1)
        self.startup = estimate.stage_seconds("start-up")
        self.rates = {
            "whole": estimate.search_rate,
            "up": estimate.rates.seconds_per_lone,
            "down": estimate.rates.seconds_per_lone,
            "pair": estimate.rates.seconds_per_pair,
        }
        self.done = 0.0
        self.current = ""
        self.started = False

    def _add(self, seconds: float) -> None:
        self.done += seconds
        if self.done > self.total:
            self.total = self.done * 1.05  # more work than estimated: the bar makes room

    def measured(self, kind: str, batch_size: int | None = None) -> None:
        """One timing of `kind` ("whole", "up", "down" or "pair") at `batch_size` arrived:
        its rate, or its calls' time where they are longer (`Estimate.timing_seconds`)."""
        if not self.started:
            self.started = True
            self._add(self.startup + self.fixed_share)
        rate = self.rates.get(kind, self.rates["whole"])
        self._add(self.estimate.timing_seconds(rate, batch_size))

    def stage(self, name: str) -> None:
        """Stage `name` begins: the one before it is done."""
        if self.current in FIXED_STAGES:
            self._add(self.fixed_share)
        elif self.current == "confirm":
            self._add(self.estimate.stage_seconds("confirm"))
        self.current = name

    def finish(self) -> None:
        self.done = self.total


class SweepMeter:
    """The meters of a run's plans, in the order they run, as one: `done` out of `total`."""

    def __init__(self, estimates: Sequence[Any]) -> None:
        self.meters = [WorkMeter(estimate) for estimate in estimates]

    def start(self, index: int) -> WorkMeter:
        """Plan `index` begins (those before it are done); its meter."""
        for meter in self.meters[:index]:
            meter.finish()
        return self.meters[index]

    @property
    def done(self) -> float:
        return sum(meter.done for meter in self.meters)

    @property
    def total(self) -> float:
        return sum(meter.total for meter in self.meters)

    def finish(self) -> None:
        for meter in self.meters:
            meter.finish()
