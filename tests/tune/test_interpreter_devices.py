"""Under TRITON_INTERPRET=1 a run times on the CPU, even where GPUs are visible.

The README's CPU try-it, pasted on a GPU machine, once timed Triton's interpreter on CUDA
tensors: every candidate of the tiny tune failed (an H100, 2026-12-05, `make test-gpu`).
"""

import pytest
import torch

from moetune.commands.options import worker_devices
from moetune.errors import TuneError
from moetune.tune.runner import visible_devices


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_the_interpreter_gives_the_workers_the_cpu_where_gpus_are_visible(two_gpus, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert visible_devices(None) == (None,)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert visible_devices(None) == ("0", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # Triton's own reading: 0 is off
    assert visible_devices(None) == ("0", "1")


def test_gpus_under_the_interpreter_is_one_line_saying_what_to_do(two_gpus, monkeypatch):
    class Machine:
        devices = (None,)

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(TuneError) as refusal:
        worker_devices(("0",), Machine(), dry_run=False)
    assert str(refusal.value) == (
        "--gpus 0: TRITON_INTERPRET=1 times on the CPU; leave --gpus out, or unset "
        "TRITON_INTERPRET to time on the GPUs"
    )
    assert worker_devices(None, Machine(), dry_run=False) == (None,)
