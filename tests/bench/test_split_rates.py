"""The split rates the plan's estimate uses are the recorded H200 stores' (bench/split_rates.py)."""

import pytest
import split_rates  # bench/ is on sys.path (conftest.py)

from moetune.tune.sweep import SECONDS_PER_LONE, SECONDS_PER_PAIR


def test_the_estimate_rates_are_the_recorded_stores_rates(capsys):
    assert len(split_rates.RECORDED) == 3 and all(p.exists() for p in split_rates.RECORDED)
    found = split_rates.rates(list(split_rates.RECORDED))
    lone_rows, lone_s = found["lone"]
    pair_rows, pair_s = found["pair"]
    assert lone_rows == 2555 and pair_rows == 108  # 3 default tunes x 18 batch sizes
    assert SECONDS_PER_LONE == pytest.approx(lone_s / lone_rows, rel=0.05)
    assert SECONDS_PER_PAIR == pytest.approx(pair_s / pair_rows, rel=0.05)
    assert split_rates.main([]) == 0
    assert "lone     2555 rows" in capsys.readouterr().out
    # Before the kept routings and the side-by-side search, a lone timing cost twice as much.
    older = split_rates.rates(list(split_rates.OLDER))["lone"]
    assert older[0] == 10444 and older[1] / older[0] > 1.8 * SECONDS_PER_LONE


def test_a_gap_between_runs_is_not_counted(tmp_path):
    store = tmp_path / "measurements.jsonl"
    rows = [(0.0, "whole"), (1.0, "up"), (1.5, "down"), (100.0, "pair"), (100.2, "pair")]
    store.write_text("".join(f'{{"timestamp": {t}, "kind": "{k}"}}\n' for t, k in rows))
    found = split_rates.rates([store])
    assert found["lone"] == (2, pytest.approx(1.5))
    assert found["pair"] == (1, pytest.approx(0.2))  # the 98.5 s gap is a new run
