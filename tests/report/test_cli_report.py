"""`moetune report` end to end: save dirs from the real runner (fake GPU) and recorded H200 runs.

The page is read back with the stdlib's html.parser; its numbers are checked
against the results store and summary.json, not against the report's own code.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner
from savedirs import EXAMPLES, PNG_MAGIC, PROBLEM, Page, body_rows, tune_into

from moetune.cli import cli, main
from moetune.kernel.config import Candidate
from moetune.tune.output import engine_file_path
from moetune.tune.store import STORE_FILENAME, ResultStore
from moetune.tune.summary_file import SUMMARY_FILENAME, read_summary_file

TINY = PROBLEM.key()
QWEN3_30B = "E=128,N=768,K=2048,topk=8,dtype=bf16"


def run(capsys, *args):
    """Run the CLI as `moetune` does (exit codes included); return (code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main([*map(str, args)])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def report(*args):
    result = CliRunner().invoke(cli, ["report", *map(str, args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def read_page(folder) -> Page:
    return Page((folder / "index.html").read_text())


def stored_us(save_dir, batch_size, config, device="NVIDIA H200", triton="3.6.0", problem=TINY):
    """The store's full-fidelity time of `config` at `batch_size`, read straight from the file."""
    latest = None
    for line in (save_dir / STORE_FILENAME).read_text().splitlines():
        row = json.loads(line)
        if (
            row["problem_key"] == problem
            and row["batch_size"] == batch_size
            and row["candidate"] == config
            and row["fidelity"] == "full"
            and row["device_name"] == device
            and row["triton_version"] == triton
            and row.get("kind", "whole") == "whole"
        ):
            latest = row["latency_us"]
    return latest


def test_a_finished_tune_keeps_its_summary_for_the_report(tuned):
    [entry] = read_summary_file(tuned)
    assert entry["plan"]["problem"] == PROBLEM.key()
    assert [b["key"] for b in entry["baselines"]] == [
        "vllm_fallback",
        "sglang_fallback",
        "vllm_file",
        "sglang_file",
    ]
    assert all(row["floor_us"] for row in entry["results"])


def test_page_tables_hold_the_stores_numbers(tuned):
    result = report(tuned)
    assert result.exit_code == 0, result.output
    out = tuned / "report"
    assert result.output.rstrip().endswith(f"Wrote {out / 'index.html'} and 4 plots beside it.")
    page = read_page(out)
    [table] = page.tables_of("speedup")
    rows = body_rows(table)
    [entry] = read_summary_file(tuned)
    written = json.loads(
        engine_file_path("vllm", PROBLEM, "NVIDIA H200", "3.6.0", tuned).read_text()
    )
    assert [int(r["batch_size"]["text"]) for r in rows] == [1, 16, 256]
    for row, kept in zip(rows, entry["results"], strict=True):
        m = kept["batch_size"]
        tuned_us = stored_us(tuned, m, written[str(m)])
        assert float(row["latency_us"]["data-value"]) == tuned_us
        assert row["latency_us"]["text"] == f"{tuned_us:.1f}"
        for key, base in kept["baselines"].items():
            base_us = stored_us(tuned, m, base["config"])
            assert base_us is not None and float(row[f"{key}_us"]["data-value"]) == base_us
            speedup = float(row[f"{key}_speedup"]["data-value"])
            assert speedup == pytest.approx(base_us / tuned_us)
            # ... and its 95 % interval: the fake GPU's rounds move every config alike.
            assert row[f"{key}_speedup"]["text"].startswith(f"{base_us / tuned_us:.2f}x [")
        assert float(row["floor_us"]["data-value"]) == kept["floor_us"]
        fraction = min(1.0, kept["floor_us"] / tuned_us)
        assert row["roofline_fraction"]["text"] == f"{100 * fraction:.0f} %"
    # The terminal shows the same table.
    first = next(line for line in result.output.splitlines() if line.strip().startswith("1 "))
    assert f"{stored_us(tuned, 1, written['1']):.1f}" in first


def test_one_png_per_engine_written_and_embedded(tuned):
    assert report(tuned).exit_code == 0
    out = tuned / "report"
    pngs = sorted(out.glob("*.png"))
    names = [p.name for p in pngs]
    assert [n.rsplit("-", 1)[1] for n in names if "speedup" not in n] == ["sglang.png", "vllm.png"]
    # A speedup-against-M plot per engine beside each time plot.
    assert sorted(n for n in names if n.endswith("-speedup.png")) == sorted(
        n.replace(".png", "-speedup.png") for n in names if "speedup" not in n
    )
    page = read_page(out)
    embedded = [base64.b64decode(src.split(",", 1)[1]) for src in page.images]
    for png in pngs:
        data = png.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
        assert data in embedded  # the page stands alone
        assert png.name in page.links
    assert all(src.startswith("data:image/png;base64,") for src in page.images)


def test_two_save_dirs_are_compared_with_a_ratio_table(tmp_path, clean_engine_env):
    fast, slow = tmp_path / "h200", tmp_path / "h100"
    tune_into(fast, engines=("vllm",))
    tune_into(slow, engines=("vllm",), device="NVIDIA H100 80GB HBM3", triton="3.5.0", scale=1.5)
    out = tmp_path / "compare"
    result = report(fast, slow, "--output", out)
    assert result.exit_code == 0, result.output
    page = read_page(out)
    assert len(page.tables_of("speedup")) == 2
    [ratio] = page.tables_of("ratio")
    header = [cell["text"] for cell in ratio[1][0]]
    assert header == ["M", "h200 us", "h100 us", "h100 / h200"]
    written = {
        d: json.loads(engine_file_path("vllm", PROBLEM, dev, tv, d).read_text())
        for d, dev, tv in ((fast, "NVIDIA H200", "3.6.0"), (slow, "NVIDIA H100 80GB HBM3", "3.5.0"))
    }
    *rows, geomean = body_rows(ratio)
    ratios = []
    for row in rows:
        m = int(row["batch_size"]["text"])
        a = stored_us(fast, m, written[fast][str(m)])
        b = stored_us(slow, m, written[slow][str(m)], "NVIDIA H100 80GB HBM3", "3.5.0")
        assert float(row["latency_us_0"]["data-value"]) == a
        assert float(row["latency_us_1"]["data-value"]) == b
        assert float(row["ratio_1"]["data-value"]) == pytest.approx(b / a)
        ratios.append(b / a)
    assert float(geomean["ratio_1"]["data-value"]) == pytest.approx(
        (ratios[0] * ratios[1] * ratios[2]) ** (1 / 3)
    )
    assert (out / "index.html").is_file() and len(list(out.glob("compare-1-*.png"))) == 1
    assert "Compare E=4,N=32,K=64,topk=2,dtype=bf16" in result.output
    assert "Geomean ratio: h100 1.50x." in result.output  # the fake H100 is 1.5x slower


def test_a_save_dir_given_twice_is_one_shape_not_a_comparison(tuned, monkeypatch):
    monkeypatch.chdir(tuned.parent)
    result = CliRunner().invoke(cli, ["report", str(tuned), f"./{tuned.name}/", "--json"])
    document = json.loads(result.stdout)
    assert document["save_dirs"] == [str(tuned)]
    assert len(document["shapes"]) == 1 and document["comparisons"] == []


def test_json_holds_the_same_numbers_and_writes_nothing(tuned):
    result = CliRunner().invoke(cli, ["report", str(tuned), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert not (tuned / "report").exists()
    [shape] = document["shapes"]
    [entry] = read_summary_file(tuned)
    assert shape["from"] == "summary.json" and shape["device_name"] == "NVIDIA H200"
    assert shape["engines"] == ["vllm", "sglang"]
    for row, kept in zip(shape["results"], entry["results"], strict=True):
        assert row["latency_us"] == kept["latency_us"]
        assert row["floor_us"] == kept["floor_us"]
        for key, base in kept["baselines"].items():
            assert row["baselines"][key]["latency_us"] == base["latency_us"]
            assert row["baselines"][key]["speedup"] == pytest.approx(base["speedup"])
    assert shape["geomean_speedup"]["vllm_fallback"] == pytest.approx(
        entry["geomean_speedup"]["vllm_fallback"]
    )
    # With --output the page is written too, and the JSON says where.
    out = tuned / "elsewhere"
    result = CliRunner().invoke(cli, ["report", str(tuned), "--json", "--output", str(out)])
    document = json.loads(result.stdout)
    assert document["output"]["page"] == str(out / "index.html")
    assert sorted(document["output"]["plots"]) == sorted(str(p) for p in out.glob("*.png"))


def test_an_older_save_dir_is_rebuilt_from_store_and_files_saying_what_is_missing(tuned):
    (tuned / SUMMARY_FILENAME).unlink()
    result = CliRunner().invoke(cli, ["report", str(tuned), "--json"])
    assert result.exit_code == 0, result.output
    [shape] = json.loads(result.stdout)["shapes"]
    assert shape["from"] == "rebuilt from the store and the written files"
    assert [b["key"] for b in shape["baselines"]] == ["vllm_fallback", "sglang_fallback"]
    store = ResultStore(tuned / STORE_FILENAME)
    written = json.loads(
        engine_file_path("vllm", PROBLEM, "NVIDIA H200", "3.6.0", tuned).read_text()
    )
    for row in shape["results"]:
        m = row["batch_size"]
        assert row["config"] == written[str(m)]
        assert row["latency_us"] == stored_us(tuned, m, written[str(m)])
        assert row["floor_us"] is None
        for key in ("vllm_fallback", "sglang_fallback"):
            assert row["baselines"][key]["latency_us"] is not None
    fallback = store.get(
        PROBLEM.key(), 16, Candidate(16, 64, 128, 1, 4, 3), "full", "NVIDIA H200", "3.6.0"
    )
    if fallback is not None:  # vLLM's fallback at M=16 for this shape, where timed
        [row] = [r for r in shape["results"] if r["batch_size"] == 16]
        assert row["baselines"]["vllm_fallback"]["latency_us"] == fallback.latency_us
    missing = " ".join(shape["missing"])
    assert "the engine files the tune compared with" in missing and "roofline floor" in missing
    text = report(tuned).output
    assert "Rebuilt from" in text and "Missing: the roofline floor" in text


def test_a_written_config_the_store_never_timed_whole_shows_the_fastest_timing(tuned):
    """An SGLang-only save dir whose up table holds a config with no whole-call timing
    (an up/down pair): the row shows the fastest full-fidelity timing, and says so."""
    (tuned / SUMMARY_FILENAME).unlink()
    engine_file_path("vllm", PROBLEM, "NVIDIA H200", "3.6.0", tuned).unlink()
    sglang = engine_file_path("sglang", PROBLEM, "NVIDIA H200", "3.6.0", tuned)
    table = json.loads(sglang.read_text())
    never_timed = Candidate(64, 64, 64, 16, 8, 5).as_config()
    table["16"] = never_timed
    sglang.write_text(json.dumps(table))
    result = CliRunner().invoke(cli, ["report", str(tuned), "--json"])
    [shape] = json.loads(result.stdout)["shapes"]
    assert shape["engines"] == ["sglang"]
    rows = {row["batch_size"]: row for row in shape["results"]}
    fastest = min(
        m.latency_us
        for m in ResultStore(tuned / STORE_FILENAME).all()
        if m.batch_size == 16 and m.fidelity == "full" and m.kind == "whole" and m.ok
    )
    assert rows[16]["latency_us"] == fastest and rows[16]["config"] != never_timed
    assert rows[1]["config"] == table["1"]
    assert any(line.startswith("the written config at M=16:") for line in shape["missing"])


def test_the_recorded_h200_runs_report_and_compare(recorded):
    newer, older = recorded
    result = report(newer, older)
    assert result.exit_code == 0, result.output
    page = read_page(newer / "report")
    first, second = page.tables_of("speedup")
    summary = json.loads((newer / SUMMARY_FILENAME).read_text())["shapes"][0]
    for row, kept in zip(body_rows(first), summary["results"], strict=True):
        assert float(row["latency_us"]["data-value"]) == kept["latency_us"]
        assert float(row["latency_us"]["data-value"]) == stored_us(
            newer, kept["batch_size"], kept["config"], problem=QWEN3_30B
        )
    assert body_rows(first)[0]["latency_us"]["text"] == "31.1"  # M=1, as the H200 run printed
    # The older run kept no summary: rebuilt from its store and the files it wrote.
    written = json.loads((older / "E=128,N=768,device_name=NVIDIA_H200.json").read_text())
    for row in body_rows(second):
        m = int(row["batch_size"]["text"])
        expected = stored_us(older, m, written[str(m)], problem=QWEN3_30B)
        assert expected is not None and float(row["latency_us"]["data-value"]) == expected
    [ratio] = page.tables_of("ratio")
    assert len(body_rows(ratio)) == 19  # 18 batch sizes and the geomean


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: tmp / "nowhere", "nowhere: no such folder"),
        (lambda tmp: tmp, "is not a moetune save dir: it has no measurements.jsonl"),
        (lambda tmp: _file(tmp / "notes.txt"), "notes.txt is not a folder"),
        (lambda tmp: _empty_store(tmp), "the results store holds no finished timing to report"),
    ],
)
def test_not_a_save_dir_is_one_line_and_exit_1(capsys, tmp_path, make, message):
    path = make(tmp_path)
    code, out, err = run(capsys, "report", path)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and err.startswith("Error: ") and message in err
    assert not (tmp_path / "report").exists()


def _file(path):
    path.write_text("hello")
    return path


def _empty_store(tmp):
    (tmp / STORE_FILENAME).write_text("")
    return tmp


def test_a_bad_save_dir_among_good_ones_writes_nothing(capsys, tuned, tmp_path):
    code, _, err = run(capsys, "report", tuned, tmp_path / "typo")
    assert code == 1 and err == f"Error: {tmp_path / 'typo'}: no such folder\n"
    assert not (tuned / "report").exists()


def test_no_save_dir_is_a_usage_error():
    result = CliRunner().invoke(cli, ["report"])
    assert result.exit_code == 2 and "Missing argument 'SAVE_DIR...'" in result.output


def test_without_matplotlib_the_tables_and_json_still_come(tuned, monkeypatch):
    from moetune.report import plots

    monkeypatch.setattr(plots, "available", lambda: False)
    result = CliRunner().invoke(cli, ["report", str(tuned)])
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        "Note: no plots: matplotlib is not installed (pip install matplotlib, or in the "
        'moetune checkout: pip install -e ".[report]")\n'
    )
    out = tuned / "report"
    assert not list(out.glob("*.png"))
    page = read_page(out)
    assert page.images == [] and len(page.tables_of("speedup")) == 1
    assert result.stdout.rstrip().endswith(f"Wrote {out / 'index.html'}.")
    result = CliRunner().invoke(cli, ["report", str(tuned), "--json"])
    assert json.loads(result.stdout)["shapes"][0]["results"]


def test_a_failing_plot_still_writes_the_tables(tuned, monkeypatch):
    from moetune.report import plots

    def broken(*args):
        raise RuntimeError("no usable font\nsecond line")

    monkeypatch.setattr(plots, "shape_plot", broken)
    result = CliRunner().invoke(cli, ["report", str(tuned)])
    assert result.exit_code == 0, result.output
    assert result.stderr == ("Note: no plots: matplotlib failed (RuntimeError: no usable font)\n")
    page = read_page(tuned / "report")
    assert page.images == [] and len(page.tables_of("speedup")) == 1


def test_a_torn_store_line_is_a_note_on_stderr(tuned):
    with open(tuned / STORE_FILENAME, "a") as store:
        store.write('{"problem_key": "E=4')
    result = CliRunner().invoke(cli, ["report", str(tuned), "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["diagnostics"]
    assert result.stderr.startswith("Note: ") and "torn last line" in result.stderr


def test_help_teaches_with_examples():
    result = CliRunner().invoke(cli, ["report", "--help"])
    assert result.exit_code == 0
    assert "Example usage:" in result.output
    assert "moetune report tuned-h200 tuned-h100 --output h200-vs-h100" in result.output


PROBE = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from moetune.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(["report", sys.argv[1], "--json"])
        except SystemExit as exc:
            code = exc.code
    heavy = ("torch", "triton", "matplotlib", "numpy", "transformers")
    loaded = [name for name in heavy if name in sys.modules]
    print(json.dumps({"code": code, "loaded": loaded, "report": json.loads(out.getvalue())}))
    """
)


def test_report_json_imports_neither_torch_triton_nor_matplotlib(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(EXAMPLES / "h200-2026-12-01")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(EXAMPLES.parent)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    assert probe["code"] == 0 and probe["loaded"] == []
    assert probe["report"]["shapes"][0]["results"][0]["latency_us"] == pytest.approx(
        31.096, abs=1e-3
    )


def test_json_carries_the_confirmations_intervals(tuned):
    from savedirs import CLOCK_STEP

    result = CliRunner().invoke(cli, ["report", str(tuned), "--json"])
    assert result.exit_code == 0, result.output
    [shape] = json.loads(result.stdout)["shapes"]
    assert shape["confirmation"]["rounds"] == 5
    assert "paired bootstrap" in shape["confirmation"]["interval"]
    for row in shape["results"]:
        low, high = row["latency_interval_us"]
        # Five rounds at 1 - 2s .. 1 + 2s of the speed: the median's interval lies inside.
        assert row["latency_us"] * (1 - 2 * CLOCK_STEP) <= low < row["latency_us"]
        assert row["latency_us"] < high <= row["latency_us"] * (1 + 2 * CLOCK_STEP) + 1e-9
        assert set(row["written"]) == {"vllm", "sglang"}
        for base in row["baselines"].values():
            low, high = base["speedup_interval"]
            # Paired rounds: the clock moves both alike and cancels in the ratio.
            assert low == pytest.approx(base["speedup"]) and high == pytest.approx(base["speedup"])
            assert base["latency_interval_us"][0] < base["latency_us"]


def test_the_page_says_where_its_times_come_from(tuned):
    assert report(tuned).exit_code == 0
    text = (tuned / "report" / "index.html").read_text()
    assert "medians of 5 interleaved confirmation rounds" in text
