"""The progress bar's meter: every stage counted in the estimate's seconds, one total."""

import pytest

from moetune.tune.estimate import Estimate, default_rates
from moetune.tune.work_meter import SweepMeter, WorkMeter

R = default_rates()  # the packaged table's default GPU


def est(search=6.0, split=2.0):
    stages = (
        ("search", search),
        ("baselines", 0.0),
        ("split", split),
        ("fixed", R.seconds_per_plan),
    )
    return Estimate(sum(v for _, v in stages), 100, 100, True, 10, stages)


def test_each_timing_counts_its_rate_and_the_stages_after_the_last_timing_move_the_bar():
    meter = WorkMeter(est())
    assert meter.total == pytest.approx(8.0 + R.seconds_per_plan) and meter.done == 0
    meter.stage("search")
    for _ in range(100):
        meter.measured("whole")
    share = R.seconds_per_plan / 4
    assert meter.done == pytest.approx(share + 100 * R.seconds_per_timed)  # + start-up's share
    meter.stage("baselines")
    meter.stage("verify")
    before = meter.done
    meter.stage("split")  # the check against the reference is done: its share
    meter.measured("up")
    meter.measured("down")
    meter.measured("pair")
    assert meter.done - before == pytest.approx(share + 2 * R.seconds_per_lone + R.seconds_per_pair)
    # No timing in the last stages, yet each one moves the bar (the old bar sat at N-1/N).
    marks = []
    for name in ("ceilings", "files"):
        meter.stage(name)
        marks.append(meter.done)
    assert marks[0] == pytest.approx(before + share + 2 * R.seconds_per_lone + R.seconds_per_pair)
    assert marks[1] == pytest.approx(marks[0] + share)
    meter.finish()
    assert meter.done == meter.total == pytest.approx(8.0 + R.seconds_per_plan)


def test_more_work_than_estimated_grows_the_total():
    meter = WorkMeter(est(search=1.0, split=0.0))
    for _ in range(1000):
        meter.measured("whole")
    assert meter.done < meter.total
    assert meter.done == pytest.approx(R.seconds_per_plan / 4 + 1000 * R.seconds_per_timed)


def test_a_timing_at_a_batch_size_of_long_calls_counts_its_calls_time():
    stages = (("search", 60.0), ("baselines", 0.0), ("split", 0.0), ("fixed", R.seconds_per_plan))
    long = {1_048_576: 5.0, 1: 0.001}
    meter = WorkMeter(Estimate(70.0, 12, 12, False, 0, stages, long))
    meter.measured("whole", 1_048_576)
    start = R.seconds_per_plan / 4
    assert meter.done == pytest.approx(start + 5.0)  # as the estimate priced it
    meter.measured("whole", 1)  # short calls: the measured rate
    meter.measured("pair")
    assert meter.done == pytest.approx(start + 5.0 + R.seconds_per_timed + R.seconds_per_pair)


def test_the_start_up_counts_at_the_first_timing_and_the_plans_of_a_run_make_one_bar():
    first = (("start-up", 12.0), ("search", 6.0), ("split", 0.0), ("fixed", R.seconds_per_plan))
    second = (("start-up", 0.0), ("search", 3.0), ("split", 2.0), ("fixed", R.seconds_per_plan))
    estimates = [Estimate(sum(v for _, v in st), 10, 10, False, 0, st) for st in (first, second)]
    run = SweepMeter(estimates)
    assert run.total == pytest.approx(22.0 + 9.0) and run.done == 0
    meter = run.start(0)
    meter.measured("whole")  # the worker processes are up: the start-up is done
    assert run.done == pytest.approx(12.0 + R.seconds_per_plan / 4 + R.seconds_per_timed)
    later = run.start(1)  # the first plan is done, whatever it had left
    assert run.done == pytest.approx(estimates[0].seconds)
    later.measured("up")
    assert run.done == pytest.approx(
        estimates[0].seconds + R.seconds_per_plan / 4 + R.seconds_per_lone
    )
    run.finish()
    assert run.done == run.total == pytest.approx(31.0)


def test_the_confirmation_counts_its_estimate_when_the_next_stage_begins():
    """Its timings are not reported one by one: the whole stage moves the bar as it ends."""
    stages = (("search", 6.0), ("confirm", 3.0), ("fixed", R.seconds_per_plan))
    meter = WorkMeter(Estimate(sum(v for _, v in stages), 10, 10, False, 0, stages))
    meter.stage("confirm")
    before = meter.done
    meter.stage("files")
    assert meter.done == pytest.approx(before + 3.0)
