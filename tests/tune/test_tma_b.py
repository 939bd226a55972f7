"""vLLM 0.34's per-entry USE_TMA (TMA-B) as a tuning dimension, and the release a vLLM file is for.

The TMA-B path cannot run under the interpreter (no CUDA device): these tests cover the
candidates the tune re-times with TMA-B off, the store keys, the decision (a stand-in
backend times TMA-B off faster at small M only) and the files written and read per
release.
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from moetune.device import DeviceLimits
from moetune.engines.launch import KernelRef, twin_ref
from moetune.engines.tuned_file import load_tuned_file, validate_tuned_config
from moetune.errors import MoetuneError, TuneError
from moetune.kernel.config import Candidate
from moetune.tune.measure.worker import Outcome
from moetune.tune.output import engine_tables, write_engine_files
from moetune.tune.runner import TuneRequest, make_plan, plan_json, plan_lines, run_tune
from moetune.tune.search.space import TMA_B_OFF_TOP, tma_b_off_candidates
from moetune.tune.store import Measurement, ResultStore

sys.path.insert(0, str(Path(__file__).parent))
from synthetic import DEEPSEEK_V3_TP8, SyntheticGPU  # noqa: E402

VLLM_034 = KernelRef("vllm", "0.34.0", "0.34.0", "/site/vllm/fused_moe.py", "0123456789ab")
VLLM_033 = KernelRef("vllm", "0.33.0", "0.33.0", "/site/vllm/fused_moe.py", "f37773a8ca2c")
H200 = DeviceLimits.h200()
ON_034 = replace(DEEPSEEK_V3_TP8, kernel=VLLM_034)  # E=256, I=256, H=7168, block [128, 128]
# Block fp8 tiles: BLOCK_SIZE_K divides the block's 128.
SPACE = tuple(
    Candidate(bm, bn, bk, 1, 4, stages)
    for bm in (16, 64)
    for bn in (64, 128)
    for bk in (64, 128)
    for stages in (3, 4)
)
A = Candidate(16, 128, 128, 1, 4, 3)
OFF = A.with_tma_b(False)


def test_candidate_carries_tma_b_off_only():
    assert A.as_config() == {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 128,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 3,
    }
    assert OFF.as_config() == {**A.as_config(), "USE_TMA": False}
    assert Candidate.from_config(OFF.as_config()) == OFF
    assert Candidate.from_config({**A.as_config(), "USE_TMA": True}) == A  # vLLM's default
    assert OFF != A and OFF.short().endswith("TMA-B off")
    with pytest.raises(TuneError, match="USE_TMA must be true or false"):
        Candidate.from_config({**A.as_config(), "USE_TMA": 1})


def _timed(problem_key, candidate, latency, batch_size=4):
    return Measurement(
        problem_key, batch_size, candidate, "full", "ok", latency, latency, latency, 0.1, None,
        "NVIDIA H200", "3.6.0", "0", 0.0,
    )  # fmt: skip


def test_store_keys_tell_tma_b_on_from_off(tmp_path):
    store = ResultStore(tmp_path / "store.jsonl")
    for candidate, latency in ((A, 10.0), (OFF, 8.0)):
        store.add(_timed("p", candidate, latency))
    reopened = ResultStore(tmp_path / "store.jsonl")
    assert reopened.get("p", 4, A, "full", "NVIDIA H200", "3.6.0").latency_us == 10.0
    assert reopened.get("p", 4, OFF, "full", "NVIDIA H200", "3.6.0").latency_us == 8.0


def test_a_transfer_seeds_the_tiles_not_the_tma_b_switch(tmp_path):
    from moetune.tune.measure.measurer import RunContext
    from moetune.tune.runner import transfer_seeds

    store = ResultStore(tmp_path / "store.jsonl")
    for candidate, latency in ((OFF, 8.0), (A, 10.0), (Candidate(64, 128, 128, 1, 4, 3), 12.0)):
        store.add(_timed(ON_034.key(), candidate, latency))
    target = replace(DEEPSEEK_V3_TP8, kernel=None)
    context = RunContext(target, "NVIDIA H200", "3.6.0")
    seeds = transfer_seeds(store, context, ON_034, (4,))
    assert seeds == {4: [A, Candidate(64, 128, 128, 1, 4, 3)]}


def test_off_twins_of_the_best_few_where_tma_b_applies():
    ranking = list(SPACE)
    twins = tma_b_off_candidates(ranking, ON_034, H200, "0.34.0")
    assert twins == [c.with_tma_b(False) for c in ranking[:TMA_B_OFF_TOP]]
    # Already-off configs in the ranking are not counted twice.
    assert tma_b_off_candidates([OFF, *ranking], ON_034, H200, "0.34.0") == twins


@pytest.mark.parametrize(
    "problem, limits, release",
    [
        (ON_034, H200, "0.33.0"),  # a file for 0.33 never carries USE_TMA
        (replace(DEEPSEEK_V3_TP8, kernel=twin_ref("sglang")), H200, "0.34.0"),  # SGLang's
        (DEEPSEEK_V3_TP8, H200, "0.33.0"),  # vLLM's twin, for a 0.33 file
        (replace(DEEPSEEK_V3_TP8, kernel=VLLM_033), H200, "0.34.0"),  # 0.33's kernel
        (ON_034, replace(H200, compute_capability=(8, 0)), "0.34.0"),  # Ampere
        (replace(ON_034, dtype="bf16", block_shape=None), H200, "0.34.0"),  # not block fp8
    ],
)
def test_no_off_twins_where_tma_b_never_applies(problem, limits, release):
    assert tma_b_off_candidates(list(SPACE), problem, limits, release) == []


def test_vllms_twin_follows_034_so_its_block_fp8_tiles_are_tried_with_tma_b_off_too():
    twin = replace(DEEPSEEK_V3_TP8, kernel=None)  # vLLM not installed: moetune's twin
    ranking = list(SPACE)
    assert tma_b_off_candidates(ranking, twin, H200, "0.34.0") == [
        c.with_tma_b(False) for c in ranking[:TMA_B_OFF_TOP]
    ]


def test_no_off_twin_where_neither_gemm_takes_tma_b():
    # I=96: the up GEMM's N=192 and the down GEMM's K=96 are no multiple of a 128 tile.
    problem = replace(ON_034, intermediate_size=96)
    wide = Candidate(16, 128, 128, 1, 4, 3)
    assert tma_b_off_candidates([wide], problem, H200, "0.34.0") == []
    narrow = Candidate(16, 64, 32, 1, 4, 3)  # 192 % 64 == 0 and 96 % 32 == 0
    assert tma_b_off_candidates([narrow], problem, H200, "0.34.0") == [narrow.with_tma_b(False)]


RESULTS = {1: OFF, 64: A}


def test_tables_carry_use_tma_false_only_for_a_release_that_reads_it():
    (table,) = engine_tables("vllm", RESULTS, vllm_release="0.34.0")
    assert table[1]["USE_TMA"] is False and "USE_TMA" not in table[64]
    (table,) = engine_tables("vllm", RESULTS, vllm_release="0.33.0")
    assert all("USE_TMA" not in entry for entry in table.values())
    up, down = engine_tables("sglang", RESULTS)
    assert "USE_TMA" not in up[1]  # SGLang's USE_TMA is its split TMA, not TMA-B
    assert down[1]["USE_TMA"] is False and down[1]["BLOCK_SIZE_M"] == 16


def test_written_vllm_file_per_release(tmp_path):
    (path,) = write_engine_files(
        RESULTS, DEEPSEEK_V3_TP8, "NVIDIA H200", "3.6.0", tmp_path / "a", ("vllm",),
        vllm_release="0.34.0",
    )  # fmt: skip
    written = json.loads(path.read_text())
    assert written["1"]["USE_TMA"] is False and "USE_TMA" not in written["64"]
    (path,) = write_engine_files(
        RESULTS, DEEPSEEK_V3_TP8, "NVIDIA H200", "3.6.0", tmp_path / "b", ("vllm",),
        vllm_release="0.33.0",
    )  # fmt: skip
    assert "USE_TMA" not in path.read_text()
    # The schema: USE_TMA false only in a file for a release that reads it, never true.
    with pytest.raises(TuneError, match="USE_TMA"):
        validate_tuned_config(written, "vllm")
    validate_tuned_config(written, "vllm", tma_b=True)
    written["64"]["USE_TMA"] = True
    with pytest.raises(TuneError, match="USE_TMA"):
        validate_tuned_config(written, "vllm", tma_b=True)


def test_a_vllm_file_with_use_tma_read_per_release(tmp_path):
    path = (
        tmp_path / "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    )
    path.write_text(
        json.dumps({"triton_version": "3.6.0", "1": OFF.as_config(), "64": A.as_config()})
    )
    tuned = load_tuned_file(path, vllm_release="0.34.0")
    assert tuned.pick(1) == OFF and tuned.pick(64) == A
    with pytest.raises(MoetuneError) as refused:
        load_tuned_file(path, vllm_release="0.33.0")
    message = str(refused.value)
    assert (
        "\n" not in message and "USE_TMA" in message and "stops the server at start-up" in message
    )


class TmaBackend:
    """Times whole calls on a synthetic GPU; TMA-B off is 20 % faster up to M = 4 and 20 %
    slower above. Every check against the reference passes. `log`: (mode, M, candidate)."""

    compile_workers = 0
    parallelism = 1

    def __init__(self, problem):
        self.gpu = SyntheticGPU(problem, 5, fixed_noise=True)
        self.log = []

    def run(self, units, then=None):
        for unit in units:
            for candidate in unit.candidates:
                self.log.append((unit.mode, unit.batch_size, candidate))
                if unit.mode == "verify":
                    yield unit, Outcome(candidate, "ok", rel_rms=0.001)
                    continue
                us = self.gpu.true_us(unit.batch_size, candidate.with_tma_b(True))
                if us is None:
                    yield unit, Outcome(candidate, "crashed", error="synthetic")
                    continue
                if not candidate.USE_TMA:
                    us *= 0.8 if unit.batch_size <= 4 else 1.2
                yield unit, Outcome(candidate, "ok", us, us, us, compile_s=0.1)

    def close(self):
        pass


def _request(tmp_path, problem, **extra):
    return TuneRequest(
        problem=problem,
        batch_sizes=(1, 4, 64, 1024),
        space=SPACE,
        save_dir=tmp_path,
        engines=("vllm",),
        device_name="NVIDIA H200",
        triton_version="3.6.0",
        **{"devices": ("cuda:0",), **extra},
    )


def test_tune_writes_use_tma_false_only_where_off_wins(tmp_path):
    plan = make_plan(_request(tmp_path, ON_034, vllm_release="0.34.0"), H200)
    assert any("re-timed with TMA-B off" in line for line in plan_lines(plan))
    backend = TmaBackend(ON_034)
    summary = run_tune(plan, backend=backend)
    off_timed = {m for mode, m, c in backend.log if not c.USE_TMA and mode != "verify"}
    assert off_timed == {1, 4, 64, 1024}
    picked = {row.batch_size: row.config for row in summary.rows}
    assert not picked[1].USE_TMA and not picked[4].USE_TMA
    assert picked[64].USE_TMA and picked[1024].USE_TMA
    (path,) = summary.files
    written = json.loads(path.read_text())
    assert written["1"]["USE_TMA"] is False and written["4"]["USE_TMA"] is False
    assert "USE_TMA" not in written["64"] and "USE_TMA" not in written["1024"]


def test_no_tma_b_round_on_the_cpu(tmp_path):
    plan = make_plan(_request(tmp_path, ON_034, vllm_release="0.34.0", devices=(None,)), H200)
    assert "             USE_TMA: not tuned on the CPU (the interpreter has no TMA-B)" in (
        plan_lines(plan)
    )
    backend = TmaBackend(ON_034)
    summary = run_tune(plan, backend=backend)
    assert all(c.USE_TMA for _, _, c in backend.log)
    assert "USE_TMA" not in summary.files[0].read_text()


def test_tune_for_0_33_never_times_or_writes_tma_b_off(tmp_path):
    plan = make_plan(_request(tmp_path, ON_034, vllm_release="0.33.0"), H200)
    lines = plan_lines(plan)
    assert "vLLM file:   for vLLM 0.33.0 (--vllm-release)" in lines
    assert not any("TMA-B off" in line for line in lines)
    backend = TmaBackend(ON_034)
    summary = run_tune(plan, backend=backend)
    assert all(c.USE_TMA for _, _, c in backend.log)
    assert "USE_TMA" not in summary.files[0].read_text()


def test_plan_names_the_vllm_release_the_file_is_for(tmp_path):
    note = "vLLM is not installed here: the newest release moetune knows"
    plan = make_plan(_request(tmp_path, DEEPSEEK_V3_TP8, vllm_release_note=note), H200)
    assert f"vLLM file:   for vLLM 0.34.0 ({note})" in plan_lines(plan)
    assert plan_json(plan)["vllm_release"] == "0.34.0"
    sglang = make_plan(replace(plan.request, engines=("sglang",)), H200)
    assert not any(line.startswith("vLLM file:") for line in plan_lines(sglang))
    assert plan_json(sglang)["vllm_release"] is None


def test_tunes_comparison_reads_the_vllm_file_as_its_release(tmp_path):
    from moetune.engines.names import vllm_config_filename
    from moetune.tune.baselines import engine_baselines

    name = vllm_config_filename(256, 256, "NVIDIA_H200", "fp8_w8a8", (128, 128))
    (tmp_path / name).write_text(
        json.dumps({"triton_version": "3.6.0", "1": OFF.as_config(), "64": A.as_config()})
    )

    def baselines(release, notes):
        return {
            b.key: b
            for b in engine_baselines(
                DEEPSEEK_V3_TP8,
                (1, 64),
                ("vllm",),
                "NVIDIA_H200",
                "3.6.0",
                env={},
                vllm_package=None,
                compare_dir=tmp_path,
                notes=notes,
                vllm_release=release,
            )  # fmt: skip
        }

    notes = []
    found = baselines("0.34.0", notes)
    assert found["vllm_file"].configs == {1: OFF, 64: A} and not notes
    found = baselines("0.33.0", notes)
    assert "vllm_file" not in found
    (note,) = notes
    assert note.startswith("not compared with the vllm file: ")
    assert "stops the server at start-up" in note and "\n" not in note


TINY = Path(__file__).parent / "data"


def _dry_run(tmp_path, *extra):
    from click.testing import CliRunner

    from moetune.cli import cli

    args = ["tune", "--model", str(TINY / "tiny-moe"), "--space", str(TINY / "tiny-space.json")]
    args += ["--batch-size", "2", "--save-dir", str(tmp_path), "--dry-run", *extra]
    return CliRunner().invoke(cli, args)


def test_tune_vllm_release_option(tmp_path, monkeypatch):
    from moetune.engines import vllm

    monkeypatch.setattr(vllm, "installed", lambda: None)
    result = _dry_run(tmp_path)
    assert result.exit_code == 0, result.output
    assert (
        "vLLM file:   for vLLM 0.34.0 (vLLM is not installed: the newest known; "
        "--vllm-release chooses another)"
    ) in result.output
    result = _dry_run(tmp_path, "--vllm-release", "0.33.0", "--json")
    assert result.exit_code == 0, result.output
    assert '"vllm_release": "0.33.0"' in result.output


def test_tune_refuses_an_unknown_vllm_release_in_one_line(tmp_path, capsys):
    from moetune.cli import main

    args = ["tune", "--model", str(TINY / "tiny-moe"), "--space", str(TINY / "tiny-space.json")]
    with pytest.raises(SystemExit) as exc:
        main([*args, "--save-dir", str(tmp_path), "--dry-run", "--vllm-release", "0.99.0"])
    assert exc.value.code != 0
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "Error: --vllm-release 0.99.0: not a vLLM release moetune knows (known: 0.33.0, 0.34.0)"
    )
