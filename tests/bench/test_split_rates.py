"""The split rates the plan's estimate uses predict a run they were not fitted on.

`seconds_per_lone` and `seconds_per_pair` (estimate_rates.yaml) are `bench/split_rates.py` on the stores of the
2026-12-04 default tunes (`split_rates.RECORDED`, call 3 there). Held out: the three default
tunes of the later paired-climb run, whose split stages were timed by their summaries.
"""

import gzip
import json
from pathlib import Path

import pytest
import split_rates  # bench/ is on sys.path (conftest.py)

from moetune.tune.estimate import default_rates

R = default_rates()  # the packaged table's default GPU

HELD_OUT = split_rates.ROOT / "results" / "2026-12-04-paired-climb" / "h200" / "call2"
RUNS = ("qwen235", "glm", "dsv3")


def split_stage(run: str) -> tuple[int, int, float]:
    """(lone-GEMM timings, pair timings, the split stage's recorded seconds) of one run."""
    with gzip.open(HELD_OUT / f"{run}.measurements.jsonl.gz", "rt") as handle:
        kinds = [json.loads(line).get("kind", "whole") for line in handle if line.strip()]
    summary = json.loads((HELD_OUT / f"{run}.json").read_text())
    [seconds] = [
        stage["seconds"]
        for shape in summary["shapes"]
        for stage in shape["stages"]
        if stage["stage"] == "split"
    ]
    lone = sum(kind in ("up", "down") for kind in kinds)
    return lone, kinds.count("pair"), seconds


def predicted(lone: int, pair: int) -> float:
    return R.seconds_per_lone * lone + R.seconds_per_pair * pair


def test_the_held_out_run_is_not_among_the_fitted_stores():
    assert split_rates.RECORDED and all(p.exists() for p in split_rates.RECORDED)
    assert not {p.resolve().parent for p in split_rates.RECORDED} & {HELD_OUT.resolve()}


def test_the_rates_predict_the_split_stage_of_held_out_runs():
    found = {run: split_stage(run) for run in RUNS}
    # 894, 846 and 959 lone timings, 36 pairs each (bench/results/2026-12-04-paired-climb).
    assert [lone for lone, _, _ in found.values()] == [894, 846, 959]
    for run, (lone, pair, seconds) in found.items():
        # Qwen3-235B +0.6 %, GLM-4.5-Air +3 %, DeepSeek-V3 -13 % (its lone GEMMs are longer).
        assert predicted(lone, pair) == pytest.approx(seconds, rel=0.15), run
    total = sum(predicted(lone, pair) for lone, pair, _ in found.values())
    assert total == pytest.approx(sum(s for _, _, s in found.values()), rel=0.05)  # -4 %


def test_main_prints_the_rates_of_the_recorded_stores(capsys):
    assert split_rates.main([]) == 0
    assert "lone " in capsys.readouterr().out


def test_a_gap_between_runs_is_not_counted(tmp_path: Path):
    store = tmp_path / "measurements.jsonl"
    rows = [(0.0, "whole"), (1.0, "up"), (1.5, "down"), (100.0, "pair"), (100.2, "pair")]
    store.write_text("".join(f'{{"timestamp": {t}, "kind": "{k}"}}\n' for t, k in rows))
    found = split_rates.rates([store])
    assert found["lone"] == (2, pytest.approx(1.5))
    assert found["pair"] == (1, pytest.approx(0.2))  # the 98.5 s gap is a new run
