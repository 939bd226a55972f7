"""Replay the split search on recorded timings: how many lone-GEMM timings, which pair, no GPU.

Takes a results store that holds a split tune (``kind`` up/down/pair rows, as
``moetune tune --engine sglang`` writes them) and the tune's summary JSON(s)
(``--json`` output: the single config written per batch size, and the split
table). It runs the split search of ``--search fast`` against the store: each
lone-GEMM or whole-call timing it asks for is answered from the store's row
(a full-fidelity row, else a quick one); a timing the store does not hold is
answered as a failure and counted (``missing``). The check against the
PyTorch reference is assumed to pass (the recorded run checked what it wrote).

The recorded run is the baseline: it did the old (``--search thorough``, or for
spaces under 40 configs, exhaustive) split search, so its lone-GEMM timings are
the store's up/down rows, and its written pair is the summary's.

Per batch size it prints what each search wrote, the whole-call time of it
(from the store's pair rows; a pair the store never timed as a whole call is
compared by its up + down timed alone) and the lone timings each needed.

    python bench/replay_split.py STORE.jsonl[.gz] --summary RUN.json [--summary ...] [--json OUT]

Replayed timings repeat exactly, so this measures the search's choices, not
its robustness to noise.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from moetune.device import DeviceLimits
from moetune.kernel.config import Candidate
from moetune.kernel.probe import Probe
from moetune.tune.api import (
    FastSplitOptions,
    Measurement,
    Outcome,
    PruneReport,
    SplitOptions,
    TunePlan,
    TuneProblem,
    TuneRequest,
    default_space,
    make_plan,
    tune_split,
)

LONE = ("up", "down")


def load_rows(path: str | Path) -> list[Measurement]:
    """The store's measurements, the latest row of each key (a ``.gz`` file is read as is)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    latest: dict[tuple, Measurement] = {}
    with opener(path, "rt") as handle:
        for line in handle:
            if line.strip():
                row = Measurement.from_json(json.loads(line))
                latest[row.key()] = row
    return list(latest.values())


class ReplayMeasurer:
    """Answers `measure` from recorded rows; counts what it was asked."""

    def __init__(self, rows: Sequence[Measurement], problem_key: str) -> None:
        self.rows: dict[tuple[int, Any, str], Measurement] = {}
        for row in rows:
            if row.problem_key == problem_key:
                self.rows[(row.batch_size, row.probe, row.fidelity)] = row
        self.problem_key = problem_key
        self.asked: dict[tuple[int, Any], str] = {}  # (M, probe) -> "full", "quick" or "missing"

    def measure(self, batch_size: int, items: Sequence[Any], fidelity: str) -> dict[Any, Any]:
        out = {}
        for item in dict.fromkeys(items):
            order = (fidelity, "quick" if fidelity == "full" else "full")
            found = None
            for level in order:
                found = self.rows.get((batch_size, item, level))
                if found is not None:
                    self.asked.setdefault((batch_size, item), level)
                    break
            if found is None:
                self.asked.setdefault((batch_size, item), "missing")
                found = Measurement.failure(
                    problem_key=self.problem_key,
                    batch_size=batch_size,
                    candidate=item,
                    fidelity=fidelity,
                    status="runtime_error",
                    error="not in the recorded store",
                    device_name="replay",
                    triton_version="replay",
                    moetune_version="replay",
                )
            out[item] = found
        return out

    def lone(self, batch_size: int | None = None) -> dict[str, int]:
        """Lone-GEMM timings asked, by how they were answered."""
        counts: dict[str, int] = defaultdict(int)
        for (m, item), how in self.asked.items():
            if isinstance(item, Probe) and item.kind in LONE and batch_size in (None, m):
                counts[how] += 1
        return dict(counts)


class PassingBackend:
    """The reference check, assumed passed: the recorded run checked what it wrote."""

    def run(self, units):  # noqa: ANN001, ANN201
        for unit in units:
            for item in unit.candidates:
                yield unit, Outcome(item, "ok", rel_rms=0.0)


def recorded_run(
    summaries: Sequence[dict], problem_key: str | None = None
) -> tuple[dict[int, Candidate], dict[int, dict]]:
    """(single config per M, split table row per M) of the recorded summaries.

    A summary is one shape's (``shapes[i]`` of ``--json``) or a whole ``--json`` output,
    whose shapes of `problem_key` are read (all of them without one).
    """
    shapes = [
        shape
        for summary in summaries
        for shape in summary.get("shapes", [summary])
        if problem_key is None or shape.get("plan", {}).get("problem", problem_key) == problem_key
    ]
    singles, split = {}, {}
    for summary in shapes:
        for row in summary.get("results", []):
            singles[row["batch_size"]] = Candidate.from_config(row["config"])
        for row in summary.get("split", []):
            split[row["batch_size"]] = row
    return singles, split


def _probe_of(row: dict) -> Probe:
    up = Candidate.from_config({k: v for k, v in row["up"].items() if k != "USE_TMA"})
    down = Candidate.from_config({k: v for k, v in row["down"].items() if k != "USE_TMA"})
    return Probe("pair", up, bool(row["up"].get("USE_TMA")), down, bool(row["down"]["USE_TMA"]))


def replay(
    rows: Sequence[Measurement],
    summaries: Sequence[dict],
    problem_key: str | None = None,
    options: FastSplitOptions | None = None,
    plan_space: bool = False,
) -> dict[str, Any]:
    """Run the fast split search on `rows`; compare with the recorded (old) run per batch size.

    The search's space per batch size is the configs the store timed alone there, or with
    `plan_space` the space a tune plans (the default grid, pruned for an H200): what the
    store lacks is then answered as a failure and counted as ``missing``, the timings a
    run would add.
    """
    keys = sorted({r.problem_key for r in rows if r.kind in LONE})
    key = problem_key or keys[0]
    problem = TuneProblem.from_key(key)
    singles, recorded = recorded_run(summaries, key)
    batch_sizes = sorted(m for m in recorded if m in singles)
    own = [r for r in rows if r.problem_key == key]
    spaces: dict[int, list[Candidate]] = defaultdict(list)
    rankings: dict[int, list[Candidate]] = {}
    for m in batch_sizes:
        lone = {r.candidate for r in own if r.batch_size == m and r.kind in LONE}
        spaces[m] = sorted(lone)
        whole = [r for r in own if r.batch_size == m and r.kind == "whole" and r.ok]
        full = sorted((r for r in whole if r.fidelity == "full"), key=lambda r: r.latency_us)
        rankings[m] = [r.candidate for r in full]
    request = TuneRequest(
        problem=problem,
        batch_sizes=tuple(batch_sizes),
        space=tuple(sorted({c for m in batch_sizes for c in spaces[m]})),
        save_dir=Path("replay"),
        engines=("sglang",),
        search="fast",
    )
    if plan_space:
        plan = make_plan(replace(request, space=tuple(default_space())), DeviceLimits.h200())
    else:
        pruning = {m: PruneReport(kept=spaces[m], removed={}) for m in batch_sizes}
        plan = TunePlan(request, DeviceLimits.h200(), pruning, (), Path("replay"))
    measurer = ReplayMeasurer(rows, key)
    notes: list[str] = []
    results = tune_split(
        plan,
        measurer,
        PassingBackend(),
        {m: singles[m] for m in batch_sizes},
        notes,
        SplitOptions(fast=options or FastSplitOptions()),
        rankings=rankings,
    )
    old_lone = defaultdict(int)
    for r in own:
        if r.kind in LONE and r.batch_size in recorded:
            old_lone[r.batch_size] += 1
    report = []
    for result in results:
        m = result.batch_size
        old = recorded[m]
        single_probe = Probe.single(singles[m])
        single_row = measurer.rows.get((m, single_probe, "full"))
        single_us = single_row.latency_us if single_row is not None else old["single_us"]
        old_us = old["pair_us"] if old["written"] == "split" else old["single_us"]
        old_pair = _probe_of(old) if old["written"] == "split" else single_probe
        wanted = None  # the pair the fast search confirmed as a whole call, if any
        if result.stopped is None and result.choice is not None:
            wanted = result.choice.pair()
        recorded_pair = wanted is not None and measurer.rows.get((m, wanted, "full")) is not None
        if wanted is not None and wanted != single_probe and not recorded_pair:
            new_written, new_pair, new_us = "unrecorded pair", wanted, None
        elif result.split and result.choice is not None:
            new_written, new_pair = "split", result.choice.pair()
            new_us = measurer.rows[(m, new_pair, "full")].latency_us
        else:
            new_written, new_pair, new_us = "single", single_probe, single_us
        report.append(
            {
                "batch_size": m,
                "old_written": old["written"],
                "old_pair": old_pair.short(),
                "old_us": old_us,
                "old_lone": old_lone[m],
                "new_written": new_written,
                "new_pair": new_pair.short(),
                "new_us": new_us,
                "same": new_pair == old_pair,
                "new_vs_old": None if new_us is None or old_us is None else new_us / old_us - 1,
                "new_lone": sum(measurer.lone(m).values()),
                "new_lone_missing": measurer.lone(m).get("missing", 0),
                "stopped": result.stopped,
                "reference_us": result.reference_us,
                "seeded_us": result.seeded_us,
                "old_estimate_us": old.get("estimate_us"),
                "lone_gain": None
                if result.choice is None or not result.reference_us
                else 1 - result.choice.estimate_us / result.reference_us,
                "estimate_us": None if result.choice is None else result.choice.estimate_us,
                "lone_vs_old": None
                if result.choice is None or not old.get("estimate_us")
                else result.choice.estimate_us / old["estimate_us"] - 1,
            }
        )
    asked = measurer.lone()
    gaps = [abs(row["new_vs_old"]) for row in report if row["new_vs_old"] is not None]
    return {
        "problem": key,
        "rows": report,
        "old_lone": sum(old_lone.values()),
        "new_lone": sum(asked.values()),
        "new_lone_missing": asked.get("missing", 0),
        "new_lone_from_quick": asked.get("quick", 0),
        "same_pair": sum(row["same"] for row in report),
        "within_1pct": sum(
            row["new_vs_old"] is not None and row["new_vs_old"] <= 0.01 for row in report
        ),
        "unknown": sum(row["new_vs_old"] is None for row in report),
        "median_abs_gap": statistics.median(gaps) if gaps else None,
        "tma_asked": sum(
            1 for (_, item) in measurer.asked if isinstance(item, Probe) and item.use_tma
        ),
        "notes": notes,
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def print_report(report: dict[str, Any]) -> None:
    """Per batch size: what each search wrote, its whole-call time, the lone timings it took."""
    print(f"### {report['problem']}")
    print()
    print(
        "| M | recorded (old) writes | us | lone | fast writes | us | lone | fast vs old "
        "| fast: lone gain | stopped |"
    )
    print("|---:|---|---:|---:|---|---:|---:|---:|---:|---|")
    for row in report["rows"]:
        if row["new_vs_old"] is not None:
            gap = f"{row['new_vs_old']:+.1%}"
        else:
            gap = f"alone {_pct(row['lone_vs_old'])}"
        fast = "same" if row["same"] else f"{row['new_written']} {row['new_pair']}"
        print(
            f"| {row['batch_size']} | {row['old_written']} {row['old_pair']} "
            f"| {_us(row['old_us'])} | {row['old_lone']} | {fast} | {_us(row['new_us'])} "
            f"| {row['new_lone']} | {gap} | {_pct(row['lone_gain'])} | {row['stopped'] or ''} |"
        )
    print()
    print(summary_line(report))


def summary_line(report: dict[str, Any]) -> str:
    return (
        f"lone-GEMM timings: old {report['old_lone']}, fast {report['new_lone']} "
        f"({report['new_lone_missing']} of them not in the store, "
        f"{report['new_lone_from_quick']} answered by a quick row); same pair at "
        f"{report['same_pair']} of {len(report['rows'])} M, within 1 % (or faster) at "
        f"{report['within_1pct']}, whole call not recorded at {report['unknown']}"
    )


def totals_table(reports: Sequence[dict[str, Any]]) -> list[str]:
    """One row per store: lone timings old and fast, and how the written configs compare."""
    lines = [
        "| store (shape) | M | lone timings: old | fast | fast / old | same pair "
        "| within 1 % | worse by > 1 % | not recorded (alone vs old) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, report in reports:
        rows = report["rows"]
        worse = [
            f"M={r['batch_size']} {r['new_vs_old']:+.1%}"
            for r in rows
            if r["new_vs_old"] is not None and r["new_vs_old"] > 0.01
        ]
        unknown = [
            f"M={r['batch_size']} {_pct(r['lone_vs_old'])}" for r in rows if r["new_vs_old"] is None
        ]
        lines.append(
            f"| {name} ({report['problem']}) | {len(rows)} | {report['old_lone']} "
            f"| {report['new_lone']} | {report['new_lone'] / report['old_lone']:.0%} "
            f"| {report['same_pair']} | {report['within_1pct']} | {', '.join(worse) or '-'} "
            f"| {', '.join(unknown) or '-'} |"
        )
    old = sum(r["old_lone"] for _, r in reports)
    new = sum(r["new_lone"] for _, r in reports)
    count = sum(len(r["rows"]) for _, r in reports)
    lines.append(
        f"| all | {count} | {old} | {new} | {new / old:.0%} "
        f"| {sum(r['same_pair'] for _, r in reports)} "
        f"| {sum(r['within_1pct'] for _, r in reports)} | | |"
    )
    return lines


RESULTS = Path(__file__).resolve().parent / "results" / "2026-12-01-h200-session"
# The recorded H200 split tunes: store, and the summaries of the runs that filled it.
RECORDED = {
    "split-pair qwen": ("split-pair/qwen.measurements.jsonl.gz", ("qwen-big", "qwen-small")),
    "split-pair dsv3": ("split-pair/dsv3.measurements.jsonl.gz", ("dsv3-big", "dsv3-small")),
    "split-pair e256": ("split-pair/e256.measurements.jsonl.gz", ("e256-big", "e256-small")),
    "split-pair qwen-routing": ("split-pair/qwen-routing.measurements.jsonl.gz", ("qwen-routing",)),
    "split-pair q35": ("split-pair/q35.measurements.jsonl.gz", ("q35-big",)),
    "int8-sglang": (
        "quant/full-tunes/int8-sglang/measurements.jsonl.gz",
        ("quant/full-tunes/int8-sglang/int8",),
    ),
}


def recorded(name: str) -> tuple[list[Measurement], list[dict]]:
    """(rows, summaries) of one of the `RECORDED` tunes."""
    store, runs = RECORDED[name]
    folder = (RESULTS / store).parent
    summaries = [
        json.loads(
            ((RESULTS / run) if "/" in run else (folder / run)).with_suffix(".json").read_text()
        )
        for run in runs
    ]
    return load_rows(RESULTS / store), summaries


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", nargs="?", help="default: every recorded H200 split tune")
    parser.add_argument("--summary", action="append", default=[])
    parser.add_argument("--problem-key")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument(
        "--plan-space",
        action="store_true",
        help="search the space a tune plans (default grid, pruned for an H200), not the "
        "store's; what the store lacks counts as missing",
    )
    parser.add_argument(
        "--one-step",
        action="store_true",
        help="the climb without its paired round (FastSplitOptions(paired_steps=False))",
    )
    args = parser.parse_args(argv)
    options = FastSplitOptions(paired_steps=not args.one_step)
    if args.store is None:
        reports = [(name, replay(*recorded(name), options=options)) for name in RECORDED]
        for _, report in reports:
            print_report(report)
            print()
        print("\n".join(totals_table(reports)))
        dump = {name: report for name, report in reports}
    else:
        if not args.summary:
            parser.error("a store needs the --summary of the run(s) that filled it")
        summaries = [json.loads(Path(path).read_text()) for path in args.summary]
        report = replay(
            load_rows(args.store), summaries, args.problem_key, options, args.plan_space
        )
        print_report(report)
        dump = report
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(dump, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
