"""A fleet evaluation nobody chose: every H200 file vLLM ships that a catalog model's layout
explains, tuned with the default command and confirmed against the shipped file.

Selection (no GPU, `select`): every ``*device_name=NVIDIA_H200*.json`` in the configs folder
of a vLLM release (``--configs``: an installed or fetched vLLM's
``vllm/model_executor/layers/fused_moe/configs``; ``_down`` tables are companions, not
targets), sorted by name. A file is *explained* by the first catalog model
(`moetune.extract.sources.catalog_models`, sorted) and the first layout of `LAYOUTS` (TP
1, 2, 4, 8; plain, then vLLM EP; the checkpoint's dtype, then bf16, fp8 w8a8, int8 w8a16)
whose rank's vLLM file name (`moetune.tune.output.engine_file_path`: E and N from the
layout, dtype and block shape from the kernel) is that file's name; K comes from the model.
A file no layout explains is listed with that reason, never dropped silently.

Run (the H200, `run`): in that order, each explained file is tuned with the default
command (``moetune tune --model M --tp T [--ep] [--dtype D] --json``), ``--compare-dir``
the configs folder so the file vLLM would load is the shipped one. The tune's confirmation
round (`moetune.tune.confirm`) times the written config, the shipped file and vLLM's
fallback interleaved in the same run; its medians and intervals make the table:

    file | model, layout | geomean over the shipped file | worst M (its speedup
    [interval]) | M where slower | M kept the shipped config | geomean over the fallback
    | tune wall s

Each finished file is appended to ``<out>/fleet.jsonl`` at once and the table
(``<out>/fleet.md``) rewritten, atomically: a rerun skips the files already there
(resumable), and ``--budget-s`` stops before a file that would start past the budget,
saying which file it stopped at.

    python bench/fleet.py --configs DIR --out OUT [--budget-s S] [--dry-run]
    python bench/fleet.py --configs DIR --out OUT --table   # the table of what is done
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEVICE = "NVIDIA H200"
DEVICE_TAG = "device_name=NVIDIA_H200"
TPS = (1, 2, 4, 8)
DTYPES = ("auto", "bf16", "fp8_w8a8", "int8_w8a16")
JOURNAL = "fleet.jsonl"
TABLE = "fleet.md"


@dataclass(frozen=True)
class Target:
    """One shipped file and the catalog layout that explains it (None: none does)."""

    file: str
    model: str | None = None
    tp: int | None = None
    ep: bool = False
    dtype: str | None = None  # the --dtype asked (None: the checkpoint's, no flag)
    hidden_size: int | None = None  # K, from the model
    reason: str | None = None  # why no layout explains it

    @property
    def layout(self) -> str:
        if self.model is None:
            return "-"
        return (
            f"TP{self.tp}" + (" EP" if self.ep else "") + (f" {self.dtype}" if self.dtype else "")
        )

    def command(self, save_dir: Path, configs: Path, extra: Sequence[str] = ()) -> list[str]:
        """The default tune of this layout (plus `extra`), into `save_dir`, against the
        shipped files."""
        args = ["tune", "--model", str(self.model), "--tp", str(self.tp)]
        args += ["--ep"] if self.ep else []
        args += ["--dtype", self.dtype] if self.dtype else []
        args += list(extra)
        return [*args, "--save-dir", str(save_dir), "--compare-dir", str(configs), "--json"]


def shipped_files(configs: Path) -> list[str]:
    """The H200 files of a vLLM configs folder, sorted by name; ``_down`` tables left out."""
    return sorted(
        path.name
        for path in configs.glob("*.json")
        if DEVICE_TAG in path.name and not path.name.endswith("_down.json")
    )


def layouts() -> list[tuple[int, bool, str]]:
    """(tp, ep, dtype) in the order a file's explanation is searched."""
    return [(tp, ep, dtype) for tp in TPS for ep in (False, True) for dtype in DTYPES]


def layout_names(model: str) -> list[tuple[str, int, bool, str, int]]:
    """(vLLM file name, tp, ep, dtype, K) of every layout of `model` that shards and tunes,
    in `layouts` order; a layout the model refuses is left out."""
    from moetune.errors import MoetuneError
    from moetune.extract.layouts import Layout, resolve_layouts
    from moetune.tune.api import engine_file_path, problem_of

    found = []
    for tp, ep, dtype in layouts():
        try:
            resolved = resolve_layouts(model, [Layout(tp, ep, None, dtype)])
        except MoetuneError:
            continue
        for shard in resolved.shards:
            if shard.kernel_dtype.tune_refusal():
                continue
            try:
                problem = problem_of(shard)
            except MoetuneError:
                continue
            name = engine_file_path("vllm", problem, DEVICE, "0", ".").name
            found.append((name, tp, ep, dtype, problem.hidden_size))
    return found


def select(
    files: Sequence[str],
    models: Sequence[str],
    names_of: Callable[[str], list[tuple[str, int, bool, str, int]]] = layout_names,
) -> list[Target]:
    """Each file with the first (model, layout) whose rank's vLLM file has its name."""
    explained: dict[str, Target] = {}
    for model in models:
        for name, tp, ep, dtype, k in names_of(model):
            if name in files and name not in explained:
                flag = None if dtype == "auto" else dtype
                explained[name] = Target(name, model, tp, ep, flag, k)
    return [
        explained.get(name, Target(name, reason="no catalog model's layout gives this shape"))
        for name in files
    ]


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------


def file_stats(summary: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """The table's numbers from one tune's ``--json`` summary (one shape)."""
    shapes = summary.get("shapes", [summary])  # one plan per kernel timed: take vLLM's
    shape = next(
        (
            s
            for s in shapes
            if "vllm_fallback" in (s["results"][0]["baselines"] if s["results"] else {})
        ),
        shapes[0],
    )
    rows = shape["results"]
    shipped = [(r["batch_size"], r["baselines"].get("vllm_file") or {}) for r in rows]
    fallback = [(r["batch_size"], r["baselines"].get("vllm_fallback") or {}) for r in rows]
    speedups = [
        (m, b["speedup"], b.get("speedup_interval")) for m, b in shipped if b.get("speedup")
    ]
    worst = min(speedups, key=lambda item: item[1]) if speedups else None
    return {
        "geomean_vs_shipped": _geomean([s for _, s, _ in speedups]),
        "geomean_vs_fallback": _geomean([b["speedup"] for _, b in fallback if b.get("speedup")]),
        "worst": None
        if worst is None
        else {"M": worst[0], "speedup": worst[1], "interval": worst[2]},
        "slower_at": [m for m, s, _ in speedups if s < 1.0],
        "kept_shipped_at": [
            r["batch_size"] for r in rows if (r.get("written") or {}).get("vllm") == "vllm_file"
        ],
        "confirmed": bool(shape.get("confirmation")),
        "tune_wall_s": round(wall_s, 1),
    }


def _geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def table_lines(
    entries: Sequence[dict[str, Any]], targets: Sequence[Target], stopped: str | None
) -> list[str]:
    """The Markdown table: a row per target in order (done, failed, not explained, not run)."""
    done = {entry["file"]: entry for entry in entries}
    lines = [
        "| file | model, layout | geomean over the shipped file | worst M (speedup [interval]) "
        "| M where slower | M that kept the shipped config | geomean over the fallback | tune wall s |",
        "|---|---|---:|---|---|---|---:|---:|",
    ]
    for target in targets:
        where = f"{target.model}, {target.layout}" if target.model else "-"
        entry = done.get(target.file)
        if target.model is None:
            cells = [target.reason or "not explained", "", "", "", "", ""]
        elif entry is None:
            cells = ["not run", "", "", "", "", ""]
        elif entry.get("error"):
            cells = [f"failed: {entry['error']}", "", "", "", "", _wall(entry)]
        else:
            stats = entry["stats"]
            worst = stats["worst"]
            if worst is None:
                worst_text = "-"
            else:
                span = worst["interval"]
                bounds = "" if not span else f" [{span[0]:.3f}-{span[1]:.3f}]"
                worst_text = f"{worst['M']} ({worst['speedup']:.3f}x{bounds})"
            cells = [
                _x(stats["geomean_vs_shipped"]),
                worst_text,
                ", ".join(map(str, stats["slower_at"])) or "none",
                ", ".join(map(str, stats["kept_shipped_at"])) or "none",
                _x(stats["geomean_vs_fallback"]),
                f"{stats['tune_wall_s']:.0f}",
            ]
        lines.append(f"| `{target.file}` | {where} | " + " | ".join(cells) + " |")
    explained = sum(1 for t in targets if t.model)
    finished = sum(1 for t in targets if t.file in done)
    lines += [
        "",
        f"{len(targets)} H200 files, {explained} explained by a catalog layout, {finished} run.",
    ]
    if stopped:
        lines.append(stopped)
    return lines


def _wall(entry: dict[str, Any]) -> str:
    return f"{entry.get('wall_s', 0):.0f}"


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def read_journal(out: Path) -> list[dict[str, Any]]:
    path = out / JOURNAL
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a kill: that file runs again
    return entries


def _append(out: Path, entry: dict[str, Any]) -> None:
    with open(out / JOURNAL, "a") as handle:
        handle.write(json.dumps(entry) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _write_table(out: Path, lines: Sequence[str]) -> None:
    from moetune.fileio import atomic_write_text

    atomic_write_text(out / TABLE, "\n".join(lines) + "\n")


def run_moetune(args: Sequence[str]) -> tuple[int, str, str]:
    """``python -m moetune ARGS`` from the repository root: (exit code, stdout, stderr)."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "moetune", *args], capture_output=True, text=True, cwd=root
    )
    return done.returncode, done.stdout, done.stderr


def run(
    targets: Sequence[Target],
    configs: Path,
    out: Path,
    *,
    budget_s: float | None = None,
    extra: Sequence[str] = (),
    save_root: Path | None = None,
    runner: Callable[[Sequence[str]], tuple[int, str, str]] = run_moetune,
    clock: Callable[[], float] = time.monotonic,
    say: Callable[[str], None] = print,
) -> str | None:
    """Tune each explained target not in the journal yet, in order; returns where it stopped
    (None: every target is done)."""
    out.mkdir(parents=True, exist_ok=True)
    entries = read_journal(out)
    done = {entry["file"] for entry in entries}
    started = clock()
    stopped = None
    todo = [t for t in targets if t.model is not None and t.file not in done]
    for index, target in enumerate(todo):
        if budget_s is not None and clock() - started >= budget_s:
            stopped = (
                f"Stopped at {target.file} ({len(todo) - index} of {len(todo)} left): the "
                f"budget of {budget_s:.0f} s was spent; rerun the same command to go on."
            )
            break
        save_dir = (save_root or out / "tunes") / target.file.removesuffix(".json")
        args = target.command(save_dir, configs, extra)
        say(f"[{index + 1}/{len(todo)}] moetune {shlex.join(args)}")
        begun = clock()
        try:
            code, stdout, stderr = runner(args)
        except KeyboardInterrupt:  # Ctrl-C, or `timeout --signal=INT`: the table says where
            stopped = (
                f"Interrupted during {target.file} ({len(todo) - index} of {len(todo)} left); "
                "rerun the same command to go on."
            )
            break
        wall_s = clock() - begun
        entry: dict[str, Any] = {
            "file": target.file,
            "command": ["moetune", *args],
            "wall_s": wall_s,
        }
        try:
            if code != 0:
                raise ValueError(f"exit {code}: {(stderr.strip().splitlines() or [''])[-1]}")
            entry["stats"] = file_stats(json.loads(stdout), wall_s)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            entry["error"] = str(exc)[:300]
        _append(out, entry)
        entries.append(entry)
        _write_table(out, table_lines(entries, targets, None))
    _write_table(out, table_lines(entries, targets, stopped))
    return stopped


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs", type=Path, required=True, help="vLLM's fused_moe/configs folder"
    )
    parser.add_argument("--out", type=Path, required=True, help="journal, table and save dirs")
    parser.add_argument("--budget-s", type=float, default=None, help="start no file after this")
    parser.add_argument(
        "--tune-args",
        default="",
        help="added to every tune (e.g. '--engine vllm'; default: none, the default command)",
    )
    parser.add_argument(
        "--save-root",
        type=Path,
        default=None,
        help="where each tune's save dir goes (default: OUT/tunes); the journal and table stay in OUT",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the selection and stop")
    parser.add_argument("--table", action="store_true", help="print the table of the journal")
    options = parser.parse_args(argv)
    if not options.configs.is_dir():
        print(f"error: {options.configs} is not a folder", file=sys.stderr)
        return 1
    from moetune.extract.sources import catalog_models

    targets = select(shipped_files(options.configs), catalog_models())
    if options.dry_run:
        for target in targets:
            command = (
                shlex.join(target.command(options.out / "tunes" / "X", options.configs))
                if target.model
                else target.reason
            )
            print(
                f"{target.file}: {target.model or '-'} {target.layout if target.model else ''} -> {command}"
            )
        return 0
    if options.table:
        print("\n".join(table_lines(read_journal(options.out), targets, None)))
        return 0
    extra = shlex.split(options.tune_args)
    stopped = run(
        targets,
        options.configs,
        options.out,
        budget_s=options.budget_s,
        extra=extra,
        save_root=options.save_root,
    )
    print(stopped or f"Done: every explained file is in {options.out / TABLE}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
