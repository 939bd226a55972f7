"""The tuner's public API: what bench/ and scripts/ may use of `moetune.tune`.

Everything else under moetune/tune/ may change without notice; bench/ imports
from `moetune.tune` only through this module (tests/bench/test_api_only.py holds
it to that), so a change inside tune/ touches this file, not every benchmark.

What it offers, by task:

- plan a tune: `SweepRequest` (what `moetune tune` asks, as values) and `plan`;
  one problem's `TuneRequest`, `make_plan` and `TunePlan`; `problem_of` (the
  problem one rank of a layout runs) and `engine_file_path` (where its file goes);
- the search space: `default_space`, `prune` and its rules;
- measure into a store: `RunContext`, `StoreMeasurer`, `WorkerPool`, `WorkUnit`;
- replay a search: `fast_search`, `exhaustive_search`, `transfer_search`, their
  options, and SGLang's split search (`tune_split`);
- read a store: `ResultStore`, `Measurement`, `STORE_FILENAME`;
- time one call with the tuner's harness: `time_fused_moe`, `time_bench`,
  `capture_graph`, `FIDELITIES`, `measure_probe`, `check_output`, `measure_ceilings`.
"""

from __future__ import annotations

from moetune.extract.layouts import resolve_layouts
from moetune.tune.measure.ceilings import MATMUL_SIZE, READ_BYTES, measure_ceilings
from moetune.tune.measure.measurer import FINAL_WARM_FAILURES, RunContext, StoreMeasurer
from moetune.tune.measure.probe_timing import drop_routing_streams, measure_probe
from moetune.tune.measure.timing import (
    FIDELITIES,
    Outcome,
    capture_graph,
    time_bench,
    time_fused_moe,
)
from moetune.tune.measure.verify import check_output
from moetune.tune.measure.worker import FollowUp, WorkerPool, WorkUnit
from moetune.tune.output import engine_file_path
from moetune.tune.problem import TuneProblem
from moetune.tune.request import QuantChoice, SweepRequest
from moetune.tune.runner import TunePlan, TuneRequest, make_plan
from moetune.tune.search.space import (
    DEFAULT_VALUES,
    PRUNE_RULES,
    PruneReport,
    Rule,
    default_space,
    prune,
    prune_rules,
    swap_ab_candidates,
)
from moetune.tune.search.split import SplitResult, split_entries
from moetune.tune.search.split_fast import FastSplitOptions
from moetune.tune.search.split_search import SplitOptions, tune_split
from moetune.tune.search.strategy import (
    THOROUGH_OPTIONS,
    TRANSFER_OPTIONS,
    FastSearchOptions,
    exhaustive_search,
    fast_search,
    transfer_search,
)
from moetune.tune.store import STORE_FILENAME, Measurement, ResultStore
from moetune.tune.sweep import SweepPlan, plan_sweep, problem_of

__all__ = [
    "DEFAULT_VALUES",
    "FIDELITIES",
    "FINAL_WARM_FAILURES",
    "MATMUL_SIZE",
    "PRUNE_RULES",
    "READ_BYTES",
    "STORE_FILENAME",
    "THOROUGH_OPTIONS",
    "TRANSFER_OPTIONS",
    "FastSearchOptions",
    "FastSplitOptions",
    "FollowUp",
    "Measurement",
    "Outcome",
    "PruneReport",
    "QuantChoice",
    "ResultStore",
    "Rule",
    "RunContext",
    "SplitOptions",
    "SplitResult",
    "StoreMeasurer",
    "SweepPlan",
    "SweepRequest",
    "TunePlan",
    "TuneProblem",
    "TuneRequest",
    "WorkUnit",
    "WorkerPool",
    "capture_graph",
    "check_output",
    "default_space",
    "drop_routing_streams",
    "engine_file_path",
    "exhaustive_search",
    "fast_search",
    "make_plan",
    "measure_ceilings",
    "measure_probe",
    "plan",
    "problem_of",
    "prune",
    "prune_rules",
    "split_entries",
    "swap_ab_candidates",
    "time_bench",
    "time_fused_moe",
    "transfer_search",
    "tune_split",
]


def plan(request: SweepRequest) -> SweepPlan:
    """The plans of `request`: its layouts sharded from the model's config (read now, from
    the Hub or a path), one `TunePlan` per distinct per-rank problem (pure otherwise)."""
    resolved = resolve_layouts(
        request.model,
        list(request.layouts),
        revision=request.revision,
        mappings=request.mappings,
        replace_mappings=request.replace_mappings,
        allow_huge_shape=request.allow_huge_shape,
    )
    return plan_sweep(request, resolved)
