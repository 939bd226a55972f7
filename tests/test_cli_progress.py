"""tune's progress bar: an ETA from the first unit of work on, and whole times at 80 columns."""

import io
import re

import pytest
from rich.console import Console

from moetune.commands.progress import counts_text, tune_progress


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def frame(progress, console):
    """The bar's line as the terminal shows it now."""
    console.file.seek(0)
    console.file.truncate()
    console.print(progress.make_tasks_table(progress.tasks))
    return console.file.getvalue().rstrip("\n")


def bar(width=80):
    clock = Clock()
    console = Console(file=io.StringIO(), width=width, color_system=None)
    progress = tune_progress(console, get_time=clock)
    return clock, console, progress


def test_the_eta_is_a_time_once_the_first_unit_is_done():
    clock, console, progress = bar()
    task = progress.add_task("tuning", total=100.0, status=counts_text(0, 0, 0))
    assert frame(progress, console).endswith("ETA -:--:--")  # nothing done: no rate yet
    clock.now = 10.0
    progress.update(task, completed=25.0, status=counts_text(1, 0, 0))
    assert frame(progress, console).endswith("0:00:10 ETA 0:00:30")  # 10 s for a quarter
    clock.now = 20.0  # no work for 10 s: the rate so far falls, the ETA grows
    assert frame(progress, console).endswith("0:00:20 ETA 0:01:00")
    clock.now = 30.0
    progress.update(task, completed=75.0)
    assert frame(progress, console).endswith("0:00:30 ETA 0:00:10")
    progress.update(task, completed=100.0)
    assert frame(progress, console).endswith("ETA 0:00:00")


@pytest.mark.parametrize(
    ("description", "counts"),
    [
        ("tuning: search M=16", (11, 0, 0)),
        ("tuning: baselines M=4096", (1234, 56, 3)),
        ("TP16 EP16 int4_w4a16: tuning: baselines M=1048576", (123456, 7890, 12)),
    ],
)
def test_at_80_columns_the_times_stay_whole_and_the_line_fits(description, counts):
    clock, console, progress = bar(80)
    task = progress.add_task(description, total=100.0, status=counts_text(*counts))
    clock.now = 3725.0
    progress.update(task, completed=50.0)
    line = frame(progress, console)
    assert len(line.splitlines()) == 1 and len(line) <= 80, line
    assert re.search(r" 1:02:05 ETA 1:02:05$", line), line


def test_the_counts_leave_out_what_did_not_happen():
    assert counts_text(12, 0, 0) == "12 timed"
    assert counts_text(12, 3, 0) == "12 timed, 3 from store"
    assert counts_text(12, 0, 1) == "12 timed, 1 failed"
    assert counts_text(12, 3, 1) == "12 timed, 3 from store, 1 failed"
