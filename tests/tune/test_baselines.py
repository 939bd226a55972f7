"""The engine baselines `tune` and `benchmark` time: which configs, from where, per M."""

import json
import math
from types import SimpleNamespace

import pytest

from moetune.kernel.config import Candidate
from moetune.tune.baselines import engine_baselines, geomean_speedup, time_baselines
from moetune.tune.problem import TuneProblem

QWEN = TuneProblem(128, 768, 2048, 8, "bf16")
NAME = "E=128,N=768,device_name=NVIDIA_H200.json"
ROW = {"BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}


def baselines(batch_sizes=(1, 64, 4096), engines=("vllm", "sglang"), env=None, **kwargs):
    return {
        b.key: b
        for b in engine_baselines(
            QWEN,
            batch_sizes,
            engines,
            "NVIDIA H200",
            "3.6.0",
            env=env or {},
            vllm_package=None,
            sglang_package=None,
            **kwargs,
        )
    }


def test_fallbacks_only_without_files():
    found = baselines()
    assert list(found) == ["vllm_fallback", "sglang_fallback"]
    vllm = found["vllm_fallback"].configs
    assert vllm[1] == Candidate(16, 64, 128, 1, 4, 4)
    assert vllm[4096] == Candidate(128, 128, 64, 1, 8, 3)
    # SGLang's bf16 fallback sets no warps/stages: Triton's launch defaults, 4 and 3.
    assert found["sglang_fallback"].configs[1] == Candidate(16, 32, 64, 1, 4, 3)
    assert "sglang_fallback" not in baselines(engines=("vllm",))


def test_existing_files_give_the_row_nearest_to_each_m(tmp_path):
    vllm_dir = tmp_path / "vllm"
    vllm_dir.mkdir()
    table = {
        "triton_version": "3.6.0",
        "1": {"BLOCK_SIZE_M": 16, **ROW},
        "256": {"BLOCK_SIZE_M": 64, **ROW},
    }
    (vllm_dir / NAME).write_text(json.dumps(table))
    sglang_dir = tmp_path / "sglang" / "configs" / "triton_3_5_1"
    sglang_dir.mkdir(parents=True)
    (sglang_dir / NAME).write_text(json.dumps({"8": {"BLOCK_SIZE_M": 32, **ROW}}))
    env = {
        "VLLM_TUNED_CONFIG_FOLDER": str(vllm_dir),
        "SGLANG_MOE_CONFIG_DIR": str(tmp_path / "sglang"),
    }
    found = baselines(env=env)
    assert list(found) == ["vllm_fallback", "sglang_fallback", "vllm_file", "sglang_file"]
    assert found["vllm_file"].source == str(vllm_dir / NAME)
    assert [found["vllm_file"].configs[m].BLOCK_SIZE_M for m in (1, 64, 4096)] == [16, 16, 64]
    # SGLang falls back to another Triton version's folder, and so does the baseline.
    assert found["sglang_file"].source == str(sglang_dir / NAME)


def test_compare_dir_is_searched_first_and_an_unreadable_file_is_a_note(tmp_path):
    (tmp_path / NAME).write_text(json.dumps({"1": {"BLOCK_SIZE_M": 16, **ROW}}))
    found = baselines(engines=("vllm",), compare_dir=tmp_path)
    assert found["vllm_file"].source == str(tmp_path / NAME)
    (tmp_path / NAME).write_text("{not json")
    notes = []
    assert "vllm_file" not in baselines(engines=("vllm",), compare_dir=tmp_path, notes=notes)
    (note,) = notes
    assert note.startswith(f"not compared with the vllm file: {tmp_path / NAME}: cannot read")


class FakeMeasurer:
    def __init__(self, times):
        self.times = times  # Candidate -> latency or None (failed)

    def measure(self, batch_size, candidates, fidelity):
        assert fidelity == "full"
        return {
            c: SimpleNamespace(
                status="ok" if self.times[c] else "out_of_resources",
                latency_us=self.times[c],
                error=None if self.times[c] else "shared memory",
            )
            for c in candidates
        }


def test_time_baselines_records_failures_as_notes():
    found = baselines(batch_sizes=(1,))
    vllm, sglang = found["vllm_fallback"].configs[1], found["sglang_fallback"].configs[1]
    notes = []
    times = time_baselines(
        FakeMeasurer({vllm: 12.0, sglang: None}), list(found.values()), (1,), notes
    )
    assert times == {1: {"vllm_fallback": 12.0, "sglang_fallback": None}}
    assert notes == [
        f"M=1: SGLang fallback {sglang.short()} failed (out_of_resources: shared memory)"
    ]


def test_geomean_speedup_skips_untimed_batch_sizes():
    assert geomean_speedup([(20.0, 10.0), (None, 10.0), (80.0, 10.0)]) == pytest.approx(4.0)
    assert geomean_speedup([(None, 1.0)]) is None
    assert math.isclose(geomean_speedup([(3.0, 3.0)]), 1.0)


def test_an_sglang_file_with_a_down_table_is_paired_only_when_asked(tmp_path):
    (tmp_path / NAME).write_text(json.dumps({"1": {"BLOCK_SIZE_M": 16, **ROW}}))
    down = {"1": {"BLOCK_SIZE_M": 16, **ROW, "num_stages": 5, "USE_TMA": True}}
    (tmp_path / NAME.replace(".json", "_down.json")).write_text(json.dumps(down))
    notes = []
    plain = baselines(engines=("sglang",), compare_dir=tmp_path, notes=notes)["sglang_file"]
    # The tune times whole calls: the up table alone, and a note says so.
    assert plain.configs[1] == Candidate(16, 64, 64, 1, 4, 3)
    (note,) = notes
    assert "has a _down table: compared here on its up table alone" in note
    paired = baselines(engines=("sglang",), compare_dir=tmp_path, pair_down_tables=True)
    pick = paired["sglang_file"].configs[64]
    assert pick.kind == "pair" and pick.down_tma and pick.down.num_stages == 5


def test_an_sglang_up_tma_file_without_down_table_is_timed_as_sglang_runs_it(tmp_path):
    # SGLang reads the up table again for the down GEMM, USE_TMA included.
    table = {"1": {"BLOCK_SIZE_M": 16, **ROW}, "4096": {"BLOCK_SIZE_M": 64, **ROW, "USE_TMA": True}}
    (tmp_path / NAME).write_text(json.dumps(table))
    paired = baselines(engines=("sglang",), compare_dir=tmp_path, pair_down_tables=True)
    configs = paired["sglang_file"].configs
    assert configs[1] == Candidate(16, 64, 64, 1, 4, 3)
    assert configs[4096].kind == "pair" and configs[4096].use_tma and configs[4096].down_tma


def test_an_sglang_file_sglang_cannot_launch_is_not_compared(tmp_path):
    (tmp_path / NAME).write_text(json.dumps({"1": {"BLOCK_SIZE_M": 16, **ROW, "SPLIT_K": 1}}))
    notes = []
    found = baselines(engines=("sglang",), compare_dir=tmp_path, notes=notes)
    assert "sglang_file" not in found
    (note,) = notes
    assert note.startswith("not compared with the sglang file: ") and '"SPLIT_K"' in note


def test_a_per_channel_tune_compares_with_sglangs_per_channel_file(tmp_path):
    # SGLang names per-channel fp8/int8 files with ",per_channel_quant=True" (its
    # get_config_file_name); vLLM's names have no such part.
    problem = TuneProblem(128, 768, 2048, 8, "fp8_w8a8", per_channel=True)
    base = "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8"
    sglang_dir = tmp_path / "configs" / "triton_3_6_0"
    sglang_dir.mkdir(parents=True)
    (sglang_dir / f"{base}.json").write_text(json.dumps({"1": {"BLOCK_SIZE_M": 64, **ROW}}))
    per_channel = sglang_dir / f"{base},per_channel_quant=True.json"
    per_channel.write_text(json.dumps({"1": {"BLOCK_SIZE_M": 32, **ROW}}))
    found = engine_baselines(
        problem,
        (1,),
        ("sglang",),
        "NVIDIA H200",
        "3.6.0",
        env={"SGLANG_MOE_CONFIG_DIR": str(tmp_path)},
        vllm_package=None,
        sglang_package=None,
    )
    (shipped,) = [b for b in found if b.key == "sglang_file"]
    assert shipped.source == str(per_channel)
    assert shipped.configs[1].BLOCK_SIZE_M == 32
