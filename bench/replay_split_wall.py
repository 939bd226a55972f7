"""Replay a recorded tune's split search on a simulated clock: its wall time and the pairs it writes.

The split stage of a both-engine (or ``--engine sglang``) tune: after SGLang's whole-call
search, `moetune.tune.search.split_search.tune_split` (``--search fast``: the seeded
split search of `moetune.tune.search.split_fast`) times lone up/down GEMMs and confirms
the pair as a whole call. A recorded store holds each of those timings (``kind`` up,
down and pair rows) with its compile seconds and its timestamp. This script runs the
tuner's own `tune_split` through its own `StoreMeasurer` over `bench/replay_wall.py`'s
`SimulatedBackend` (14 compile processes at each probe's recorded ``compile_s``, one
timer at the median gap between the store's consecutive split rows per batch size), for
the search as it ran (``sequential``: `FastSplitOptions(pipelined=False)`) and side by side
(``pipelined``), each on a fresh clock and an empty store.

The inputs the split stage takes from the run before it are the recorded run's: the
single config per batch size (the summary JSON's ``results``) and the whole-call
ranking (the store's full-fidelity whole rows of the SGLang problem, fastest first, as
`moetune.tune.runner.ranked` reads them). The check against the PyTorch reference
is assumed to pass (the recorded run checked what it wrote) and takes no time here.
A probe the store lacks comes back failed ("not recorded") and is counted: the
sequential replay asks none when the replay is faithful.

Printed per store: the recorded span of the split stage (first split row to last), the
simulated wall time of each schedule at both input-switch costs (0.05 s per batch-size
change before `moetune.kernel.problem.with_tokens`, 0.005 s with it), compile CPU, the
timer's busy time, and whether the up/down tables written are the same as the recorded
run's and as each other.

    python bench/replay_split_wall.py [STORE.jsonl.gz SUMMARY.json ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_wall import (  # noqa: E402
    SWITCH_S,
    TOKENS_SWITCH_S,
    WORKERS,
    MemoryStore,
    Recorded,
    SimulatedBackend,
    problem_of,
    read_rows,
    spaces_of,
)

from moetune.device import DeviceLimits  # noqa: E402
from moetune.kernel.config import Candidate  # noqa: E402
from moetune.tune.api import (  # noqa: E402
    FastSplitOptions,
    Measurement,
    Outcome,
    PruneReport,
    RunContext,
    SplitOptions,
    SplitResult,
    StoreMeasurer,
    TunePlan,
    TuneRequest,
    split_entries,
    tune_split,
)

ROOT = Path(__file__).resolve().parent / "results"
# (store, the summary JSON of the run that filled it): Qwen3-235B TP8, both engines, on the H200.
RECORDED = (
    (
        ROOT / "2026-12-02-default-tune-times" / "qwen235" / "measurements.jsonl.gz",
        ROOT / "2026-12-02-default-tune-times" / "qwen235" / "qwen235.json",
    ),
    (
        ROOT
        / "2026-12-02-search-pipeline"
        / "h200"
        / "sequential"
        / "qwen235.measurements.jsonl.gz",
        ROOT / "2026-12-02-search-pipeline" / "h200" / "sequential" / "qwen235.json",
    ),
    (
        ROOT
        / "2026-12-02-search-pipeline"
        / "h200"
        / "pipelined"
        / "qwen235.measurements.jsonl.gz",
        ROOT / "2026-12-02-search-pipeline" / "h200" / "pipelined" / "qwen235.json",
    ),
)
SPLIT_KINDS = ("up", "down", "pair")


class PassingBackend:
    """The reference check of a written pair, assumed passed (the recorded run checked it)."""

    def run(self, units):  # noqa: ANN001, ANN201
        for unit in units:
            for item in unit.candidates:
                yield unit, Outcome(item, "ok", rel_rms=0.0)


@dataclass
class SplitStage:
    """What the split stage of one recorded tune starts from."""

    key: str
    recorded: Recorded
    singles: dict[int, Candidate]
    rankings: dict[int, list[Candidate]]
    written: dict[int, dict[str, Any]]  # the recorded run's split rows, by batch size


def split_stage(store: Path, summary: Path) -> SplitStage:
    rows = read_rows(store)
    split = [r for r in rows if r.kind in SPLIT_KINDS]
    key = split[0].problem_key
    own = [r for r in split if r.problem_key == key]
    recorded = Recorded.of(key, own, rows, kinds=SPLIT_KINDS)
    shape = next(s for s in json.loads(summary.read_text())["shapes"] if s.get("split"))
    singles = {r["batch_size"]: Candidate.from_config(r["config"]) for r in shape["results"]}
    latest: dict[tuple[int, Candidate], Measurement] = {}
    for row in sorted(rows, key=lambda r: r.timestamp):
        if row.problem_key == key and row.kind == "whole" and row.fidelity == "full":
            latest[(row.batch_size, row.candidate)] = row
    rankings: dict[int, list[Candidate]] = {}
    for m in singles:
        ok = [r for (b, _), r in latest.items() if b == m and r.ok and r.latency_us is not None]
        ranking = [r.candidate for r in sorted(ok, key=lambda r: r.latency_us)]
        rankings[m] = ranking if singles[m] in ranking else [singles[m], *ranking]
    written = {r["batch_size"]: r for r in shape["split"]}
    return SplitStage(key, recorded, singles, rankings, written)


@dataclass
class Replayed:
    wall_s: float
    compile_cpu_s: float
    timings: int
    misses: int
    timer_busy_s: float
    timer_switches: int  # batch-size changes on the timer
    results: list[SplitResult]

    def tables(self) -> tuple[dict[int, dict], dict[int, dict]]:
        return split_entries(self.results)


def replay_split(
    stage: SplitStage,
    pipelined: bool,
    *,
    switch_s: float,
    workers: int = WORKERS,
) -> Replayed:
    problem = problem_of(stage.key)
    order = sorted(stage.singles)
    spaces = spaces_of(problem, order)
    request = TuneRequest(
        problem=problem,
        batch_sizes=tuple(order),
        space=(),
        save_dir=Path("replay"),
        engines=("sglang",),
        search="fast",
    )
    pruning = {m: PruneReport(kept=spaces[m], removed={}) for m in order}
    plan = TunePlan(request, DeviceLimits.h200(), pruning, (), Path("replay"))
    backend = SimulatedBackend({problem.key(): stage.recorded}, workers=workers, switch_s=switch_s)
    context = RunContext(problem, "NVIDIA H200", "3.6.0")
    measurer = StoreMeasurer(context, backend, MemoryStore())  # type: ignore[arg-type]
    options = SplitOptions(fast=FastSplitOptions(pipelined=pipelined))
    notes: list[str] = []
    results = tune_split(
        plan,
        measurer,
        PassingBackend(),
        stage.singles,
        notes,
        options,
        rankings=stage.rankings,
    )
    return Replayed(
        backend.now,
        backend.compile_cpu_s,
        measurer.timed,
        len(backend.misses),
        sum(worker.busy_s for worker in backend.timers),
        backend.timer_switches,
        results,
    )


def recorded_tables(stage: SplitStage) -> tuple[dict[int, dict], dict[int, dict]]:
    """The up and down tables the recorded run wrote (its summary's split rows)."""
    up, down = {}, {}
    for m, row in stage.written.items():
        if row["written"] == "split":
            up[m], down[m] = row["up"], row["down"]
        else:
            config = stage.singles[m].as_config()
            up[m], down[m] = config, {**config, "USE_TMA": False}
    return up, down


def same_rows(a: tuple[dict, dict], b: tuple[dict, dict]) -> list[int]:
    """Batch sizes whose up or down entry differs."""
    return sorted(
        m for m in set(a[0]) | set(b[0]) if a[0].get(m) != b[0].get(m) or a[1].get(m) != b[1].get(m)
    )


SCHEDULES = (
    ("sequential, switch 0.05 s", False, SWITCH_S),
    ("sequential, switch 0.005 s", False, TOKENS_SWITCH_S),
    ("pipelined, switch 0.005 s", True, TOKENS_SWITCH_S),
    ("pipelined, switch 0.05 s", True, SWITCH_S),
)


def replay_store(store: Path, summary: Path, workers: int = WORKERS) -> dict[str, Any]:
    stage = split_stage(store, summary)
    runs = {name: replay_split(stage, p, switch_s=s, workers=workers) for name, p, s in SCHEDULES}
    recorded = recorded_tables(stage)
    first = runs[SCHEDULES[0][0]].tables()
    split_rows = sorted(
        (r for r in read_rows(store) if r.kind in SPLIT_KINDS), key=lambda r: r.timestamp
    )
    return {
        "store": str(store),
        "problem": stage.key,
        "batch_sizes": sorted(stage.singles),
        "recorded_span_s": split_rows[-1].timestamp - split_rows[0].timestamp,
        "recorded_rows": len(split_rows),
        "recorded_pairs_written": sum(r["written"] == "split" for r in stage.written.values()),
        "runs": {
            name: {
                "wall_s": run.wall_s,
                "compile_cpu_s": run.compile_cpu_s,
                "timings": run.timings,
                "misses": run.misses,
                "timer_busy_s": run.timer_busy_s,
                "timer_switches": run.timer_switches,
                "pairs_written": sum(r.split for r in run.results),
                "differs_from_recorded": same_rows(run.tables(), recorded),
                "differs_from_sequential": same_rows(run.tables(), first),
            }
            for name, run in runs.items()
        },
    }


def format_report(report: dict[str, Any]) -> list[str]:
    lines = [
        f"{report['store']}",
        f"  {report['problem']} ({len(report['batch_sizes'])} batch sizes)",
        f"  recorded split stage: span {report['recorded_span_s']:.1f} s, "
        f"{report['recorded_rows']} rows, {report['recorded_pairs_written']} pairs written",
    ]
    for name, run in report["runs"].items():
        lines.append(
            f"  {name}: wall {run['wall_s']:.1f} s, compile {run['compile_cpu_s']:.1f} CPU-s, "
            f"{run['timings']} timings ({run['misses']} not recorded), timer busy "
            f"{run['timer_busy_s']:.1f} s ({run['timer_switches']} batch-size switches), "
            f"{run['pairs_written']} pairs written; tables differ "
            f"from the recorded run's at {run['differs_from_recorded'] or 'no'} M, from the "
            f"sequential replay's at {run['differs_from_sequential'] or 'no'} M"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="*", type=Path, help="STORE SUMMARY [STORE SUMMARY ...]")
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--json", dest="json_path", type=Path)
    args = parser.parse_args(argv)
    if len(args.pairs) % 2:
        parser.error("give each store with the summary JSON of its run")
    pairs = list(zip(args.pairs[::2], args.pairs[1::2], strict=True)) or list(RECORDED)
    reports = []
    for store, summary in pairs:
        report = replay_store(store, summary, args.workers)
        reports.append(report)
        print("\n".join(format_report(report)))
    if args.json_path:
        args.json_path.write_text(json.dumps(reports, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
