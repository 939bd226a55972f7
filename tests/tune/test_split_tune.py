"""A split (SGLang up/down) tune end to end on the CPU: files, store kinds, TMA skip, resume."""

import json
from pathlib import Path

import pytest

from moetune.device import DeviceLimits
from moetune.engines.tuned_file import validate_tuned_config
from moetune.tune.confirm import TUNED
from moetune.tune.problem import TuneProblem
from moetune.tune.runner import TuneRequest, make_plan, plan_lines, run_tune
from moetune.tune.search.space import load_space
from moetune.tune.store import ResultStore

DATA = Path(__file__).parent / "data"
PROBLEM = TuneProblem(4, 32, 64, 2, "bf16")


def cpu_tma_reason():
    """None when TMA runs here (the interpreter emulates descriptors), else why not."""
    import torch

    from moetune.tune.measure.probe_timing import tma_unsupported_reason

    return tma_unsupported_reason(torch.device("cpu"), None, None)


def split_request(tmp_path, **overrides):
    values = dict(
        problem=PROBLEM,
        batch_sizes=(2, 4),
        space=tuple(load_space(DATA / "tiny-space.json")),
        save_dir=tmp_path,
        engines=("vllm", "sglang"),
        search="exhaustive",
        device_name="NVIDIA H200",
        triton_version="3.6.0",
    )
    values.update(overrides)
    return TuneRequest(**values)


def test_the_plan_shows_the_split_and_both_sglang_tables(tmp_path):
    plan = make_plan(split_request(tmp_path), DeviceLimits.h200())
    text = "\n".join(plan_lines(plan))
    assert "Split:       SGLang up/down tables: GEMMs timed alone (up, down, down TMA)," in text
    assert "Routing:     uniform random" in text
    assert plan.files[-1].name == "E=4,N=32,device_name=NVIDIA_H200_down.json"
    vllm_only = make_plan(split_request(tmp_path, engines=("vllm",)), DeviceLimits.h200())
    assert "Split:" not in "\n".join(plan_lines(vllm_only))
    with_up = make_plan(split_request(tmp_path, up_tma=True), DeviceLimits.h200())
    assert "(up, down, down TMA, up TMA)," in "\n".join(plan_lines(with_up))


@pytest.fixture(scope="module")
def split_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("split")
    # Without the confirmation: a rerun confirms again on the CPU's wall clock, and may keep
    # the other side of a tie (tests/tune/test_runner.py and the test below cover it).
    plan = make_plan(split_request(tmp_path, confirm_rounds=0), DeviceLimits.h200())
    first = run_tune(plan)
    contents = [path.read_text() for path in first.files]
    second = run_tune(plan)
    return plan, first, contents, second


@pytest.mark.xdist_group("split_run")  # one worker runs the module fixture once
def test_a_split_tune_writes_three_valid_files_sharing_block_m(split_run):
    plan, first, contents, _ = split_run
    assert [p.name for p in first.files] == [p.name for p in plan.files]
    vllm, sglang, sglang_down = (json.loads(text) for text in contents)
    validate_tuned_config(first.files[0], "vllm")
    validate_tuned_config(first.files[1], "sglang")
    validate_tuned_config(first.files[2], "sglang")
    for row in first.rows:
        m = str(row.batch_size)
        assert vllm[m] == row.config.as_config()  # vLLM keeps the single config
        assert sglang[m]["BLOCK_SIZE_M"] == sglang_down[m]["BLOCK_SIZE_M"]
        assert isinstance(sglang_down[m]["USE_TMA"], bool)
        if cpu_tma_reason() is not None:
            assert sglang_down[m]["USE_TMA"] is False  # TMA was not measured
    for result in first.split:
        assert result.single_us is not None and result.choice is not None
        if result.split:
            # Never slower: the pair is written only when faster as a whole call.
            assert result.pair_us < result.single_us and result.rel_rms < 0.02
        else:
            assert sglang[str(result.batch_size)] == result.single.as_config()


@pytest.mark.xdist_group("split_run")  # one worker runs the module fixture once
def test_the_store_holds_every_kind_and_tma_timed_or_skipped_with_its_reason(split_run):
    plan, *_ = split_run
    rows = ResultStore(plan.store_path).all()
    kinds = {row.kind for row in rows}
    assert kinds == {"whole", "up", "down", "pair"}
    # Each GEMM alone, every candidate, each batch size.
    assert sum(1 for r in rows if r.kind == "up" and r.fidelity == "full") == 6
    assert sum(1 for r in rows if r.kind == "down" and not r.use_tma) == 6
    tma = [r for r in rows if r.kind == "down" and r.use_tma]
    reason = cpu_tma_reason()
    if reason is None:  # the kernel has TMA and the interpreter emulates descriptors
        assert len([r for r in tma if r.fidelity == "full"]) == 6
        assert all(r.status == "ok" for r in tma)
    else:  # measured once, recorded with the reason, and skipped
        [skipped] = tma
        assert skipped.status == "unsupported" and skipped.error == reason
    assert all(r.status == "ok" for r in rows if not r.use_tma)
    assert not [r for r in rows if r.kind == "up" and r.use_tma]  # --up-tma is off


@pytest.mark.xdist_group("split_run")  # one worker runs the module fixture once
def test_a_split_tune_resumes_from_the_store(split_run):
    plan, first, contents, second = split_run
    # SGLang's fallback config (a baseline) is one of the tiny space's candidates, already
    # timed by the search at each batch size: served again, it is not counted as reused.
    assert first.measured > 8 and first.reused == 0
    assert second.measured == 0 and second.reused == first.measured
    assert [p.read_text() for p in second.files] == contents
    assert [(r.split, r.up_entry(), r.down_entry()) for r in second.split] == [
        (r.split, r.up_entry(), r.down_entry()) for r in first.split
    ]
    assert len(ResultStore(plan.store_path).all()) == first.measured


def test_the_fast_split_search_resumes_and_writes_only_pairs_faster_as_a_whole_call(tmp_path):
    # --search fast (the default): the seeded split search, end to end on the CPU.
    plan = make_plan(
        split_request(
            tmp_path, search="fast", batch_sizes=(2,), engines=("sglang",), confirm_rounds=0
        ),
        DeviceLimits.h200(),
    )
    first = run_tune(plan)
    contents = [path.read_text() for path in first.files]
    (result,) = first.split
    assert result.reference_us is not None  # the single config's GEMMs, each timed alone
    if result.stopped is not None:  # not confirmed: nothing was timed as a whole pair
        assert result.pair_us is None and not result.split
    elif result.split:
        assert result.pair_us < result.single_us
    up, down = (json.loads(text) for text in contents)
    assert up["2"]["BLOCK_SIZE_M"] == down["2"]["BLOCK_SIZE_M"]
    second = run_tune(plan)
    assert second.measured == 0 and second.reused == first.measured + first.reused
    assert [path.read_text() for path in second.files] == contents
    assert second.split[0].stopped == result.stopped


def test_a_kept_engine_config_replaces_the_split_pair_in_both_tables():
    """Where the confirmation keeps SGLang's own config, its file holds that config in the up
    and the down table (no pair); vLLM's file, decided apart, keeps the tuned one."""
    from moetune.kernel.config import Candidate
    from moetune.tune.baselines import Baseline
    from moetune.tune.confirm import Confirmation, decide
    from moetune.tune.output import engine_tables
    from moetune.tune.runner import BatchResult, written_configs
    from moetune.tune.search.split import SplitResult

    tuned, shipped, fallback = (
        Candidate(16, 64, 64, 1, 4, 3),
        Candidate(16, 32, 64, 1, 4, 2),
        Candidate(32, 64, 64, 8, 4, 3),
    )
    baselines = [
        Baseline("vllm_fallback", "vLLM fallback", "x", {2: fallback, 4: fallback}),
        Baseline("sglang_file", "SGLang file", "shipped.json", {2: shipped, 4: shipped}),
    ]
    rows = []
    # M = 2: 10 % faster than SGLang's file in every round; M = 4: within the noise.
    for m, tuned_rounds in ((2, (9.0, 9.1, 9.0)), (4, (9.9, 10.2, 9.8))):
        timings = {
            TUNED: tuned_rounds,
            "vllm_fallback": (12.0, 12.1, 12.0),
            "sglang_file": (10.0, 10.1, 10.0),
        }
        configs = {TUNED: tuned, "vllm_fallback": fallback, "sglang_file": shipped}
        confirmation = Confirmation(m, timings, configs)
        decisions = tuple(decide(confirmation, ("vllm", "sglang")))
        rows.append(BatchResult(m, tuned, 9.0, None, 0, 0.0, {}, None, confirmation, decisions))
    split = [SplitResult(m, tuned, 9.0, None, 8.5, True) for m in (2, 4)]
    assert [row.written_for("sglang") for row in rows] == [TUNED, "sglang_file"]
    results, pairs = written_configs("sglang", rows, baselines, split)
    assert results == {2: tuned, 4: shipped}
    assert [(p.single, p.split) for p in pairs] == [(tuned, True), (shipped, False)]
    up, down = engine_tables("sglang", results, pairs)
    assert up[4] == shipped.as_config() and down[4] == {**shipped.as_config(), "USE_TMA": False}
    vllm_results, _ = written_configs("vllm", rows, baselines, split)
    assert vllm_results == {2: tuned, 4: tuned}
