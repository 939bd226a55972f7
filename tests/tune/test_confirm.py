"""The confirmation's statistics and decision rule, on recorded H200 timings.

The timings are `moetune benchmark`'s two runs of 2026-12-04 (Qwen3-235B-A22B TP8,
bench/results/2026-12-04-paired-climb/h200/call2/bench-{vllm,sglang}-{1,2}.json): each
run timed every config at a batch size back to back, so run i is round i.
"""

from __future__ import annotations

import pytest

from moetune.tune.confirm import (
    TUNED,
    Confirmation,
    Interval,
    decide,
    median_interval,
    ratio_interval,
    round_orders,
    written_speedup,
)

# batch size -> name -> (run 1, run 2) in us; "tuned" is the fast search's file.
RECORDED = {
    "vllm": {
        128: {
            "vllm_fallback": (181.65, 181.63),
            "vllm_file": (173.54, 173.97),
            TUNED: (170.12, 170.82),
        },
        3072: {
            "vllm_fallback": (480.34, 481.03),
            "vllm_file": (486.66, 482.1),
            TUNED: (480.34, 481.03),
        },
    },
    "sglang": {
        # The shipped file's time moved 2.6 % between the runs: the tuned config won one
        # run and lost the other, though its median over both is 1.1 % lower.
        4096: {
            "sglang_fallback": (809.62, 813.56),
            "sglang_file": (595.78, 611.24),
            TUNED: (599.93, 594.1),
        },
        1: {
            "sglang_fallback": (41.33, 37.45),
            "sglang_file": (31.95, 28.24),
            TUNED: (25.75, 23.38),
        },
    },
}


def recorded(engine: str, m: int) -> Confirmation:
    return Confirmation(m, RECORDED[engine][m])


def test_round_orders_rotate_and_drop_duplicates() -> None:
    assert round_orders(["a", "b", "a", "c"], 4) == [
        ("a", "b", "c"),
        ("b", "c", "a"),
        ("c", "a", "b"),
        ("a", "b", "c"),
    ]
    assert round_orders([], 3) == []


def test_a_noisy_winner_does_not_replace_the_engines_file() -> None:
    confirmation = recorded("sglang", 4096)
    ratio = confirmation.ratio("sglang_file", TUNED)
    assert ratio.value > 1.01  # one timing, or the medians alone, would pick the tuned config
    assert ratio.low < 1.0 < ratio.high
    (decision,) = decide(confirmation, ["sglang"])
    assert decision.written == "sglang_file" and decision.kept_engine_config
    # What SGLang's file then holds at this M is its own config: no speedup claimed over it.
    assert written_speedup(confirmation, [decision], "sglang_file") == Interval(1.0, 1.0, 1.0)


def test_a_gain_in_every_round_is_written() -> None:
    confirmation = recorded("vllm", 128)
    (decision,) = decide(confirmation, ["vllm"])
    assert decision.written == TUNED and decision.against == "vllm_file"
    assert decision.ratio.low > 1.0
    speedup = written_speedup(confirmation, [decision], "vllm_fallback")
    assert speedup.value == pytest.approx((181.64) / (170.47), rel=1e-4)


def test_the_file_decides_over_the_fallback() -> None:
    # The tuned config is vLLM's fallback here; vLLM would load its file, which is slower.
    (decision,) = decide(recorded("vllm", 3072), ["vllm"])
    assert decision.against == "vllm_file" and decision.written == TUNED


def test_without_a_file_the_fallback_decides() -> None:
    rounds = dict(RECORDED["sglang"][1])
    del rounds["sglang_file"]
    (decision,) = decide(Confirmation(1, rounds), ["sglang"])
    assert decision.against == "sglang_fallback" and decision.written == TUNED


def test_a_tuned_config_that_failed_is_never_written() -> None:
    rounds = dict(RECORDED["vllm"][128]) | {TUNED: (None, None)}
    (decision,) = decide(Confirmation(128, rounds), ["vllm"])
    assert decision.written == "vllm_file"


def test_an_engine_config_that_failed_leaves_the_tuned_one() -> None:
    rounds = {"vllm_fallback": (None, None), TUNED: (30.0, 31.0)}
    (decision,) = decide(Confirmation(1, rounds), ["vllm"])
    assert decision.written == TUNED and decision.against is None


def test_the_same_config_is_no_gain_and_no_loss() -> None:
    rounds = {"vllm_file": (10.0, 11.0), TUNED: (10.0, 11.0)}
    confirmation = Confirmation(1, rounds, {"vllm_file": "cfg", TUNED: "cfg"})
    (decision,) = decide(confirmation, ["vllm"])
    assert decision.written == TUNED
    assert confirmation.ratio("vllm_file", TUNED) == Interval(1.0, 1.0, 1.0)


def test_the_interval_is_seeded_and_holds_the_estimate() -> None:
    base = [100.0, 101.0, 99.5, 100.2, 100.8]
    tuned = [97.0, 98.2, 96.9, 99.0, 97.5]
    first = ratio_interval(base, tuned, seed=7)
    assert first == ratio_interval(base, tuned, seed=7)
    assert first.low <= first.value <= first.high
    assert first.low > 1.0
    median = median_interval(base, seed=7)
    assert median.value == 100.2 and median.low >= 99.5 and median.high <= 101.0


def test_pairing_cancels_a_drift_shared_by_a_round() -> None:
    # Each round's clock moves both configs alike; tuned is 2 % faster in every round.
    drift = [1.00, 1.06, 0.95, 1.10, 0.98, 1.04, 0.93]
    base = [100.0 * d for d in drift]
    tuned = [98.0 * d for d in drift]
    paired = ratio_interval(base, tuned, seed=1)
    assert paired.low == pytest.approx(100 / 98) and paired.high == pytest.approx(100 / 98)


def test_one_round_has_no_spread() -> None:
    assert ratio_interval([10.0], [9.0], seed=0) == Interval(10 / 9, 10 / 9, 10 / 9)
    with pytest.raises(ValueError):
        ratio_interval([1.0, 2.0], [1.0], seed=0)


def test_json_carries_the_rounds_and_medians() -> None:
    data = recorded("vllm", 128).to_json()
    assert data["rounds"] == 2
    assert data["timings_us"][TUNED] == [170.12, 170.82]
    assert data["median_us"][TUNED]["value"] == pytest.approx(170.47)


def test_finalists_are_the_runners_up_within_the_spread():
    from moetune.tune.confirm import finalists

    ranking = [("a", 10.0), ("b", 10.1), ("c", 10.19), ("d", 10.21), ("e", 10.0)]
    assert finalists(ranking, "a") == ["b", "c"]  # at most two besides the pick
    assert finalists([("a", 10.0), ("d", 10.3)], "a") == []
    # A pick that is not the fastest: those above it failed the check, and stay out.
    assert finalists([("x", 9.0), ("a", 10.0), ("b", 10.1)], "a") == ["b"]
    assert finalists([("a", 10.0)], "zz") == []


def test_the_finalist_with_the_lowest_median_is_the_tuned_config():
    from moetune.tune.confirm import choose_finalist

    confirmation = Confirmation(
        2,
        {
            TUNED: (10.0, 10.3, 10.1),
            "finalist 2": (9.8, 9.9, 10.2),
            "vllm_file": (11.0, 11.0, 11.0),
        },
        {TUNED: "pick", "finalist 2": "runner-up", "vllm_file": "file"},
    )
    chosen = choose_finalist(confirmation)
    assert chosen.configs[TUNED] == "runner-up" and chosen.configs["finalist 1"] == "pick"
    assert chosen.timings_us[TUNED] == (9.8, 9.9, 10.2)
    assert chosen.timings_us["vllm_file"] == (11.0, 11.0, 11.0)
    # The pick stays where it is the fastest, and where a tie leaves it level.
    assert choose_finalist(chosen).configs[TUNED] == "runner-up"
    tie = Confirmation(1, {TUNED: (5.0,), "finalist 2": (5.0,)}, {TUNED: "p", "finalist 2": "q"})
    assert choose_finalist(tie) is tie
