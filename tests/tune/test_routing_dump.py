"""Real-routing dumps: both formats, one-line errors, windows, and the load the timings replay."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from moetune.cli import cli
from moetune.errors import TuneError
from moetune.kernel.config import Candidate
from moetune.kernel.probe import Probe
from moetune.tune.measure.routing_dump import (
    expert_histogram,
    load_routing,
    sglang_dump_files,
    window,
    with_routing,
)
from moetune.tune.problem import TuneProblem

E, TOP_K = 8, 2


def write_sglang_dir(folder, segments):
    """SGLang's --topk-ids-dir layout: topk_ids_layer{L}_idx{I}.pt, layers 3.. (dense first)."""
    folder.mkdir()
    names = []
    for i, segment in enumerate(segments):
        layer, idx = 3 + i % 2, i // 2
        name = f"topk_ids_layer{layer}_idx{idx}.pt"
        torch.save(torch.from_numpy(segment), folder / name)
        names.append(name)
    return names


def test_sglang_folder_loads_in_sglangs_sample_order(tmp_path):
    segments = [np.full((5, TOP_K), i, dtype=np.int32) + [[0, 1]] for i in range(4)]
    names = write_sglang_dir(tmp_path / "dump", segments)
    (tmp_path / "dump" / "notes.txt").write_text("ignored")
    files = sglang_dump_files(tmp_path / "dump")
    # Every layer of snapshot 0, then of snapshot 1 (SGLang: i -> layer i % L, idx i // L).
    assert [f.name for f in files] == names
    dump = load_routing(tmp_path / "dump", E, TOP_K)
    assert [int(s[0, 0]) for s in dump.segments] == [0, 1, 2, 3]
    # Window j of M tokens: the first M rows of sample j, as SGLang's tuner takes them.
    assert window(dump, 3, 2).tolist() == [[2, 3]] * 3
    # Past the last sample, the next M rows of each sample (wrapping at its end).
    assert window(dump, 3, 4)[:, 0].tolist() == [0, 0, 0]


@pytest.mark.parametrize("suffix", [".pt", ".npy"])
def test_a_plain_tensor_file_walks_through_its_rows(tmp_path, suffix):
    ids = np.stack([np.arange(10) % E, (np.arange(10) + 1) % E], axis=1).astype(np.int64)
    path = tmp_path / f"ids{suffix}"
    if suffix == ".pt":
        torch.save(torch.from_numpy(ids), path)
    else:
        np.save(path, ids)
    dump = load_routing(path, E, TOP_K)
    assert dump.tokens == 10 and dump.segments[0].dtype == np.int32
    assert window(dump, 4, 0)[:, 0].tolist() == [0, 1, 2, 3]
    assert window(dump, 4, 1)[:, 0].tolist() == [4, 5, 6, 7]
    assert window(dump, 4, 2)[:, 0].tolist() == [0, 1, 0, 1]  # rows 8, 9, then wraps
    # The digest names the content: the same ids in the other format name the same dump.
    other = tmp_path / "other.npy"
    np.save(other, ids)
    assert load_routing(other, E, TOP_K).digest == dump.digest


def bad(tmp_path, name, value):
    path = tmp_path / name
    if name.endswith(".npy"):
        np.save(path, value)
    elif isinstance(value, bytes):
        path.write_bytes(value)
    else:
        torch.save(value, path)
    return path


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("k3.npy", np.zeros((4, 3), dtype=np.int32), "top-k is 3 in the dump but 2 in the model"),
        ("big.npy", np.array([[0, 8]], dtype=np.int32), "expert id 8 is outside 0..7 (E=8"),
        ("neg.npy", np.array([[0, -1]], dtype=np.int32), "expert id -1 is outside 0..7"),
        (
            "flat.npy",
            np.zeros(4, dtype=np.int32),
            "expected a [tokens, top_k] tensor, got shape [4]",
        ),
        ("float.npy", np.zeros((4, 2), dtype=np.float32), "expert ids must be integers"),
        ("empty.npy", np.zeros((0, 2), dtype=np.int32), "the dump holds no tokens"),
        ("list.pt", [torch.zeros(2, 2, dtype=torch.int32)], "got list"),
        ("torn.pt", b"not a pickle", "cannot read it as a routing dump"),
        ("ids.txt", b"0 1", "a routing dump is a .pt or .npy file"),
    ],
)
def test_bad_dumps_are_one_line_errors(tmp_path, name, value, message):
    path = bad(tmp_path, name, value)
    with pytest.raises(TuneError) as info:
        load_routing(path, E, TOP_K)
    text = str(info.value)
    assert text.startswith(str(path)) and message in text and "\n" not in text


def test_missing_paths_and_folders_without_dumps(tmp_path):
    with pytest.raises(TuneError, match="no such routing dump"):
        load_routing(tmp_path / "nope", E, TOP_K)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TuneError, match=r"no topk_ids_layer<L>_idx<I>\.pt files"):
        load_routing(tmp_path / "empty", E, TOP_K)


def test_cli_rejects_a_bad_dump_in_one_line_and_plans_a_good_one(tmp_path):
    model = Path(__file__).parent / "data" / "tiny-moe"  # E=4, top-k 2
    args = ["tune", "--model", str(model), "--save-dir", str(tmp_path / "out"), "--dry-run"]
    args += ["--device-name", "NVIDIA H200"]
    path = bad(tmp_path, "big.npy", np.array([[0, 4]], dtype=np.int32))
    result = subprocess.run(
        [sys.executable, "-m", "moetune", *args, "--routing", str(path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: {path}: expert id 4 is outside 0..3")
    assert result.stderr.count("\n") == 1
    good = tmp_path / "good.npy"
    np.save(good, np.array([[0, 1], [2, 3]], dtype=np.int32))
    result = CliRunner().invoke(cli, [*args, "--routing", str(good)])
    assert result.exit_code == 0, result.output
    assert f"Routing:     {good}" in result.output
    assert ",routing=" in result.output  # the store key names the dump


# The load the timings replay: a skewed dump's hot expert shows up in the alignment.

PROBLEM = TuneProblem(E, 32, 64, TOP_K, "bf16")
BATCH = 16


def skewed_dump(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(200):
        other = rng.choice(np.arange(1, E))
        rows.append([0, other] if rng.random() < 0.7 else rng.choice(np.arange(1, E), 2, False))
    path = tmp_path / "skewed.npy"
    np.save(path, np.array(rows, dtype=np.int32))
    return path


def tokens_per_expert(slot, block_m, num_slots):
    """Slots the alignment gave each expert: real (non-pad) entries of each expert's blocks."""
    sorted_ids, expert_ids = slot["sorted_token_ids"], slot["expert_ids"]
    used = int(slot["num_tokens_post_padded"][0])
    counts = np.zeros(E, dtype=np.int64)
    for block in range(used // block_m):
        chunk = sorted_ids[block * block_m : (block + 1) * block_m]
        counts[int(expert_ids[block])] += int((chunk < num_slots).sum())
    return counts


def test_the_windows_of_a_skewed_dump_carry_its_skew(tmp_path):
    problem = with_routing(PROBLEM, skewed_dump(tmp_path))
    dump = load_routing(problem.routing, E, TOP_K)
    counts = expert_histogram([window(dump, BATCH, j) for j in range(8)], E)
    assert counts.argmax() == 0 and counts[0] > 0.3 * counts.sum()  # uniform: 1/8 of slots


def test_the_timed_gemm_replays_the_dumps_expert_load(tmp_path):
    from moetune.kernel.problem import make_problem
    from moetune.tune.measure.probe_timing import _Bench, measure_probe

    problem = with_routing(PROBLEM, skewed_dump(tmp_path))
    dump = load_routing(problem.routing, E, TOP_K)
    data = make_problem(BATCH, E, 32, 64, TOP_K, "bf16", device="cpu")
    probe = Probe("up", Candidate(16, 32, 32, 1, 4, 2))
    bench = _Bench(probe, problem, BATCH, data)
    bench.allocate(2)
    for j, slot in enumerate(bench.slots):
        expected = expert_histogram([window(dump, BATCH, j)], E)
        assert (tokens_per_expert(slot, 16, BATCH * TOP_K) == expected).all()
        assert expected.argmax() == 0
    bench.refill()  # the next replay reads the next windows, like uniform routing redraws
    assert (bench.slots[0]["ids"].numpy() == window(dump, BATCH, 2)).all()
    # Uniform routing: no expert takes a third of the slots.
    uniform = _Bench(probe, PROBLEM, BATCH, data)
    uniform.allocate(2)
    assert expert_histogram(uniform.seen_ids, E).max() < 0.3 * BATCH * TOP_K * 2

    outcome = measure_probe(problem, BATCH, "quick", probe, data)
    assert outcome.status == "ok" and outcome.latency_us > 0
    whole = measure_probe(problem, BATCH, "quick", Candidate(16, 32, 32, 1, 4, 2), data)
    assert whole.status == "ok"
