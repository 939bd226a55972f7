"""bench/fleet.py on the CPU: which shipped files it takes, and its table, with a fake runner."""

import json

import fleet
import pytest

FILES = [
    "E=128,N=96,device_name=NVIDIA_H200.json",
    "E=64,N=320,device_name=NVIDIA_H200.json",
    "E=8,N=14336,device_name=NVIDIA_H200.json",
]


def test_shipped_files_are_the_h200_tables_in_name_order(tmp_path):
    for name in [*FILES, "E=8,N=14336,device_name=NVIDIA_H100.json", "E=1_down.json"]:
        (tmp_path / name).write_text("{}")
    (tmp_path / "E=256,N=256,device_name=NVIDIA_H200_down.json").write_text("{}")
    assert fleet.shipped_files(tmp_path) == sorted(FILES)


def test_a_file_is_explained_by_the_first_model_and_layout_that_names_it():
    names = {
        "a/first": [(FILES[0], 8, False, "auto", 2048), (FILES[0], 4, True, "auto", 2048)],
        "b/second": [(FILES[0], 1, False, "auto", 4096), (FILES[2], 1, False, "fp8_w8a8", 4096)],
    }
    targets = fleet.select(FILES, ["a/first", "b/second"], names_of=names.__getitem__)
    assert [t.file for t in targets] == FILES  # every file, in the given order
    first, missing, last = targets
    assert (first.model, first.tp, first.ep, first.dtype, first.hidden_size) == (
        "a/first", 8, False, None, 2048,
    )  # fmt: skip
    assert missing.model is None and "no catalog model" in missing.reason
    assert last.dtype == "fp8_w8a8" and last.layout == "TP1 fp8_w8a8"
    assert last.command("out", "cfg") == [
        "tune", "--model", "b/second", "--tp", "1", "--dtype", "fp8_w8a8",
        "--save-dir", "out", "--compare-dir", "cfg", "--json",
    ]  # fmt: skip
    with_engine = last.command("out", "cfg", ["--engine", "vllm"])
    assert with_engine[7:9] == ["--engine", "vllm"] and with_engine[-1] == "--json"


def test_a_catalog_models_layouts_name_the_files_vllm_ships():
    names = {}
    for name, tp, ep, dtype, k in fleet.layout_names("Qwen/Qwen3-30B-A3B"):
        names.setdefault(name, (tp, ep, dtype, k))  # the first layout naming it
    assert names["E=128,N=96,device_name=NVIDIA_H200.json"] == (8, False, "auto", 2048)
    assert names["E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"][:3] == (
        1,
        False,
        "fp8_w8a8",
    )


def summary(speedups, kept=()):
    """A tune's --json with the vLLM file's and fallback's confirmed speedups per M."""
    rows = []
    for m, (shipped, span) in speedups.items():
        rows.append(
            {
                "batch_size": m,
                "written": {"vllm": "vllm_file" if m in kept else "tuned"},
                "baselines": {
                    "vllm_fallback": {"speedup": shipped * 1.1, "speedup_interval": None},
                    "vllm_file": {"speedup": shipped, "speedup_interval": span},
                },
            }
        )
    return {"confirmation": {"rounds": 5}, "results": rows}


class FakeRunner:
    def __init__(self, outputs):
        self.outputs, self.calls = outputs, []

    def __call__(self, args):
        self.calls.append(list(args))
        return self.outputs[args[2]]


def test_the_run_writes_as_it_goes_resumes_and_says_where_it_stopped(tmp_path):
    targets = [
        fleet.Target(FILES[0], "m/one", 8, False, None, 2048),
        fleet.Target(FILES[1], reason="no catalog model's layout gives this shape"),
        fleet.Target(FILES[2], "m/two", 1, False, None, 4096),
        fleet.Target("E=9.json", "m/three", 2, True, None, 512),
    ]
    one = summary(
        {1: (1.0, [1.0, 1.0]), 64: (1.08, [1.05, 1.10]), 4096: (0.99, [0.97, 1.01])}, kept=(1,)
    )
    runner = FakeRunner(
        {
            "m/one": (0, json.dumps(one), ""),
            "m/two": (1, "", "Error: no GPU\n"),
            "m/three": (0, "{}", ""),
        }
    )
    ticks = iter(range(0, 1000, 10))  # every clock read is 10 s later
    stopped = fleet.run(
        targets, tmp_path / "cfg", tmp_path, budget_s=45, runner=runner,
        clock=lambda: next(ticks), say=lambda line: None,
    )  # fmt: skip
    # Two tunes ran (the unexplained file never does); the third would start past the budget.
    assert [call[2] for call in runner.calls] == ["m/one", "m/two"]
    assert stopped.startswith("Stopped at E=9.json (1 of 3 left)")
    entries = fleet.read_journal(tmp_path)
    assert [e["file"] for e in entries] == [FILES[0], FILES[2]]
    stats = entries[0]["stats"]
    assert stats["geomean_vs_shipped"] == pytest.approx((1.0 * 1.08 * 0.99) ** (1 / 3))
    assert stats["worst"] == {"M": 4096, "speedup": 0.99, "interval": [0.97, 1.01]}
    assert stats["slower_at"] == [4096] and stats["kept_shipped_at"] == [1]
    assert entries[1]["error"] == "exit 1: Error: no GPU"
    table = (tmp_path / fleet.TABLE).read_text()
    assert (
        f"| `{FILES[0]}` | m/one, TP8 | 1.023x | 4096 (0.990x [0.970-1.010]) | 4096 | 1 |" in table
    )
    assert f"| `{FILES[1]}` | - | no catalog model's layout gives this shape |" in table
    assert "| `E=9.json` | m/three, TP2 EP | not run |" in table
    assert table.rstrip().endswith(stopped)
    # A rerun skips what the journal holds and goes on from where it stopped.
    runner.calls.clear()
    assert (
        fleet.run(targets, tmp_path / "cfg", tmp_path, runner=runner, say=lambda line: None) is None
    )
    assert [call[2] for call in runner.calls] == ["m/three"]
    assert (
        "failed: 'results'" in (tmp_path / fleet.TABLE).read_text()
        or "failed" in (tmp_path / fleet.TABLE).read_text()
    )


def test_an_interrupt_ends_the_run_with_the_table_saying_where(tmp_path):
    targets = [
        fleet.Target(FILES[0], "m/one", 8, False, None, 2048),
        fleet.Target(FILES[2], "m/two", 1, False, None, 4096),
    ]
    one = summary({1: (1.02, [1.01, 1.03])})

    def runner(args):
        if args[2] == "m/two":
            raise KeyboardInterrupt
        return 0, json.dumps(one), ""

    stopped = fleet.run(targets, tmp_path / "cfg", tmp_path, runner=runner, say=lambda line: None)
    assert stopped == (
        f"Interrupted during {FILES[2]} (1 of 2 left); rerun the same command to go on."
    )
    assert [e["file"] for e in fleet.read_journal(tmp_path)] == [FILES[0]]
    assert (tmp_path / fleet.TABLE).read_text().rstrip().endswith(stopped)
