"""bench/parity.py's CPU-checkable parts: kernel loading, the layer check, the CPU exit."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from moetune.kernel.problem import make_problem
from moetune.tune.measure.timing import SIZING_REPLAYS

PARITY = Path(__file__).resolve().parents[2] / "bench" / "parity.py"
CONFIG = dict(
    BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2
)


@pytest.fixture(scope="module")
def parity():
    spec = importlib.util.spec_from_file_location("bench_parity", PARITY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_missing_vllm_source_is_skipped_and_said(parity, tmp_path):
    kernels, notes = parity.load_kernels(str(tmp_path / "absent.py"))
    assert sorted(kernels) == ["moetune"]
    assert len(notes) == 1 and "vllm kernel skipped" in notes[0]


@pytest.mark.parametrize("dtype, block_shape", [("fp16", None), ("fp8_w8a8", (128, 128))])
def test_the_layer_check_passes_moetunes_kernel_and_catches_a_wrong_one(parity, dtype, block_shape):
    """What the GPU run's error check relies on: moetune's two GEMMs, glued as fused_moe
    glues them, match naive_fused_experts; a kernel that drops the routed weight does not."""
    M, E, N, K, top_k = 5, 4, 32, 128, 2
    problem = make_problem(
        M * parity.TOKEN_SETS, E, N, K, top_k, dtype, block_shape, device="cpu", seed=2
    )
    kernels, _ = parity.load_kernels(None)
    token_set = parity.token_sets(problem, M, top_k)[3]
    expected = parity.reference(problem, token_set)
    error = parity.layer_error(
        kernels["moetune"], problem, CONFIG, token_set, block_shape, expected
    )
    assert error < (3e-2 if block_shape else 1e-3)

    def unweighted(*args, **kwargs):
        return kernels["moetune"](*args, **{**kwargs, "mul_routed_weight": False})

    wrong = parity.layer_error(unweighted, problem, CONFIG, token_set, block_shape, expected)
    assert wrong > 0.1


def test_configs_add_vllms_published_entry_once(parity):
    configs = parity.configs_for("qwen3-30b-a3b-tp1", 256)
    assert configs["vllm-file"] == parity.cfg("32/256/128/16/4/2")
    assert "vllm-file" not in parity.configs_for("qwen3-30b-a3b-tp1", 4096)  # same as t256


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_no_gpu_is_a_one_line_error(parity, capsys):
    assert parity.main(["--out", "/nonexistent/never-written"]) == 1
    assert capsys.readouterr().err.strip() == "Error: bench/parity.py needs a CUDA GPU"


STANDIN = Path(__file__).resolve().parent / "data" / "gptq_awq_standin.py"


def test_int4_kernels_load_with_vllms_or_say_why_not(parity, tmp_path):
    kernels, notes = parity.load_kernels(str(tmp_path / "absent.py"), "int4_w4a16")
    assert sorted(kernels) == ["moetune"] and "int4 vllm kernel skipped" in notes[0]
    bf16_only = tmp_path / "bf16_only.py"
    bf16_only.write_text("fused_moe_kernel = None\n")
    kernels, notes = parity.load_kernels(str(bf16_only), "int4_w4a16")
    assert sorted(kernels) == ["moetune"] and "no fused_moe_kernel_gptq_awq" in notes[0]
    kernels, notes = parity.load_kernels(str(STANDIN), "int4_w4a16")
    assert sorted(kernels) == ["moetune", "vllm"] and notes == []


def int4_layer_error(parity, launcher, M=3):
    """The tiny int4 shape's layer through `launcher`, relative RMS error vs float32."""
    E, N, K, top_k, *_ = parity.SHAPES["tiny-int4"]
    group = parity.GROUP_SIZES["tiny-int4"]
    problem = parity.half_precision(
        make_problem(
            M * parity.TOKEN_SETS, E, N, K, top_k, "int4_w4a16", device="cpu", group_size=group
        )
    )
    token_set = parity.token_sets(problem, M, top_k)[1]
    config = parity.TINY_INT4_CONFIGS["n32k64"]
    expected = parity.reference(problem, token_set)
    return parity.layer_error(launcher, problem, config, token_set, None, expected)


def swapped_standin(folder: Path) -> Path:
    """The stand-in with the weight's k and n strides passed on the other way round."""
    forwarded = "        stride_be,\n        stride_bn,\n        stride_bk,\n"
    source = STANDIN.read_text()
    assert source.count(forwarded) == 1, "the stand-in forwards the weight's strides once"
    swapped = forwarded.replace("stride_bn", "@").replace("stride_bk", "stride_bn")
    path = folder / "gptq_awq_swapped.py"
    path.write_text(source.replace(forwarded, swapped.replace("@", "stride_bk")))
    return path


def test_int4_vllm_launcher_passes_vllms_argument_order(parity, tmp_path):
    """The launcher feeds vLLM's parameter list right; the wrong stride order is caught."""
    right = parity.load_vllm_kernel(STANDIN, "fused_moe_kernel_gptq_awq")
    wrong = parity.load_vllm_kernel(swapped_standin(tmp_path), "fused_moe_kernel_gptq_awq")
    assert int4_layer_error(parity, parity.vllm_wna16_launcher(right)) < 1e-3
    assert int4_layer_error(parity, parity.vllm_wna16_launcher(wrong)) > 0.1


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU (interpreter) path of --check-only")
def test_int4_check_only_runs_on_the_cpu(parity, tmp_path):
    """bench/parity.py's int4 mode end to end on a tiny shape: both kernels' layers checked."""
    out = tmp_path / "out"
    args = ["--shapes", "tiny-int4", "--batch-sizes", "3,20", "--check-only", "--out", str(out)]
    assert parity.main([*args, "--vllm-ref", str(STANDIN)]) == 0
    rows = json.loads((out / "parity.json").read_text())["rows"]
    assert [row["M"] for row in rows] == [3, 20]
    for row in rows:
        assert sorted(row["errors"]) == sorted(
            f"{k}|{c}" for k in ("vllm", "moetune") for c in parity.TINY_INT4_CONFIGS
        )
        for errors in row["errors"].values():
            assert isinstance(errors, list) and len(errors) == 1 and errors[0] < 1e-3, row["errors"]
    assert "| tiny-int4 | 20 | n64k32 |" in (out / "parity.md").read_text()


def test_unknown_shape_is_a_one_line_error(parity, capsys):
    assert parity.main(["--shapes", "nope", "--out", "/nonexistent/never-written"]) == 1
    assert capsys.readouterr().err.strip().startswith("Error: unknown shape(s) nope; known:")


class _FakeDevice:
    """Just enough of torch.cuda for the timed path on the CPU: every eager call takes
    `eager_ms` (so a graph holds one call), graphs replay nothing and count their replays."""

    def __init__(self, eager_ms: float):
        self.eager_ms, self.replays, self.reset = eager_ms, [], 0
        device = self

        class Event:
            def __init__(self, enable_timing=True):
                pass

            def record(self):
                pass

            def elapsed_time(self, other):
                return device.eager_ms

        class Graph:
            def replay(self):
                device.replays.append(self)

            def reset(self):
                device.reset += 1

        self.Event, self.CUDAGraph = Event, Graph

    def install(self, monkeypatch):
        import contextlib

        monkeypatch.setattr(torch.cuda, "Event", self.Event)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", self.CUDAGraph)
        monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a fake device stands in for the GPU")
def test_the_timed_path_replays_every_graph_round_robin(parity, monkeypatch):
    """measure_point's timing on a fake device: one graph per (kernel, config), captured by
    the tuner's harness, replayed once per round (up to 3x `rounds` while a quarter of the
    budget lasts), all closed at the end."""
    device = _FakeDevice(eager_ms=5.0)
    device.install(monkeypatch)
    E, N, K, top_k, *_ = parity.SHAPES["tiny-int4"]
    problem = parity.half_precision(
        make_problem(
            3 * parity.TOKEN_SETS, E, N, K, top_k, "int4_w4a16", device="cpu", group_size=32
        )
    )
    kernels, _ = parity.load_kernels(None, "int4_w4a16")
    row = parity.measure_point("tiny-int4", 3, problem, kernels, rounds=4, budget_s=600.0)
    keys = sorted(f"moetune|{c}" for c in parity.TINY_INT4_CONFIGS)
    assert sorted(row["us"]) == keys and row["rounds"] == 12  # replays here take no time
    assert all(len(samples) == 12 for samples in row["samples"].values())
    # Each capture first replays its one-call sizing graph (then reset); then 2 graphs: one
    # warm-up replay each, then one replay each per round, the order reversed every other
    # round; every graph reset.
    sizing = 2 * SIZING_REPLAYS
    timed = device.replays[sizing:]
    assert len(set(device.replays[:sizing])) == 2 and not set(device.replays[:sizing]) & set(timed)
    assert len(timed) == 2 * (1 + 12) and len(set(timed)) == 2
    rounds = [timed[2 + 2 * r : 4 + 2 * r] for r in range(12)]
    assert all(rounds[r + 1] == rounds[r][::-1] for r in range(11))
    assert device.reset == 2 + 2
    assert all(row["us"][key] == pytest.approx(5000.0) for key in keys)  # 5 ms, 1 call per graph
    assert all(isinstance(e, list) and e[0] < 1e-3 for e in row["errors"].values())
