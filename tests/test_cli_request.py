"""`moetune tune` hands the tuner one `SweepRequest` of plain values, never its option dict."""

import dataclasses
from pathlib import Path

import pytest

from moetune.cli import main
from moetune.dtypes import QuantChoice
from moetune.extract.layouts import Layout
from moetune.tune import sweep
from moetune.tune.request import SweepRequest

DATA = Path(__file__).parent / "tune" / "data"


def test_tune_passes_one_request_of_values_to_plan_sweep(tmp_path, capsys, monkeypatch):
    asked = []
    real = sweep.plan_sweep

    def recording(*args, **kwargs):
        asked.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep, "plan_sweep", recording)
    space = DATA / "tiny-space.json"
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "tune",
                "--model",
                str(DATA / "tiny-moe"),
                "--tp",
                "1,2",
                "--dtype",
                "fp8_w8a8",
                "--per-channel-quant",
                "--batch-size",
                "4,2",
                "--space",
                str(space),
                "--engine",
                "sglang",
                "--save-dir",
                str(tmp_path / "out"),
                "--confirm-rounds",
                "3",
                "--dry-run",
            ]
        )
    assert exc.value.code == 0, capsys.readouterr().err
    ((args, kwargs),) = asked
    assert kwargs == {}
    request = args[0]
    assert isinstance(request, SweepRequest)
    assert request.layouts == (
        Layout(1, False, None, "fp8_w8a8"),
        Layout(2, False, None, "fp8_w8a8"),
    )
    assert request.quant == QuantChoice(group_size=None, per_channel=True)
    assert request.batch_sizes == (2, 4)
    assert request.engines == ("sglang",)
    assert request.save_dir == (tmp_path / "out").absolute()
    assert request.space_source == str(space) and len(request.space) == 3
    assert request.confirm_rounds == 3 and request.is_sweep
    # Values only: no field holds a mapping of option names (the kernels map engine names).
    for field in dataclasses.fields(request):
        value = getattr(request, field.name)
        if isinstance(value, dict):
            assert field.name == "kernels" and set(value) <= {"vllm", "sglang"}
