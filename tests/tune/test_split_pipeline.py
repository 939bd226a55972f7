"""The split search's batch sizes side by side: the same pairs in any order, resumable.

Lone-GEMM and pair latencies come from the synthetic GPU's landscape (tests/tune/synthetic.py),
split into an up and a down share with a per-probe twist and fixed noise, so a timing does
not depend on when it is taken. The streamed runs go through the real `StoreMeasurer` over
`SyntheticBackend`, which answers its units in a shuffled order.
"""

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from moetune.kernel.probe import Probe
from moetune.tune.measure.measurer import RunContext, StoreMeasurer
from moetune.tune.search.space import default_space, prune
from moetune.tune.search.split_fast import FastSplitOptions, SeededSplitSearch
from moetune.tune.store import Measurement, ResultStore

sys.path.insert(0, str(Path(__file__).parent))
from synthetic import H200, QWEN3_30B, SyntheticBackend, SyntheticGPU, _unit  # noqa: E402

BATCH_SIZES = (1, 8, 64, 256, 1024)
VARIANTS = [("up", False), ("down", False), ("down", True)]
PIPELINED = FastSplitOptions()
SEQUENTIAL = FastSplitOptions(pipelined=False)


class SplitGPU(SyntheticGPU):
    """Lone GEMMs and pairs on the synthetic landscape: up about 60 % of a whole call, down 40 %,
    each config's share bent by up to 30 % (so the two GEMMs favour different configs), TMA
    within 4 % either way; a pair is its two GEMMs plus 2 us."""

    def lone_us(self, m, kind, candidate, tma):
        whole = self.true_us(m, candidate)
        if whole is None:
            return None
        share = 0.6 if kind == "up" else 0.4
        bend = 0.85 + 0.3 * _unit("bend", kind, self.seed, m, candidate)
        if tma:
            bend *= 0.96 + 0.08 * _unit("tma", self.seed, m, candidate)
        return share * whole * bend

    def probe_us(self, m, probe):
        if probe.kind == "pair":
            up = self.lone_us(m, "up", probe.candidate, probe.use_tma)
            down = self.lone_us(m, "down", probe.down, probe.down_tma)
            return None if up is None or down is None else up + down + 2.0
        return self.lone_us(m, probe.kind, probe.candidate, probe.use_tma)

    def failure(self, probe, m=1):
        if not isinstance(probe, Probe):  # the landscape's own question, of a plain config
            return super().failure(probe, m)
        configs = [probe.candidate] + ([probe.down] if probe.down is not None else [])
        for config in configs:
            failed = super().failure(config, m)
            if failed is not None:
                return failed
        return None

    def measure(self, batch_size, probes, fidelity):
        out = {}
        for probe in probes:
            failed = self.failure(probe, batch_size)
            us = None if failed is not None else self.probe_us(batch_size, probe)
            if us is None:
                out[probe] = Measurement.failure(
                    problem_key="p", batch_size=batch_size, candidate=probe, fidelity=fidelity,
                    status=failed or "runtime_error", error="synthetic", device_name="gpu",
                    triton_version="0", moetune_version="0",
                )  # fmt: skip
                continue
            us *= 1 + 0.01 * (_unit("noise", self.seed, batch_size, probe, fidelity) - 0.5)
            out[probe] = Measurement(
                "p", batch_size, probe, fidelity, "ok", us, us, us, 0.1, None, "gpu", "0", "0", 0.0
            )
        return out


def spaces():
    return {m: prune(default_space(), QWEN3_30B, m, H200).kept for m in BATCH_SIZES}


def singles_and_rankings(gpu):
    """Per batch size the whole-call winner and the whole-call ranking (the search's inputs)."""
    singles, rankings = {}, {}
    for m, space in spaces().items():
        timed = [c for c in space[:: max(1, len(space) // 60)] if gpu.true_us(m, c) is not None]
        ranking = sorted(timed, key=lambda c: gpu.true_us(m, c))
        singles[m], rankings[m] = ranking[0], ranking[:12]
    return singles, rankings


class Widest(StoreMeasurer):
    """Keeps `widest`: the most batch sizes with an ask (prefetches too) out at once."""

    widest = 0

    def measure_stream(self, asks, answered):
        out = {}

        def note(new):
            out.update((id(ask), ask) for ask in new)
            self.widest = max(self.widest, len({ask.batch_size for ask in out.values()}))
            return new

        def watched(ask, results):
            out.pop(id(ask), None)
            return note(answered(ask, results))

        super().measure_stream(note(asks), watched)


def streamed(gpu, path, seed=0, stop_after=None):
    backend = SyntheticBackend(gpu, 4, seed, stop_after)
    context = RunContext(gpu.problem, "Synthetic GPU", "0.0.0")
    return Widest(context, backend, ResultStore(path)), backend


def search(measurer, options, notes=None):
    gpu_singles, rankings = INPUTS
    confirmed = []

    def confirm(found):
        if found.stopped is not None or found.choice is None:
            return []
        confirmed.append(found.batch_size)
        return [Probe.single(gpu_singles[found.batch_size]), found.choice.pair()]

    found = SeededSplitSearch(measurer, QWEN3_30B, H200, VARIANTS, options, notes).run(
        BATCH_SIZES, spaces().__getitem__, gpu_singles, rankings, confirm
    )
    return found, confirmed


GPU = SplitGPU(QWEN3_30B, 3, fixed_noise=True)
INPUTS = singles_and_rankings(GPU)


def test_the_landscape_makes_the_search_do_something():
    """A test of the fixture: some batch sizes stop at the bound, some climb and confirm."""
    found, _ = search(GPU.measure, SEQUENTIAL)
    stopped = [m for m, f in found.items() if f.stopped is not None]
    assert 0 < len(stopped) < len(found)
    assert all(f.lone_timings > 0 for f in found.values())
    _, confirmed = search(GPU.measure, PIPELINED)  # confirmations are prefetched when pipelined
    assert sorted(confirmed) == sorted(m for m in found if m not in stopped)


@pytest.mark.parametrize("options", [PIPELINED, SEQUENTIAL], ids=["pipelined", "sequential"])
def test_the_split_search_finds_the_same_in_turn_and_together_in_any_order(tmp_path, options):
    in_turn, _ = search(GPU.measure, options)
    sequential, _ = search(GPU.measure, SEQUENTIAL)
    assert in_turn == sequential  # the option changes the schedule only
    for seed in (0, 1, 2):
        measurer, backend = streamed(GPU, tmp_path / f"{seed}.jsonl", seed)
        together, _ = search(measurer, options)
        assert together == in_turn
        assert backend.most_warm_held <= backend.compile_workers
        if options.pipelined:
            assert measurer.widest == len(BATCH_SIZES)  # every batch size's seeds at once
        else:
            assert measurer.widest == 1  # one batch size after another, as before


def test_the_pipelined_search_times_nothing_the_sequential_one_does_not(tmp_path):
    """The prefetched seeds and confirmations are the chain's own questions."""
    keys = {}
    for options in (PIPELINED, SEQUENTIAL):
        measurer, backend = streamed(GPU, tmp_path / f"{options.pipelined}.jsonl")
        found, _ = search(measurer, options)
        for m, pair in found.items():  # the confirmations, as `split_search._confirm` asks them
            if pair.stopped is None:
                measurer.measure(m, [Probe.single(INPUTS[0][m]), pair.choice.pair()], "full")
        keys[options.pipelined] = [(m, c, mode) for mode, m, c in backend.log if mode != "warm"]
    assert sorted(map(repr, keys[True])) == sorted(map(repr, keys[False]))
    assert len(set(keys[True])) == len(keys[True])  # each measured once


def test_each_round_asks_every_variant_at_once():
    """The seeds of up, down and down-with-TMA go out as one ask, and so does each climb
    round's steps: a round waits for one answer, not one per variant. Only TMA's very first
    timing goes alone (a device without TMA says so once)."""
    asks = []

    def measure(batch_size, probes, fidelity):
        asks.append((batch_size, {(p.kind, p.use_tma) for p in probes}))
        return GPU.measure(batch_size, probes, fidelity)

    found, _ = search(measure, SEQUENTIAL)
    first = [variants for m, variants in asks if m == BATCH_SIZES[0]]
    assert first[:2] == [{("down", True)}, set(VARIANTS)]  # TMA's first alone, then the rest
    later = [variants for m, variants in asks if m != BATCH_SIZES[0]]
    assert later[0] == set(VARIANTS)  # the next batch size's seeds: every variant together
    climbed = [m for m, f in found.items() if f.stopped is None]
    assert climbed  # some batch sizes climb, and each of their rounds is one ask:
    for m in climbed:
        assert sum(1 for at, _ in asks if at == m) <= 1 + PIPELINED.max_climb_rounds + (
            m == BATCH_SIZES[0]
        )


def test_a_killed_pipelined_split_search_resumes_from_the_store_with_the_same_results(tmp_path):
    expected, _ = search(GPU.measure, PIPELINED)
    killed, _ = streamed(GPU, tmp_path / "m.jsonl", seed=5, stop_after=150)
    with pytest.raises(KeyboardInterrupt):
        search(killed, PIPELINED)
    stored = {(r.batch_size, r.probe, r.fidelity) for r in ResultStore(tmp_path / "m.jsonl").all()}
    assert stored
    again, rerun = streamed(GPU, tmp_path / "m.jsonl", seed=6)
    resumed, _ = search(again, PIPELINED)
    assert resumed == expected
    timed_again = {(m, c, mode) for mode, m, c in rerun.log if mode != "warm"}
    assert not timed_again & stored  # what the store held was served, not timed again
    assert again.reused == len(stored)


def test_an_unsupported_tma_is_tried_once_and_never_prefetched(tmp_path):
    class NoTMA(SplitGPU):
        def failure(self, probe, m=1):
            if isinstance(probe, Probe) and (probe.use_tma or probe.down_tma):
                return "unsupported"
            return super().failure(probe, m)

    gpu = NoTMA(QWEN3_30B, 3, fixed_noise=True)
    notes = []
    measurer, backend = streamed(gpu, tmp_path / "s.jsonl")
    found, _ = search(measurer, PIPELINED, notes)
    in_turn, _ = search(gpu.measure, SEQUENTIAL, [])
    assert found == in_turn
    tma = [c for mode, _, c in backend.log if c.use_tma]
    assert len(tma) <= 2  # the warm and the timing of the first one only
    assert any("down GEMM with TMA not searched" in note for note in notes)


def test_options_keep_pipelined_as_a_plain_switch():
    assert replace(PIPELINED, pipelined=False) == SEQUENTIAL
