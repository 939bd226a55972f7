"""Layout sweeps: expansion, one plan per distinct per-rank shape, skipped layouts, estimate."""

import math
from pathlib import Path

import pytest

from moetune.device import DeviceLimits
from moetune.errors import MoetuneError, TuneError
from moetune.extract.layouts import Layout, expand_layouts, resolve_layouts
from moetune.tune.estimate import default_rates, estimate
from moetune.tune.request import SweepRequest
from moetune.tune.results_dir import default_save_dir, model_slug
from moetune.tune.search.space import DEFAULT_BATCH_SIZES, default_space, load_space
from moetune.tune.sweep import plan_sweep, sweep_json, sweep_lines

R = default_rates()  # the packaged table's default GPU
DATA = Path(__file__).parent / "data"
TINY = str(DATA / "tiny-moe")  # E=4, top-k 2, N=32, K=64, bf16


def sweep(model, layouts, tmp_path, space=None, **request):
    resolved = resolve_layouts(model, layouts)
    fields = {
        "batch_sizes": (2, 4),
        "space": tuple(space or load_space(str(DATA / "tiny-space.json"))),
        "save_dir": tmp_path,
        "device_name": "NVIDIA H200",
        **request,
    }
    asked = SweepRequest(model, tuple(layouts), limits=DeviceLimits.h200(), **fields)
    return plan_sweep(asked, resolved)


def test_expand_layouts_is_the_product_in_order_without_duplicates():
    layouts = expand_layouts([1, 2], dtypes=["bf16", "fp8_w8a8", "bf16"])
    assert [layout.label() for layout in layouts] == [
        "TP1 bf16",
        "TP1 fp8_w8a8",
        "TP2 bf16",
        "TP2 fp8_w8a8",
    ]
    assert [x.label() for x in expand_layouts([8, 4], ep=True)] == ["TP8 EP auto", "TP4 EP auto"]
    sglang = expand_layouts([8], ep_sizes=[2, 8], dtypes=["bf16"])
    assert sglang == [Layout(8, False, 2, "bf16"), Layout(8, False, 8, "bf16")]
    with pytest.raises(MoetuneError, match="pass one"):
        expand_layouts([8], ep=True, ep_sizes=[2])


def test_layouts_with_the_same_shape_share_one_plan_and_one_store(tmp_path):
    # fp16 and bf16 are different layouts with different shapes; TP1 and TP2 of one dtype
    # differ in N. auto is bf16 for this checkpoint, so "auto" and "bf16" are one layout.
    layouts = expand_layouts([1, 2], dtypes=["auto", "bf16"])
    plan = sweep(TINY, layouts, tmp_path)
    assert [group.problem.shape_key() for group in plan.groups] == [
        "E=4,N=32,K=64,topk=2,dtype=bf16",
        "E=4,N=16,K=64,topk=2,dtype=bf16",
    ]
    # Labels name the dtype auto resolved to; the layout asked twice is planned once.
    assert [group.labels() for group in plan.groups] == [["TP1 bf16"], ["TP2 bf16"]]
    assert [layout.label() for layout in plan.layouts] == ["TP1 bf16", "TP2 bf16"]
    assert [p.problem for p in plan.plans] == [g.problem for g in plan.groups]
    assert {p.store_path for p in plan.plans} == {tmp_path / "measurements.jsonl"}
    assert not plan.skipped
    files = [path for p in plan.plans for path in p.files]
    assert len(files) == len(set(files)) == 2 * len(plan.plans[0].files)  # no file shared


def test_layouts_that_cannot_split_are_skipped_with_the_reason(tmp_path):
    layouts = expand_layouts([1, 2, 4], ep_sizes=[2, 4], dtypes=["bf16"])
    plan = sweep(TINY, layouts, tmp_path)
    reasons = {s.layout.label(): s.reason for s in plan.skipped}
    assert set(reasons) == {"TP1 EP2 bf16", "TP1 EP4 bf16", "TP2 EP4 bf16"}
    assert reasons["TP1 EP2 bf16"].startswith("--ep-size 2 does not divide --tp 1")
    # One expert per rank, top-k 2: valid, as for the engines; the rank's kernel runs top-k 1.
    assert [g.labels() for g in plan.groups] == [
        ["TP2 EP2 bf16"],
        ["TP4 EP2 bf16"],
        ["TP4 EP4 bf16"],
    ]
    assert plan.groups[2].problem.shape_key() == "E=1,N=32,K=64,topk=1,dtype=bf16"
    assert any("fewer than top-k 2" in note for note in plan.groups[2].notes)
    lines = sweep_lines(plan)
    assert "Layouts:     6 asked, 3 valid, 3 distinct per-rank shape(s) to tune, 3 skipped" in lines
    assert any(
        line.startswith("  TP2 EP4 bf16  skipped: --ep-size 4 does not divide") for line in lines
    )
    data = sweep_json(plan)
    by_label = {entry["layout"]: entry for entry in data["layouts"]}
    assert by_label["TP2 EP2 bf16"]["shape"] == "E=2,N=32,K=64,topk=2,dtype=bf16"
    assert by_label["TP2 EP2 bf16"]["skipped"] is None
    assert by_label["TP1 EP2 bf16"]["shape"] is None and by_label["TP1 EP2 bf16"]["skipped"]
    assert [shape["layouts"] for shape in data["shapes"]] == [
        ["TP2 EP2 bf16"],
        ["TP4 EP2 bf16"],
        ["TP4 EP4 bf16"],
    ]


def test_a_sweep_with_no_valid_layout_is_an_error_naming_each_reason(tmp_path):
    layouts = expand_layouts([8, 16], ep=True, dtypes=["bf16"])
    with pytest.raises(TuneError) as error:
        sweep(TINY, layouts, tmp_path)
    message = str(error.value)
    assert message.startswith("no layout can be tuned: TP8 EP bf16: --tp 8 --ep cannot split 4")
    assert "TP16 EP bf16: --tp 16 --ep cannot split 4 experts" in message


def test_bf16_and_fp16_write_the_same_file_names_so_the_second_is_skipped(tmp_path):
    plan = sweep(TINY, expand_layouts([1], dtypes=["bf16", "fp16"]), tmp_path)
    assert [g.labels() for g in plan.groups] == [["TP1 bf16"]]
    (skipped,) = plan.skipped
    assert skipped.layout.label() == "TP1 fp16"
    assert "same names as TP1 bf16's" in skipped.reason


def test_fp8_w8a8_of_a_bf16_checkpoint_is_per_tensor(tmp_path):
    # Today's semantics, kept: no block shape unless the checkpoint has weight blocks.
    plan = sweep(TINY, expand_layouts([1], dtypes=["bf16", "fp8_w8a8"]), tmp_path)
    assert [g.problem.dtype for g in plan.groups] == ["bf16", "fp8_w8a8"]
    assert plan.groups[1].problem.block_shape is None


def test_estimate_counts_every_stage_at_the_h200_rates(tmp_path):
    qwen = expand_layouts([1], dtypes=["bf16"])
    plan = sweep(
        "Qwen/Qwen3-30B-A3B",
        qwen,
        tmp_path,
        space=default_space(),
        batch_sizes=tuple(DEFAULT_BATCH_SIZES),
        engines=("vllm",),
    )
    (tune,) = plan.plans
    est = estimate(tune)
    pairs = sum(len(r.kept) for r in tune.pruning.values())
    assert est.pairs == pairs
    assert est.timed == math.ceil(pairs * R.fast_search_share)
    assert not est.split and est.lone == 0
    # The batch sizes side by side: 14 processes compile while the timer times; bf16 compiles
    # outlast the timings (0.36 CPU-s a timing over 14 processes against 0.02 s).
    compiling = est.timed * R.compile_s_per_timing["bf16"] / R.compile_workers
    assert compiling > est.timed * R.timer_s_per_timing
    assert dict(est.stages) == pytest.approx(
        {
            "search": R.search_tail["fast"] * compiling,
            "baselines": R.seconds_per_timed * 2 * 18,  # vLLM's fallback and its file, per M
            "split": 0.0,
            "start-up": R.startup_s,  # the run's first plan starts the worker processes
            # 5 rounds of the pick, its 2 runners-up, vLLM's fallback and its file, per M.
            "confirm": R.confirm_s_per_timing * 5 * (1 + 2 + 2) * 18,
            "fixed": R.seconds_per_plan,
        },
        rel=1e-3,  # the timings per batch size are fractions; `timed` rounds their sum up
    )
    assert est.seconds == pytest.approx(sum(dict(est.stages).values()))
    assert est.search_rate == pytest.approx(est.stage_seconds("search") / est.timed)
    assert est.confirms == 5 * 5 * 18
    # bench/results/tune-h200.md: this tune took 136 s on an H200 searching one batch size
    # after another, with no confirmation; bench/replay_wall.py replays its store pipelined
    # in 64-76 s (+ 12 s).
    assert 70 < est.seconds - est.stage_seconds("confirm") < 110
    exhaustive = sweep(TINY, qwen, tmp_path, search="exhaustive").plans[0]
    assert estimate(exhaustive).timed == 3 * 2
    assert estimate(exhaustive).lone == 3 * 2 * 3  # every pair, up, down and down TMA


def test_the_estimate_includes_the_split_search_at_its_measured_rates(tmp_path):
    qwen = expand_layouts([1], dtypes=["bf16"])
    full = dict(space=default_space(), batch_sizes=tuple(DEFAULT_BATCH_SIZES))
    fast_plan = sweep("Qwen/Qwen3-30B-A3B", qwen, tmp_path, **full).plans[0]
    fast = estimate(fast_plan)
    assert fast.split and fast.lone == R.fast_split_lone * 3 * 18  # up, down, down TMA
    assert fast.stage_seconds("split") == pytest.approx(
        R.seconds_per_lone * fast.lone + R.seconds_per_pair * 2 * 18
    )
    thorough = sweep("Qwen/Qwen3-30B-A3B", qwen, tmp_path, search="thorough", **full).plans[0]
    slow = estimate(thorough)
    assert slow.lone == math.ceil(R.thorough_split_share * slow.timed * 3)
    # The same whole search, over the space without the fast search's measured rule.
    spills = sum(r.removed["accumulator_spills"] for r in fast_plan.pruning.values())
    assert spills > 0 and slow.pairs == fast.pairs + spills
    # ... climbing from three starts: R.thorough_search_share of the pairs, not R.fast_search_share.
    share = R.thorough_search_share / R.fast_search_share
    assert slow.stage_seconds("search") == pytest.approx(
        fast.stage_seconds("search") * share * slow.pairs / fast.pairs, rel=0.01
    )
    # int8_w8a8: SGLang runs no TMA, so two variants are searched.
    int8 = expand_layouts([1], dtypes=["int8_w8a8"])
    est = estimate(sweep("Qwen/Qwen3-30B-A3B", int8, tmp_path, **full).plans[0])
    assert est.lone == R.fast_split_lone * 2 * 18


def test_a_batch_size_whose_call_outlasts_the_rate_is_estimated_at_its_calls(tmp_path):
    # M = 1,048,576 on Qwen3-30B TP1: one call is at least 2 * M * top-k * 3 * N * K flops,
    # 79 TFLOP, 80 ms even at the H200's datasheet 989 TFLOP/s; a whole-call timing runs it
    # more than 23 times (warm-up and timed replays of the full fidelity), one call a replay.
    from moetune.tune.measure.timing import FIDELITIES

    qwen = expand_layouts([1], dtypes=["bf16"])
    full = FIDELITIES["full"]
    call_s = 2 * 1_048_576 * 8 * 3 * 768 * 2048 / 989e12
    timing_s = (full.warmup + full.replays) * call_s
    plan = sweep(
        "Qwen/Qwen3-30B-A3B", qwen, tmp_path, space=default_space(), batch_sizes=(1_048_576,),
        engines=("vllm",),
    ).plans[0]  # fmt: skip
    est = estimate(plan)
    assert est.stage_seconds("search") >= est.timed * timing_s  # minutes, not seconds
    assert est.stage_seconds("baselines") >= 2 * timing_s  # vLLM's fallback and its file
    assert est.seconds < 4 * (est.timed + 2) * timing_s  # and not an hour either
    # A batch size whose calls are short keeps the measured rate: M=1 is no dearer here.
    both = sweep(
        "Qwen/Qwen3-30B-A3B", qwen, tmp_path, space=default_space(),
        batch_sizes=(1, 1_048_576), engines=("vllm",),
    ).plans[0]  # fmt: skip
    extra = estimate(both).stage_seconds("baselines") - est.stage_seconds("baselines")
    assert extra == pytest.approx(2 * R.seconds_per_timed)


def test_the_plan_line_names_every_stage(tmp_path):
    layouts = expand_layouts([1], dtypes=["bf16"])
    lines = sweep_lines(sweep(TINY, layouts, tmp_path, is_sweep=False))
    (line,) = [line for line in lines if line.startswith("Estimate:")]
    assert " = start-up 15 s + search <1 s + baselines <1 s + split " in line
    assert "+ confirm 4 s + checks/files 4 s (for an NVIDIA H200: " in line


@pytest.mark.parametrize(
    ("model", "slug"),
    [
        ("Qwen/Qwen3-30B-A3B", "Qwen__Qwen3-30B-A3B"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-ai__DeepSeek-V3"),
        (TINY, "tiny-moe"),
        (TINY + "/config.json", "tiny-moe"),
        (TINY + "/", "tiny-moe"),
        ("org/we ird:name", "org__we_ird_name"),
    ],
)
def test_model_slug_is_file_system_safe(model, slug):
    assert model_slug(model) == slug


def test_default_save_dir_is_absolute_under_moetune_results(tmp_path):
    path = default_save_dir("Qwen/Qwen3-30B-A3B", cwd=tmp_path)
    assert path == tmp_path / "moetune-results" / "Qwen__Qwen3-30B-A3B"
    assert path.is_absolute() and not path.exists()


def test_a_kernel_tune_cannot_time_skips_its_layout_in_a_sweep_and_fails_a_single_one(tmp_path):
    catalog = Path(__file__).resolve().parent.parent.parent / "moetune" / "catalog"
    # fp8 with static activation scales: the kernel computes its scales per batch.
    static = str(catalog / "mistralai__Mistral-Small-4-119B-2603.json")
    layouts = expand_layouts([2], dtypes=["auto", "bf16"])
    plan = sweep(static, layouts, tmp_path, space=default_space())
    assert [g.labels() for g in plan.groups] == [["TP2 bf16"]]
    (skipped,) = plan.skipped
    assert skipped.layout.label() == "TP2 fp8_w8a8"  # auto, resolved
    assert skipped.reason.startswith("moetune tune cannot time fp8_w8a8")
    with pytest.raises(TuneError, match="^moetune tune cannot time fp8_w8a8"):
        sweep(static, layouts[:1], tmp_path, space=default_space(), is_sweep=False)
