"""What a report shows, read from save dirs: one `ShapeReport` per tuned shape, and comparisons.

A save dir holds the results store (``measurements.jsonl``), the engine files
the tune wrote and, from tunes that keep it, ``summary.json``
(`moetune.tune.summary_file`). A shape is a (problem key, device, Triton
version) triple, the store's keys. Its report comes from ``summary.json`` when
the file has it; otherwise it is rebuilt from the store and the written files:

    tuned time   the store's full-fidelity timing of the config the file holds
                 (no file: the fastest full-fidelity timing, which the tune
                 would also have checked against the reference)
    fallbacks    vLLM's/SGLang's fallback configs, as this moetune ports them,
                 looked up in the store (the tune timed them in the same run)
    missing      the engine files the tune compared against, and the roofline
                 floor (its ceilings are measured on the GPU): neither is in a store

Shapes with the same problem key in several save dirs (or on several devices
or Triton versions in one store) are compared: tuned time per batch size,
relative to the first.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moetune.engines.formats import ENGINES
from moetune.errors import MoetuneError
from moetune.tune.store import STORE_FILENAME, Measurement, ResultStore
from moetune.tune.summary_file import SUMMARY_FILENAME, SummaryFileError, read_summary_file

FROM_SUMMARY = "summary.json"
# A problem key's engine-kernel tag (`TuneProblem.key`): the same shape timed on another kernel.
KERNEL_TAG = re.compile(r",kernel=([^,]+)$")
REBUILT = "rebuilt from the store and the written files"


class ReportError(MoetuneError):
    """A save dir that cannot be reported on (missing, not a save dir, nothing tuned)."""


@dataclass(frozen=True)
class BaselineInfo:
    """One engine baseline: its key (`moetune.tune.baselines.ORDER`), label and source."""

    key: str
    label: str
    source: str

    @property
    def engine(self) -> str:
        return self.key.split("_", 1)[0]

    def to_json(self) -> dict[str, str]:
        return {"key": self.key, "label": self.label, "source": self.source}


Span = tuple[float, float]  # (low, high) of a 95 % interval


@dataclass(frozen=True)
class Row:
    """One batch size: the written config, its time, each baseline's time, the floor.

    A tune with a confirmation round (`moetune.tune.confirm`) gives the times as the
    confirmation's medians with their intervals, and the speedup of what each engine's
    file holds (the tuned config, or the engine's own kept) with its interval.
    """

    batch_size: int
    config: dict[str, int] | None
    latency_us: float | None
    baseline_us: dict[str, float | None]
    floor_us: float | None = None
    latency_interval: Span | None = None
    baseline_intervals: dict[str, Span] = field(default_factory=dict)
    speedups: dict[str, float | None] = field(default_factory=dict)  # the summary's own
    speedup_intervals: dict[str, Span] = field(default_factory=dict)
    written: dict[str, str] = field(default_factory=dict)  # engine -> "tuned" or baseline key

    def speedup_over(self, key: str) -> float | None:
        """Baseline time over the written config's time (None: either not timed): the
        confirmation's where the summary has it, else baseline / tuned."""
        if key in self.speedups:
            return self.speedups[key]
        base = self.baseline_us.get(key)
        return None if not base or not self.latency_us else base / self.latency_us

    @property
    def roofline_fraction(self) -> float | None:
        """floor / tuned time, at most 1 (as the tune's summary shows it)."""
        if self.floor_us is None or not self.latency_us:
            return None
        return min(1.0, self.floor_us / self.latency_us)


def geomean(values: Sequence[float | None]) -> float | None:
    """Geometric mean of the values that are there (None: none is)."""
    present = [v for v in values if v]
    if not present:
        return None
    return math.exp(sum(math.log(v) for v in present) / len(present))


@dataclass
class ShapeReport:
    """One tuned shape of one save dir."""

    save_dir: Path
    name: str  # the save dir's short name on the page
    problem_key: str
    device_name: str
    triton_version: str
    origin: str  # FROM_SUMMARY or REBUILT
    engines: tuple[str, ...]  # engines whose files the tune wrote
    rows: list[Row]
    baselines: list[BaselineInfo]
    files: list[str] = field(default_factory=list)  # relative to the save dir
    floor: str | None = None  # what the floor is made of, one line
    missing: list[str] = field(default_factory=list)  # what a rebuilt report cannot show
    notes: list[str] = field(default_factory=list)  # the tune's notes
    measurements: dict[str, int] = field(default_factory=dict)  # the store's rows for the shape
    confirmation: dict[str, Any] | None = None  # rounds and interval method; None: search times

    @property
    def shape_key(self) -> str:
        """The problem key without the engine kernel it was timed on (``,kernel=...``)."""
        return KERNEL_TAG.sub("", self.problem_key)

    @property
    def kernel(self) -> str:
        """The kernel timed: the key's ``kernel=`` tag, else moetune's twin."""
        match = KERNEL_TAG.search(self.problem_key)
        return f"kernel {match.group(1)}" if match else "moetune kernel"

    @property
    def title(self) -> str:
        return f"{self.problem_key} on {self.device_name}, Triton {self.triton_version}"

    def geomean_speedup(self, key: str) -> float | None:
        return geomean([row.speedup_over(key) for row in self.rows])

    def baselines_of(self, engine: str | None) -> list[BaselineInfo]:
        """The baselines one engine's plot shows (None: all of them)."""
        return [b for b in self.baselines if engine is None or b.engine == engine]

    def plot_engines(self) -> list[str | None]:
        """One plot per engine the tune wrote a file for (None: one plot of everything)."""
        engines = [e for e in self.engines if self.baselines_of(e)]
        return list(engines) or [None]

    def to_json(self) -> dict[str, Any]:
        return {
            "save_dir": str(self.save_dir),
            "name": self.name,
            "problem": self.problem_key,
            "device_name": self.device_name,
            "triton_version": self.triton_version,
            "from": self.origin,
            "engines": list(self.engines),
            "baselines": [b.to_json() for b in self.baselines],
            "results": [
                {
                    "batch_size": row.batch_size,
                    "config": row.config,
                    "latency_us": row.latency_us,
                    "latency_interval_us": _span(row.latency_interval),
                    "written": row.written or None,
                    "baselines": {
                        b.key: {
                            "latency_us": row.baseline_us.get(b.key),
                            "latency_interval_us": _span(row.baseline_intervals.get(b.key)),
                            "speedup": row.speedup_over(b.key),
                            "speedup_interval": _span(row.speedup_intervals.get(b.key)),
                        }
                        for b in self.baselines
                    },
                    "floor_us": row.floor_us,
                    "roofline_fraction": row.roofline_fraction,
                }
                for row in self.rows
            ],
            "geomean_speedup": {b.key: self.geomean_speedup(b.key) for b in self.baselines},
            "confirmation": self.confirmation,
            "floor": self.floor,
            "files": self.files,
            "missing": self.missing,
            "notes": self.notes,
            "measurements": self.measurements,
        }


@dataclass
class Comparison:
    """One problem key in several shapes: tuned time per batch size, against the first."""

    problem_key: str
    members: list[ShapeReport]

    @property
    def reference(self) -> ShapeReport:
        return self.members[0]

    def labels(self) -> list[str]:
        """Each member's short name: its save dir's, with the device, Triton version or
        kernel added where that tells apart members that would read the same."""
        labels = [member.name for member in self.members]
        extras = (
            lambda m: m.device_name,
            lambda m: f"Triton {m.triton_version}",
            lambda m: m.kernel,
        )
        for extra in extras:
            pairs = list(zip(labels, self.members, strict=True))
            alike = {label: [m for n, m in pairs if n == label] for label in labels}
            labels = [
                f"{label}, {extra(member)}" if len({extra(m) for m in alike[label]}) > 1 else label
                for label, member in zip(labels, self.members, strict=True)
            ]
        return labels

    def batch_sizes(self) -> list[int]:
        return sorted({row.batch_size for member in self.members for row in member.rows})

    @staticmethod
    def latency(member: ShapeReport, batch_size: int) -> float | None:
        return next((r.latency_us for r in member.rows if r.batch_size == batch_size), None)

    def ratio(self, member: ShapeReport, batch_size: int) -> float | None:
        """member's tuned time / the reference's (below 1: the member is faster)."""
        mine = self.latency(member, batch_size)
        ref = self.latency(self.reference, batch_size)
        return None if not mine or not ref else mine / ref

    def geomean_ratio(self, member: ShapeReport) -> float | None:
        return geomean([self.ratio(member, m) for m in self.batch_sizes()])

    def to_json(self) -> dict[str, Any]:
        return {
            "problem": self.problem_key,
            "members": [
                {
                    "label": label,
                    "save_dir": str(member.save_dir),
                    "device_name": member.device_name,
                    "triton_version": member.triton_version,
                }
                for label, member in zip(self.labels(), self.members, strict=True)
            ],
            "rows": [
                {
                    "batch_size": m,
                    "latency_us": [self.latency(member, m) for member in self.members],
                    "ratio": [self.ratio(member, m) for member in self.members],
                }
                for m in self.batch_sizes()
            ],
            "geomean_ratio": [self.geomean_ratio(member) for member in self.members],
        }


@dataclass
class Report:
    """Every shape of the save dirs given, in order, and their comparisons."""

    save_dirs: list[Path]
    shapes: list[ShapeReport]
    comparisons: list[Comparison]
    diagnostics: list[str]  # problems met while reading (a torn store line, a bad summary)

    def to_json(self) -> dict[str, Any]:
        from moetune import __version__

        return {
            "moetune_version": __version__,
            "save_dirs": [str(path) for path in self.save_dirs],
            "shapes": [shape.to_json() for shape in self.shapes],
            "comparisons": [comparison.to_json() for comparison in self.comparisons],
            "diagnostics": self.diagnostics,
        }


def load_report(paths: Sequence[str | Path]) -> Report:
    """Read every save dir (`ReportError` for one that is not a save dir) and compare them."""
    given = [save_dir_of(Path(path)) for path in paths]
    # A folder given twice (under any spelling) is read once.
    seen: dict[Path, Path] = {}
    for path in given:
        seen.setdefault(path.resolve(), path)
    dirs = list(seen.values())
    names = short_names(dirs)
    shapes: list[ShapeReport] = []
    diagnostics: list[str] = []
    for path, name in zip(dirs, names, strict=True):
        shapes += load_save_dir(path, name, diagnostics)
    return Report(dirs, shapes, compare(shapes), diagnostics)


def compare(shapes: Sequence[ShapeReport]) -> list[Comparison]:
    """A comparison for each shape (problem key less the kernel timed) that two or more
    shapes share, in first-seen order."""
    groups: dict[str, list[ShapeReport]] = {}
    for shape in shapes:
        groups.setdefault(shape.shape_key, []).append(shape)
    return [Comparison(key, members) for key, members in groups.items() if len(members) > 1]


def save_dir_of(path: Path) -> Path:
    """The save dir `path` names (a store file given stands for its folder); one-line errors."""
    if path.is_file() and path.name == STORE_FILENAME:
        path = path.parent
    if not path.exists():
        raise ReportError(f"{path}: no such folder")
    if not path.is_dir():
        raise ReportError(
            f"{path} is not a folder: give the folder `moetune tune --save-dir` wrote"
        )
    if not (path / STORE_FILENAME).is_file() and not (path / SUMMARY_FILENAME).is_file():
        raise ReportError(
            f"{path} is not a moetune save dir: it has no {STORE_FILENAME} "
            f"(the results store `moetune tune --save-dir` writes)"
        )
    return path


def short_names(dirs: Sequence[Path]) -> list[str]:
    """Each save dir's folder name, or its path where two names are the same."""
    names = [path.name or str(path) for path in dirs]
    return [
        name if names.count(name) == 1 else str(path)
        for name, path in zip(names, dirs, strict=True)
    ]


def load_save_dir(path: Path, name: str, diagnostics: list[str]) -> list[ShapeReport]:
    """Every shape of one save dir: from summary.json, else rebuilt (module docstring)."""
    store = _load_store(path, diagnostics)
    unreadable = ""
    try:
        entries = read_summary_file(path)
    except SummaryFileError as exc:
        diagnostics.append(f"{exc}; rebuilding from the store")
        unreadable, entries = f" ({exc})", []
    shapes = []
    for index, entry in enumerate(entries, start=1):
        problem = summary_entry_problem(entry)
        if problem is None:
            shapes.append(_from_summary(path, name, entry, store))
        else:
            where = f"{path / SUMMARY_FILENAME}: shape {index}"
            diagnostics.append(f"{where}: {problem}; rebuilding it from the store")
    done = {(s.problem_key, s.device_name, s.triton_version) for s in shapes}
    keys = dict.fromkeys(
        (m.problem_key, m.device_name, m.triton_version)
        for m in (store.all() if store else [])
        if m.kind == "whole"
    )
    for key in keys:
        if key not in done:
            shape = _rebuilt(path, name, key, store)
            if shape is not None:
                shapes.append(shape)
    if not shapes:
        raise ReportError(
            f"{path}: the results store holds no finished timing to report{unreadable}"
        )
    return shapes


def _load_store(path: Path, diagnostics: list[str]) -> ResultStore | None:
    if not (path / STORE_FILENAME).is_file():
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            store = ResultStore(path / STORE_FILENAME)
        except OSError as exc:
            raise ReportError(f"cannot read {path / STORE_FILENAME}: {exc}") from None
    diagnostics.extend(str(w.message) for w in caught)
    return store


def _counts(store: ResultStore | None, key: tuple[str, str, str]) -> dict[str, int]:
    """How many rows the store holds for the shape: timings per fidelity, failures, split probes."""
    counts = {"quick": 0, "full": 0, "failed": 0, "split": 0}
    for m in store.all() if store else []:
        if (m.problem_key, m.device_name, m.triton_version) != key:
            continue
        if m.kind != "whole":
            counts["split"] += 1
        elif m.status != "ok":
            counts["failed"] += 1
        else:
            counts[m.fidelity] += 1
    return counts


def _text(value: Any) -> bool:
    """A string that can be printed: valid Unicode (JSON's escapes can write a lone surrogate)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _number(value: Any) -> bool:
    """A finite number >= 0 (a time, a bandwidth); not a boolean."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _texts(value: Any) -> bool:
    return isinstance(value, list) and all(_text(item) for item in value)


def _shown(value: Any) -> str:
    return ascii(value) if len(ascii(value)) <= 60 else ascii(value)[:57] + "..."


def _problem(checks: list[tuple[str, Any, Any, str]]) -> str | None:
    """The first failing (field, value, test, expected) as one line, or None."""
    for field_name, value, test, expected in checks:
        if not test(value):
            return f"{field_name} is {_shown(value)}, expected {expected}"
    return None


def _optional(test: Any) -> Any:
    return lambda value: value is None or test(value)


def _config(value: Any) -> bool:
    return isinstance(value, dict) and all(
        _text(key) and isinstance(item, int) and not isinstance(item, bool)
        for key, item in value.items()
    )


def _baseline_times(value: Any) -> bool:
    return isinstance(value, dict) and all(
        _text(key)
        and (
            item is None or (isinstance(item, dict) and _optional(_number)(item.get("latency_us")))
        )
        for key, item in value.items()
    )


def summary_entry_problem(entry: Any) -> str | None:
    """What makes one summary.json entry unreadable to the report, in one line (None: it
    is readable). Only the fields the report reads are checked; others are left alone."""
    if not isinstance(entry, dict) or not isinstance(entry.get("plan"), dict):
        return "no plan"
    plan = entry["plan"]
    checks = [(f"plan.{key}", plan.get(key), _text, "a string") for key in _PLAN_KEYS]
    checks += [
        ("results", entry.get("results", []), lambda v: isinstance(v, list), "a list"),
        ("baselines", entry.get("baselines", []), lambda v: isinstance(v, list), "a list"),
        ("files", entry.get("files", []), _texts, "a list of strings"),
        ("engines", entry.get("engines"), _optional(_texts), "a list of strings"),
        ("notes", entry.get("notes", []), _texts, "a list of strings"),
        ("ceilings", entry.get("ceilings"), _optional(_ceilings), "the GPU's measured ceilings"),
    ]
    problem = _problem(checks)
    if problem is not None:
        return problem
    for number, baseline in enumerate(entry.get("baselines", []), start=1):
        fields = [(f"baselines[{number}]", baseline, lambda v: isinstance(v, dict), "an object")]
        if isinstance(baseline, dict):
            fields += [
                (f"baselines[{number}].{key}", baseline.get(key), _text, "a string")
                for key in ("key", "label", "source")
            ]
        problem = _problem(fields)
        if problem is not None:
            return problem
    for number, result in enumerate(entry.get("results", []), start=1):
        where = f"results[{number}]"
        if not isinstance(result, dict):
            return f"{where} is {_shown(result)}, expected an object"
        problem = _problem(
            [
                (f"{where}.batch_size", result.get("batch_size"), _batch_size, "an integer >= 1"),
                (f"{where}.config", result.get("config"), _optional(_config), "a config"),
                (
                    f"{where}.latency_us",
                    result.get("latency_us"),
                    _optional(_number),
                    "a number >= 0 or null",
                ),
                (
                    f"{where}.baselines",
                    result.get("baselines"),
                    _optional(_baseline_times),
                    "an object of baseline times",
                ),
                (f"{where}.floor_us", result.get("floor_us"), _optional(_number), "a number >= 0"),
            ]
        )
        if problem is not None:
            return problem
    return None


_PLAN_KEYS = ("problem", "device_name", "triton_version")


def _batch_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _ceilings(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and _number(value.get("read_bandwidth_tb_s"))
        and _number(value.get("peak_tflops"))
        and _text(value.get("bandwidth_source"))
        and _text(value.get("peak_source"))
    )


def _floor_line(ceilings: dict[str, Any] | None) -> str | None:
    if not ceilings:
        return None
    return (
        f"floor = max(bytes / {ceilings['read_bandwidth_tb_s']:.2f} TB/s read "
        f"({ceilings['bandwidth_source']}), flops / {ceilings['peak_tflops']:.0f} TFLOP/s "
        f"({ceilings['peak_source']}))"
    )


def _span(span: Span | None) -> list[float] | None:
    return None if span is None else [span[0], span[1]]


def _read_span(value: Any) -> Span | None:
    """A summary's ``[low, high]``, or None where it has none (or not two numbers)."""
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    ):
        return (float(value[0]), float(value[1]))
    return None


def _confirmed_fields(result: dict[str, Any]) -> dict[str, Any]:
    """The confirmation's fields of one summary row (`moetune.tune.runner.summary_json`):
    intervals, the written file's speedups, what each engine's file holds. A summary
    written before the confirmation round has none of them."""
    if not result.get("confirmation"):
        return {}
    baselines = {k: v or {} for k, v in (result.get("baselines") or {}).items()}
    intervals = {k: _read_span(v.get("latency_interval_us")) for k, v in baselines.items()}
    speedups = {k: _read_span(v.get("speedup_interval")) for k, v in baselines.items()}
    return {
        "latency_interval": _read_span(result.get("latency_interval_us")),
        "baseline_intervals": {k: v for k, v in intervals.items() if v is not None},
        "speedups": {k: v.get("speedup") for k, v in baselines.items()},
        "speedup_intervals": {k: v for k, v in speedups.items() if v is not None},
        "written": {str(k): str(v) for k, v in (result.get("written") or {}).items()},
    }


def _from_summary(
    path: Path, name: str, entry: dict[str, Any], store: ResultStore | None
) -> ShapeReport:
    plan = entry["plan"]
    key = (plan["problem"], plan["device_name"], plan["triton_version"])
    baselines = [
        BaselineInfo(b["key"], b["label"], b["source"]) for b in entry.get("baselines", [])
    ]
    rows = [
        Row(
            batch_size=int(result["batch_size"]),
            config=result.get("config"),
            latency_us=result.get("latency_us"),
            baseline_us={
                k: (v or {}).get("latency_us") for k, v in (result.get("baselines") or {}).items()
            },
            floor_us=result.get("floor_us"),
            **_confirmed_fields(result),
        )
        for result in entry.get("results", [])
    ]
    files = [str(f) for f in entry.get("files", [])]
    missing = [
        f"the written file {f} is no longer in the save dir"
        for f in files
        if not (path / f).is_file()
    ]
    if store is None:
        missing.append(f"no {STORE_FILENAME}: the measurement counts are unknown")
    return ShapeReport(
        save_dir=path,
        name=name,
        problem_key=key[0],
        device_name=key[1],
        triton_version=key[2],
        origin=FROM_SUMMARY,
        engines=tuple(entry.get("engines") or _engines_of(files)),
        rows=rows,
        baselines=baselines,
        files=files,
        floor=_floor_line(entry.get("ceilings")),
        missing=missing,
        notes=[str(note) for note in entry.get("notes", [])],
        measurements=_counts(store, key) if store else {},
        confirmation=entry.get("confirmation") or None,
    )


def _engines_of(files: Sequence[str]) -> list[str]:
    """Engines of written files by their place: SGLang's live under configs/triton_X_Y_Z/."""
    engines = {"sglang" if Path(f).parts[0] == "configs" else "vllm" for f in files}
    return [e for e in ENGINES if e in engines]


def _rebuilt(
    path: Path, name: str, key: tuple[str, str, str], store: ResultStore
) -> ShapeReport | None:
    """A shape's report from the store and the files (module docstring); None: nothing timed."""
    from moetune.tune.problem import TuneProblem

    problem_key, device, triton = key
    missing: list[str] = []
    try:
        problem = TuneProblem.from_key(problem_key)
    except MoetuneError:
        problem = None
        missing.append(f"the store's key {problem_key!r} is not one this moetune reads back")
    full = _best_full(store, key)
    tables = _written_tables(path, problem, device, triton) if problem else {}
    engines = tuple(tables)
    table = tables.get("vllm") or tables.get("sglang")
    rows_config: dict[int, dict[str, int] | None] = {}
    latency: dict[int, float | None] = {}
    if table is not None:
        untimed = []
        for m, config in sorted(table.items()):
            rows_config[m], latency[m] = config, _time_of(store, key, m, config)
            if latency[m] is None and m in full:
                untimed.append(str(m))
                rows_config[m], latency[m] = full[m].candidate.as_config(), full[m].latency_us
        if untimed:
            missing.append(
                f"the written config at M={', '.join(untimed)}: no whole-call timing of it in "
                "the store (an SGLang up/down pair, or a file from another tune); shown: the "
                "fastest full-fidelity timing"
            )
    else:
        for m, best in sorted(full.items()):
            rows_config[m], latency[m] = best.candidate.as_config(), best.latency_us
        if rows_config:
            missing.append(
                "no engine file of this shape in the save dir: the tuned time is the fastest "
                "full-fidelity timing in the store"
            )
    if not rows_config:
        return None
    baselines, baseline_us = _fallbacks(store, key, problem, engines, list(rows_config), missing)
    missing.append(
        "the engine files the tune compared with (vLLM file, SGLang file): "
        f"kept in {SUMMARY_FILENAME} only"
    )
    missing.append(
        f"the roofline floor: its ceilings are measured on the GPU, kept in {SUMMARY_FILENAME} only"
    )
    rows = [
        Row(m, rows_config[m], latency[m], baseline_us.get(m, {}), None)
        for m in sorted(rows_config)
    ]
    return ShapeReport(
        save_dir=path,
        name=name,
        problem_key=problem_key,
        device_name=device,
        triton_version=triton,
        origin=REBUILT,
        engines=engines,
        rows=rows,
        baselines=baselines,
        files=[f for e in engines for f in _file_names(path, problem, device, triton, e)],
        missing=missing,
        measurements=_counts(store, key),
    )


def _best_full(store: ResultStore, key: tuple[str, str, str]) -> dict[int, Measurement]:
    """The fastest ok full-fidelity whole-call timing of each batch size (latest per config)."""
    latest: dict[tuple[int, Any], Measurement] = {}
    for m in store.all():
        if (m.problem_key, m.device_name, m.triton_version) == key and m.kind == "whole":
            if m.fidelity == "full":
                latest[(m.batch_size, m.candidate)] = m
    best: dict[int, Measurement] = {}
    for (batch_size, _), m in latest.items():
        if m.ok and (batch_size not in best or m.latency_us < best[batch_size].latency_us):
            best[batch_size] = m
    return best


def _time_of(
    store: ResultStore, key: tuple[str, str, str], batch_size: int, config: Any
) -> float | None:
    """The store's ok full-fidelity time of `config` at `batch_size`, or None."""
    from moetune.kernel.config import Candidate

    try:
        candidate = Candidate.from_config(config)
    except (MoetuneError, TypeError):
        return None
    problem_key, device, triton = key
    found = store.get(problem_key, batch_size, candidate, "full", device, triton)
    return found.latency_us if found is not None and found.ok else None


def _file_names(path: Path, problem: Any, device: str, triton: str, engine: str) -> list[str]:
    """`engine`'s files for the shape that are in the save dir, relative to it."""
    from moetune.tune.output import engine_file_paths

    try:
        paths = engine_file_paths(engine, problem, device, triton, path)
    except MoetuneError:
        return []
    return [str(p.relative_to(path)) for p in paths if p.is_file()]


def _written_tables(
    path: Path, problem: Any, device: str, triton: str
) -> dict[str, dict[int, dict[str, Any]]]:
    """{engine: {batch size: config}} of the engine files of the shape found in the save dir."""
    from moetune.engines.lookup import load_table
    from moetune.tune.output import engine_file_path

    tables = {}
    for engine in ENGINES:
        try:
            file = engine_file_path(engine, problem, device, triton, path)
        except MoetuneError:
            continue
        if file.is_file():
            try:
                tables[engine] = load_table(file)
            except MoetuneError:
                continue
    return tables


def _fallbacks(
    store: ResultStore,
    key: tuple[str, str, str],
    problem: Any,
    engines: tuple[str, ...],
    batch_sizes: list[int],
    missing: list[str],
) -> tuple[list[BaselineInfo], dict[int, dict[str, float | None]]]:
    """The engines' fallback configs (as this moetune ports them) and their stored times.

    A fallback the store never timed (an engine the tune did not write for) is left out;
    batch sizes where a kept one has no timing are added to `missing`.
    """
    if problem is None:
        return [], {}
    from moetune.tune.baselines import engine_baselines

    asked = engines or ENGINES
    found = engine_baselines(
        problem,
        batch_sizes,
        asked,
        key[1],
        key[2],
        env={},
        vllm_package=None,
        sglang_package=None,
    )
    baselines: list[BaselineInfo] = []
    times: dict[int, dict[str, float | None]] = {m: {} for m in batch_sizes}
    for baseline in found:
        column = {
            m: None
            if baseline.configs.get(m) is None
            else _time_of(store, key, m, baseline.configs[m].as_config())
            for m in batch_sizes
        }
        if any(v is not None for v in column.values()):
            source = f"{baseline.source} (as this moetune ports it)"
            baselines.append(BaselineInfo(baseline.key, baseline.label, source))
            for m, value in column.items():
                times[m][baseline.key] = value
            untimed = [str(m) for m, value in column.items() if value is None]
            if untimed:
                missing.append(
                    f"the {baseline.label} at M={', '.join(untimed)}: the store has no "
                    "full-fidelity timing of its config (the tune may have used an older port)"
                )
    return baselines, times
