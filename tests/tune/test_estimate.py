"""The estimate's rates are data that cite their runs; the plan says which GPU it prices."""

import dataclasses
import itertools
from pathlib import Path

import pytest
import yaml

from moetune.__main__ import main
from moetune.device import DeviceLimits
from moetune.errors import InvalidMappingsError
from moetune.extract.layouts import expand_layouts, resolve_layouts
from moetune.tune.estimate import (
    COUNTS,
    CPU,
    MEASURED,
    OTHER_GPU,
    RATES_PATH,
    SCALAR_RATES,
    TABLE_RATES,
    default_rates,
    estimate,
    load_rates,
    rate_table,
)
from moetune.tune.request import SweepRequest
from moetune.tune.search.space import DEFAULT_BATCH_SIZES, default_space
from moetune.tune.sweep import plan_sweep, sweep_json, sweep_lines

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


def plan(tmp_path, model="Qwen/Qwen3-30B-A3B", **request):
    layouts = expand_layouts([1], dtypes=["bf16"])
    fields = {
        "space": default_space(),
        "batch_sizes": tuple(DEFAULT_BATCH_SIZES),
        "save_dir": tmp_path,
        "device_name": "NVIDIA H200",
        "engines": ("vllm",),
        **request,
    }
    request = SweepRequest(
        model, tuple(layouts), limits=DeviceLimits.h200(), is_sweep=False, **fields
    )
    return plan_sweep(request, resolve_layouts(model, layouts))


# --- the table -----------------------------------------------------------------------


def test_every_rate_cites_a_run_and_a_script_that_exist():
    table = rate_table()
    assert table.default_rates.gpu == "NVIDIA H200"
    for rates in table.gpus:
        assert set(rates.sources) == set(SCALAR_RATES + TABLE_RATES + COUNTS)
        for name, cited in rates.sources.items():
            run = cited.source.split(" ")[0]  # a folder or file, then words about it
            assert (ROOT / run).exists(), f"{name}: {cited.source}"
            assert cited.script is None or (ROOT / cited.script).is_file(), name
    # The confirmation's rate is an H100's (no H200 run has recorded one yet), and says so.
    assert table.default_rates.sources["confirm_s_per_timing"].measured_on.startswith("NVIDIA H100")


def test_a_device_is_priced_at_its_own_gpus_rates_by_a_word_of_its_name():
    table = rate_table()
    for name in ("NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA_H200", "nvidia h200 141gb hbm3e"):
        assert table.for_device(name).gpu == "NVIDIA H200", name
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H20", "NVIDIA GH200 480GB", "cpu"):
        assert table.for_device(name) is None, name


def broken(tmp_path, change):
    data = yaml.safe_load(RATES_PATH.read_text())
    change(data)
    path = tmp_path / "rates.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["gpus"][0]["rates"].pop("seconds_per_lone"), r"gpus\[0\]\.rates: no seconds_per_lone"),
        (lambda d: d["gpus"][0]["rates"].update(typo_s={"value": 1, "source": "x"}), "unknown rate 'typo_s'"),
        (lambda d: d["gpus"][0]["rates"]["startup_s"].update(value="15 s"), r"startup_s\.value: '15 s' is not a positive number"),
        (lambda d: d["gpus"][0]["rates"]["startup_s"].update(value=0), "is not a positive number"),
        (lambda d: d["gpus"][0]["rates"]["startup_s"].pop("source"), r"startup_s: no source \(the run"),
        (lambda d: d["gpus"][0]["rates"]["search_tail"].update(value=1.1), r"search_tail\.value: expected a mapping"),
        (lambda d: d["counts"]["fast_split_lone"].update(sourse="x"), "unknown key 'sourse'"),
        (lambda d: d.update(default="NVIDIA B200"), "default: 'NVIDIA B200' names no GPU entry"),
    ],
)  # fmt: skip
def test_a_broken_table_is_one_line_naming_the_place(tmp_path, change, message):
    with pytest.raises(InvalidMappingsError, match=message) as exc:
        load_rates(broken(tmp_path, change))
    assert "\n" not in str(exc.value) and str(tmp_path) in str(exc.value)


def test_an_unreadable_table_is_one_line(tmp_path):
    path = tmp_path / "rates.yaml"
    path.write_text("gpus: [unclosed\n")
    with pytest.raises(InvalidMappingsError, match="cannot read the estimate's rates"):
        load_rates(path)


# --- the rates a plan is priced at, and what the plan says about them ------------------


def test_the_rates_passed_in_price_the_plan(tmp_path):
    (tune,) = plan(tmp_path).plans
    shipped = estimate(tune)
    doubled = dataclasses.replace(default_rates(), startup_s=2 * default_rates().startup_s)
    assert estimate(tune, rates=doubled).seconds == pytest.approx(
        shipped.seconds + default_rates().startup_s
    )


@pytest.mark.parametrize(
    ("devices", "device_name", "basis", "note"),
    [
        (("0",), "NVIDIA H200", MEASURED, "at the rates measured on an NVIDIA H200; other machines differ"),
        (("0",), "NVIDIA H100 80GB HBM3", OTHER_GPU, "for an NVIDIA H200: no rates measured on this GPU"),
        ((None,), "NVIDIA H200", CPU, "for an NVIDIA H200: the CPU interpreter has no rates"),
    ],
)  # fmt: skip
def test_the_plan_says_which_gpus_rates_price_it(tmp_path, devices, device_name, basis, note):
    sweep = plan(tmp_path, devices=devices, device_name=device_name)
    (est,) = sweep.estimates()
    assert est.basis == basis and est.rates == default_rates()
    (line,) = [line for line in sweep_lines(sweep) if line.startswith("Estimate:")]
    assert line.endswith(f"({note})")
    data = sweep_json(sweep)
    assert data["estimate_basis"] == basis and data["estimate_rates"] == "NVIDIA H200"
    hint = [line for line in sweep_lines(sweep) if "TRITON_INTERPRET=1" in line]
    assert bool(hint) == (basis == CPU)  # a full-size plan, the default grid


def test_a_small_cpu_plan_gets_no_hint(tmp_path):
    space = tuple(default_space()[:3])
    sweep = plan(tmp_path, model=str(DATA / "tiny-moe"), space=space, batch_sizes=(1, 4))
    assert sweep.estimates()[0].basis == CPU
    assert not [line for line in sweep_lines(sweep) if "TRITON_INTERPRET" in line]


def test_a_cpu_tune_of_a_full_size_model_hints_at_a_small_space_at_80_columns(
    capsys, monkeypatch, tmp_path
):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the CPU interpreter, even on a GPU host
    args = ["tune", "-m", "Qwen/Qwen3-30B-A3B", "--engine", "vllm", "--dry-run"]
    args += ["--device-name", "NVIDIA_H200", "--save-dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr().out
    assert exc.value.code == 0
    lines = out.splitlines()
    (index,) = [i for i, line in enumerate(lines) if line.startswith("Estimate:")]
    # The Estimate line wraps at 80 columns under its value column, the hint after it.
    block = [lines[index]]
    block += list(itertools.takewhile(lambda line: line.startswith(" " * 13), lines[index + 1 :]))
    assert all(len(line) <= 80 for line in block), block
    text = " ".join(line.strip() for line in block)
    assert "(for an NVIDIA H200: the CPU interpreter has no rates)" in text
    assert text.endswith(
        "TRITON_INTERPRET=1 runs a full-size tune for hours; pass a small "
        "--space (like tests/tune/data/tiny-space.json) to try it out"
    )


# --- the confirmation round ----------------------------------------------------------


def test_the_confirmation_is_priced_and_confirm_rounds_0_removes_it(tmp_path):
    rates = default_rates()
    (five,) = plan(tmp_path).estimates()
    (none,) = plan(tmp_path, confirm_rounds=0).estimates()
    (nine,) = plan(tmp_path, confirm_rounds=9).estimates()
    # Each round: the pick, its runners-up, vLLM's fallback and its file, at 18 batch sizes.
    per_round = (1 + rates.confirm_runners_up + 2) * 18
    assert five.confirms == 5 * per_round and none.confirms == 0
    assert five.stage_seconds("confirm") == pytest.approx(
        rates.confirm_s_per_timing * 5 * per_round
    )
    assert none.stage_seconds("confirm") == 0.0
    assert five.seconds - none.seconds == pytest.approx(five.stage_seconds("confirm"))
    assert nine.stage_seconds("confirm") == pytest.approx(9 / 5 * five.stage_seconds("confirm"))
    (line,) = [line for line in sweep_lines(plan(tmp_path)) if line.startswith("Estimate:")]
    assert " + confirm 28 s + " in line  # 5 rounds x 5 configs x 18 batch sizes x 0.063 s
    (line,) = [
        line
        for line in sweep_lines(plan(tmp_path, confirm_rounds=0))
        if line.startswith("Estimate:")
    ]
    assert "confirm" not in line
