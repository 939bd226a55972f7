"""A both-engine tune timing each engine's file on its own kernel: the second plan is a transfer.

The plans come from `plan_sweep` and run through `run_sweep`/`run_tune` as
`moetune tune` runs them, over a stand-in backend whose GPU is the two-kernel
synthetic one (tests/tune/synthetic.py): vLLM's kernel times the first
landscape, SGLang's the second.
"""

import math
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from moetune.cli import cli
from moetune.engines.launch import KernelRef
from moetune.errors import Interrupted
from moetune.extract.layouts import expand_layouts, resolve_layouts
from moetune.kernel.probe import Probe
from moetune.tune.estimate import default_rates, estimate
from moetune.tune.measure.measurer import RunContext
from moetune.tune.measure.worker import Outcome
from moetune.tune.request import SweepRequest
from moetune.tune.runner import plan_lines, ranked, run_tune
from moetune.tune.search.space import DeviceLimits, default_space
from moetune.tune.store import ResultStore
from moetune.tune.sweep import plan_sweep, run_sweep, sweep_json, sweep_lines

sys.path.insert(0, str(Path(__file__).parent))
from stand_ins import stand_in_vllm  # noqa: E402
from synthetic import OtherKernelGPU, SyntheticGPU  # noqa: E402

VLLM = KernelRef("vllm", "0.33.0", "0.33.0", "/site/vllm/fused_moe.py", "f37773a8ca2c")
SGLANG = KernelRef("sglang", "0.5.23", "0.5.23", "/site/sglang/kernels.py", "03001b759f81")
MODEL = "Qwen/Qwen3-30B-A3B"  # E=128, N=768, K=2048, top-k 8
SEEDED_LINE = (
    "             seeded from the vLLM 0.33.0 kernel's results (transfer), then a local climb"
)

R = default_rates()  # the packaged table's default GPU


def both_engines(tmp_path, search="fast", batch_sizes=(16, 256), kernels=None, space=None):
    layouts = expand_layouts([1], dtypes=["bf16"])
    request = SweepRequest(
        MODEL,
        tuple(layouts),
        limits=DeviceLimits.h200(),
        is_sweep=False,
        kernels={"vllm": VLLM, "sglang": SGLANG} if kernels is None else kernels,
        batch_sizes=batch_sizes,
        space=tuple(space or default_space()),
        save_dir=tmp_path,
        search=search,
        device_name="NVIDIA H200",
        triton_version="3.6.0",
    )
    return plan_sweep(request, resolve_layouts(MODEL, layouts))


class TwoKernelBackend:
    """Times units on the synthetic GPU of the unit's kernel; every check passes.

    `log` holds (engine, batch size, candidate, mode) per timed candidate;
    `stop_after` raises KeyboardInterrupt once SGLang's kernel has timed that many.
    """

    compile_workers = 0
    parallelism = 1

    def __init__(self, problem, stop_after=None):
        self.gpus = {"vllm": SyntheticGPU(problem, 3), "sglang": OtherKernelGPU(problem, 3)}
        self.log = []  # the search's and the baselines' timings
        self.confirmed = []  # the confirmation rounds'
        self.stop_after = stop_after

    def run(self, units, then=None):
        for unit in units:
            gpu = self.gpus[unit.problem.kernel.engine]
            for candidate in unit.candidates:
                if unit.mode == "verify":
                    yield unit, Outcome(candidate, "ok", rel_rms=0.001)
                    continue
                engine = unit.problem.kernel.engine
                if unit.mode == "confirm":  # the confirmation re-times on purpose: kept apart
                    self.confirmed.append((engine, unit.batch_size, candidate))
                    yield unit, self.time(gpu, unit.batch_size, candidate)
                    continue
                if self.stop_after is not None and engine == "sglang":
                    if sum(1 for row in self.log if row[0] == "sglang") >= self.stop_after:
                        raise KeyboardInterrupt
                self.log.append((engine, unit.batch_size, candidate, unit.mode))
                yield unit, self.time(gpu, unit.batch_size, candidate)

    @staticmethod
    def time(gpu, m, candidate):
        if isinstance(candidate, Probe):  # the split search's lone GEMMs and pairs
            parts = [(0.6, candidate.candidate)] if candidate.kind == "up" else []
            parts += [(0.45, candidate.candidate)] if candidate.kind == "down" else []
            if candidate.kind == "pair":
                parts = [(0.6, candidate.candidate), (0.45, candidate.down)]
            times = [gpu.true_us(m, config) for _, config in parts]
            us = (
                None
                if None in times
                else sum(s * t for (s, _), t in zip(parts, times, strict=True))
            )
        else:
            us = gpu.true_us(m, candidate)
        if us is None:
            return Outcome(candidate, "compile_error", error="synthetic failure")
        return Outcome(candidate, "ok", latency_us=us, p20_us=us, p80_us=us, compile_s=0.1)

    def measure_ceilings(self):
        raise AssertionError("no ceilings on a CPU run")

    def close(self):
        pass


def whole_timings(log, engine):
    return [row for row in log if row[0] == engine and not isinstance(row[2], Probe)]


def run(sweep, backend):
    return run_sweep(sweep, lambda index, plan, shared: run_tune(plan, backend=shared), backend)


def test_the_second_kernels_plan_is_seeded_from_the_first_only_under_fast_search(tmp_path):
    sweep = both_engines(tmp_path)
    first, second = sweep.plans
    assert first.problem.kernel == VLLM and first.request.engines == ("vllm",)
    assert second.problem.kernel == SGLANG and second.request.engines == ("sglang",)
    assert first.seeded_from is None and second.seeded_from == first.problem
    # Store keys keep the kernel: each plan's measurements stay its own.
    assert first.problem.key() != second.problem.key()
    assert first.store_path == second.store_path
    for search in ("exhaustive", "thorough"):
        assert [p.seeded_from for p in both_engines(tmp_path, search).plans] == [None, None]
    # One kernel for both engines (the twin): one plan, nothing to transfer.
    (single,) = both_engines(tmp_path, kernels={}).plans
    assert single.seeded_from is None and single.request.engines == ("vllm", "sglang")


def test_the_plan_says_the_second_search_is_seeded_and_prices_it_so(tmp_path):
    from moetune.tune.search.space import DEFAULT_BATCH_SIZES

    sweep = both_engines(tmp_path, batch_sizes=tuple(DEFAULT_BATCH_SIZES))
    first, second = sweep.plans
    assert SEEDED_LINE not in plan_lines(first)
    lines = plan_lines(second)
    search = next(i for i, line in enumerate(lines) if line.startswith("Search:"))
    assert lines[search + 1] == SEEDED_LINE
    assert SEEDED_LINE in sweep_lines(sweep)

    full, transfer = sweep.estimates()  # one run: the first plan pays the start-up
    assert full.timed == math.ceil(full.pairs * R.fast_search_share)
    assert transfer.pairs == full.pairs
    assert transfer.timed == R.transfer_per_batch * len(DEFAULT_BATCH_SIZES)
    # Compiling outlasts timing on the timer (bf16: 0.36 CPU-s a timing over 14 processes).
    compiling = transfer.timed * R.compile_s_per_timing["bf16"] / R.compile_workers
    assert transfer.stage_seconds("search") == pytest.approx(R.search_tail["transfer"] * compiling)
    # About 40 % of the timings (fast search climbs from two starts); its short searches wait
    # on their tails more (replayed with every batch size's seeds asked at once: 0.4-0.5).
    assert transfer.stage_seconds("search") < 0.55 * full.stage_seconds("search")
    assert transfer.stage_seconds("start-up") == 0 < full.stage_seconds("start-up")
    assert sweep.estimate_s() == pytest.approx(full.seconds + transfer.seconds)

    data = sweep_json(sweep)
    shapes = data["shapes"]
    assert [s["seeded_from"] for s in shapes] == [None, first.problem.key()]
    assert shapes[1]["estimate_timed"] == transfer.timed
    assert data["estimate_s"] == pytest.approx(full.seconds + transfer.seconds, abs=0.1)


def test_a_transfer_is_priced_at_the_whole_space_where_the_space_is_small(tmp_path):
    from moetune.tune.search.space import load_space

    tiny = load_space(str(Path(__file__).parent / "data" / "tiny-space.json"))
    sweep = both_engines(tmp_path, space=tuple(tiny))  # 3 candidates: timed whole
    assert estimate(sweep.plans[1]).timed == sum(
        len(r.kept) for r in sweep.plans[1].pruning.values()
    )


def test_the_second_kernel_is_tuned_by_a_transfer_from_the_first_kernels_results(tmp_path):
    sweep = both_engines(tmp_path)
    first, second = sweep.plans
    backend = TwoKernelBackend(replace(first.problem, kernel=None))
    result = run(sweep, backend)
    assert [s.plan for s in result.summaries] == [first, second]

    vllm, sglang = whole_timings(backend.log, "vllm"), whole_timings(backend.log, "sglang")
    assert len(sglang) < 0.45 * len(vllm), (len(sglang), len(vllm))
    store = ResultStore(first.store_path)
    on_vllm = RunContext(first.problem, "NVIDIA H200", "3.6.0")
    for m in (16, 256):
        # SGLang's search began with vLLM's eight best full timings at this batch size.
        seeds = [row.candidate for row in ranked(store, on_vllm, m, "full")][:8]
        asked = [c for engine, batch, c, mode in sglang if batch == m and mode == "quick"]
        assert asked[: len(seeds)] == seeds
    # Every timing is in the store under its own kernel's key, none taken twice.
    assert max(Counter(backend.log).values()) == 1
    keys = Counter(row.problem_key for row in store.all())
    assert set(keys) == {first.problem.key(), second.problem.key()}
    # The written SGLang file holds configs that ran on SGLang's kernel.
    sglang_summary = result.summaries[1]
    gpu = backend.gpus["sglang"]
    for row in sglang_summary.rows:
        best = min(us for us in (gpu.true_us(row.batch_size, c) for c in default_space()) if us)
        assert gpu.true_us(row.batch_size, row.config) <= best * 1.03

    # Rerun: everything comes from the store, the transfer's timings included.
    again = TwoKernelBackend(replace(first.problem, kernel=None))
    resumed = run(sweep, again)
    assert whole_timings(again.log, "vllm") == whole_timings(again.log, "sglang") == []
    assert [s.measured for s in resumed.summaries] == [0, 0]
    assert [r.config for r in resumed.summaries[1].rows] == [r.config for r in sglang_summary.rows]


def test_an_interrupted_transfer_resumes_without_timing_anything_twice(tmp_path):
    sweep = both_engines(tmp_path)
    problem = replace(sweep.plans[0].problem, kernel=None)
    stopped = TwoKernelBackend(problem, stop_after=25)
    with pytest.raises(Interrupted, match="rerun the same command to resume"):
        run(sweep, stopped)
    done = len(whole_timings(stopped.log, "sglang"))
    assert done == 25
    store = ResultStore(sweep.store_path)
    assert sum(1 for row in store.all() if row.problem_key == sweep.plans[1].problem.key()) == 25

    resumed = TwoKernelBackend(problem)
    result = run(sweep, resumed)
    assert len(result.summaries) == 2
    assert whole_timings(resumed.log, "vllm") == []  # the first plan: all from the store
    both = Counter(stopped.log + resumed.log)
    assert max(both.values()) == 1  # the transfer picked up where it stopped


@pytest.mark.parametrize("search", ["fast", "thorough"])
def test_tune_dry_run_says_the_second_kernels_search_is_a_transfer(tmp_path, monkeypatch, search):
    import json

    stand_in_vllm(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)  # find_spec reads it first
    args = ["tune", "--model", MODEL, "--tp", "1", "--dry-run", "--search", search,
            "--device-name", "NVIDIA_H200", "--save-dir", str(tmp_path / "out")]  # fmt: skip
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0, text.output
    # vLLM's file on vLLM's kernel first; SGLang (not installed) on moetune's twin after it.
    assert "Kernel:      vLLM 0.33.0's fused_moe_kernel" in text.output
    assert "Kernel:      moetune's twin of SGLang 0.5.23's fused_moe_kernel" in text.output
    assert (SEEDED_LINE in text.output) == (search == "fast")
    data = json.loads(CliRunner().invoke(cli, [*args, "--json"]).stdout)
    first, second = data["shapes"]
    assert first["kernel"]["engine"] == "vllm" and not first["kernel"]["twin"]
    assert second["kernel"]["engine"] == "sglang" and second["kernel"]["twin"]
    assert first["seeded_from"] is None
    assert second["seeded_from"] == (first["problem"] if search == "fast" else None)
    if search == "fast":
        assert second["estimate_timed"] < 0.45 * first["estimate_timed"]
