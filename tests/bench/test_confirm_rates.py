"""The confirmation's rate in the estimate's table is `bench/confirm_rates.py` on the recorded run."""

import json

import confirm_rates  # bench/ is on sys.path (conftest.py)
import pytest

from moetune.tune.estimate import default_rates


def test_the_table_rate_is_the_fit_on_the_recorded_run():
    (path,) = confirm_rates.RECORDED
    timings, seconds = confirm_rates.confirm_rate(path)
    # DeepSeek-V3 TP8 on an H100: 5 rounds of 70 configs over 18 batch sizes, 22.2 s.
    assert timings == 350 and seconds == pytest.approx(22.16, abs=0.01)
    rate = default_rates()
    assert rate.confirm_s_per_timing == pytest.approx(seconds / timings, rel=0.01)
    cited = rate.sources["confirm_s_per_timing"]
    assert cited.source in path.as_posix() and cited.script == "bench/confirm_rates.py"


def test_a_summary_without_a_confirmation_counts_nothing(tmp_path, capsys):
    summary = tmp_path / "s.json"
    stages = [{"stage": "search", "seconds": 9.0}]
    summary.write_text(json.dumps({"stages": stages, "results": [{"batch_size": 1}]}))
    assert confirm_rates.confirm_rate(summary) == (0, 0.0)
    assert confirm_rates.main([str(summary)]) == 0
    assert "0 timings" in capsys.readouterr().out
