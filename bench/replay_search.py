"""Replay fast search on measurements already taken: how close, how cheap, at no GPU cost.

Takes a results store (``measurements.jsonl``) that holds an exhaustive sweep
(every candidate of some batch sizes timed at full fidelity, e.g. from
``bench/search.py`` or ``moetune tune --search exhaustive``) and runs
`fast_search` against it: each timing it asks for is answered from the store
(a quick request from a quick row if there is one, else from the full row).
The space at each batch size is the candidates the store holds there, so the
exhaustive best is known exactly. Prints, per batch size, the exhaustive best,
fast search's pick, the gap and the share of the space it timed.

    python bench/replay_search.py STORE.jsonl [--problem-key KEY] [--json OUT.json]

Replayed timings repeat exactly, so this measures the search's choices, not
its robustness to noise (tests/tune/test_strategy.py covers noise).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence

from moetune.device import DeviceLimits
from moetune.errors import TuneError
from moetune.kernel.config import Candidate
from moetune.tune.api import Measurement, ResultStore, TuneProblem, fast_search


def problem_from_key(key: str) -> TuneProblem:
    try:
        return TuneProblem.from_key(key)
    except TuneError as exc:
        raise SystemExit(str(exc)) from None


class ReplayMeasurer:
    """A `Measurer` answering from stored rows of one problem."""

    def __init__(self, rows: dict[tuple[int, str], dict[Candidate, Measurement]]) -> None:
        self.rows = rows

    def measure(
        self, batch_size: int, candidates: Sequence[Candidate], fidelity: str
    ) -> dict[Candidate, Measurement]:
        full = self.rows[(batch_size, "full")]
        quick = self.rows.get((batch_size, "quick"), {})
        chosen = quick if fidelity == "quick" else full
        return {c: chosen.get(c, full[c]) for c in candidates}


def replay(store: ResultStore, problem_key: str | None = None) -> list[dict]:
    rows: dict[str, dict[tuple[int, str], dict[Candidate, Measurement]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for m in store.all():
        if m.kind == "whole":  # a split tune's GEMM and pair probes are another search
            rows[m.problem_key][(m.batch_size, m.fidelity)][m.candidate] = m
    keys = [problem_key] if problem_key else sorted(rows)
    report = []
    for key in keys:
        by_batch = rows[key]
        problem = problem_from_key(key)
        spaces = {m: sorted(cands) for (m, fid), cands in by_batch.items() if fid == "full"}
        results = fast_search(
            sorted(spaces),
            spaces.__getitem__,
            ReplayMeasurer(by_batch),
            problem,
            DeviceLimits.h200(),
        )
        for m, result in sorted(results.items()):
            ok = [x for x in by_batch[(m, "full")].values() if x.ok]
            best = min(ok, key=lambda x: x.latency_us)
            report.append(
                {
                    "problem": key,
                    "batch_size": m,
                    "space": len(spaces[m]),
                    "timed": result.timed,
                    "exhaustive_best_us": best.latency_us,
                    "exhaustive_best": best.candidate.short(),
                    "fast_us": result.best.latency_us,
                    "fast": result.best.candidate.short(),
                    "gap": result.best.latency_us / best.latency_us - 1,
                }
            )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--problem-key")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    report = replay(ResultStore(args.store), args.problem_key)
    print("| problem | M | space | timed | exhaustive best (us) | fast (us) | gap |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in report:
        print(
            f"| {row['problem']} | {row['batch_size']} | {row['space']} | {row['timed']} "
            f"({row['timed'] / row['space']:.0%}) | {row['exhaustive_best_us']:.1f} "
            f"{row['exhaustive_best']} | {row['fast_us']:.1f} {row['fast']} | {row['gap']:+.2%} |"
        )
    if args.json_path:
        with open(args.json_path, "w") as handle:
            json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
