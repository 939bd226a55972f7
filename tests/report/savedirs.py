"""Save dirs to report on (tuned through the real runner on an instant fake GPU), and a page reader."""

from __future__ import annotations

from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from moetune.device import DeviceLimits
from moetune.kernel.config import Candidate
from moetune.roofline import Ceilings
from moetune.tune.confirm import round_of
from moetune.tune.measure.timing import Outcome
from moetune.tune.problem import TuneProblem
from moetune.tune.runner import TuneRequest, make_plan, run_tune
from moetune.tune.search.space import load_space

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "tune" / "data"
EXAMPLES = ROOT / "examples"
PROBLEM = TuneProblem(4, 32, 64, 2, "bf16")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The file a user had before tuning (a --compare-dir): one row, so every M uses it.
EXISTING = Candidate(16, 32, 64, 1, 4, 3)
# The confirmation's five rounds (`moetune.tune.confirm.DEFAULT_ROUNDS`) on the fake GPU: round
# r runs at 1 + CLOCK_STEP * (r - 2) of its speed, every config alike.
CLOCK_STEP = 0.002


def fake_us(batch_size: int, candidate, scale: float) -> float:
    """A deterministic time for a config: larger tiles cost more at small M, less at large M."""
    tile = candidate.BLOCK_SIZE_M * candidate.BLOCK_SIZE_N * candidate.BLOCK_SIZE_K
    per_token = 0.02 * (1 + 4096 / tile)
    return scale * (8.0 + tile / 20000 + per_token * batch_size + 0.1 * candidate.num_stages)


@dataclass
class FakeGPU:
    """A `moetune.tune.measure.measurer.Backend` that answers at once: every config runs, times by
    `fake_us` (`scale`: a slower GPU), and matches the reference."""

    scale: float = 1.0
    compile_workers: int = 0
    parallelism: int = 1

    def run(self, units, then=None):
        for unit in units:
            for candidate in unit.candidates:
                if unit.mode == "verify":
                    yield unit, Outcome(candidate, "ok", rel_rms=0.001)
                else:
                    us = fake_us(unit.batch_size, candidate, self.scale)
                    if unit.mode == "confirm":  # each round's clock: +-0.4 %, the median exact
                        us *= 1 + CLOCK_STEP * (round_of(unit.seed, unit.batch_size) - 2)
                    yield unit, Outcome(candidate, "ok", us, us * 0.99, us * 1.01, 0.1)

    def measure_ceilings(self):
        # Low ceilings put the floor near the fake times, as on a real GPU.
        return Ceilings(2e10 / self.scale, "HBM spec", {"bf16": 7.0e12}, {"bf16": "measured"})

    def close(self):
        pass


def tune_into(
    save_dir: Path,
    *,
    device: str = "NVIDIA H200",
    triton: str = "3.6.0",
    scale: float = 1.0,
    engines=("vllm", "sglang"),
    compare_dir: Path | None = None,
    batch_sizes=(1, 16, 256),
):
    """Run the real `run_tune` on the fake GPU; returns the TuneSummary."""
    request = TuneRequest(
        problem=PROBLEM,
        batch_sizes=batch_sizes,
        space=tuple(load_space(DATA / "tiny-space.json")),
        save_dir=save_dir,
        engines=engines,
        search="exhaustive",
        device_name=device,
        triton_version=triton,
        devices=("0",),  # a GPU: the ceilings, so the floor, are measured
        compare_dir=compare_dir,
    )
    return run_tune(make_plan(request, DeviceLimits.h200()), backend=FakeGPU(scale))


class Page(HTMLParser):
    """The tables (by class: rows of cells with their attributes and text) and images of a page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tables: list[tuple[dict, list[list[dict]]]] = []
        self.images: list[str] = []
        self.links: list[str] = []
        self._cell: dict | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.tables.append((attrs, []))
        elif tag == "tr" and self.tables:
            self.tables[-1][1].append([])
        elif tag in ("td", "th") and self.tables:
            self._cell = {**attrs, "tag": tag, "text": ""}
            self.tables[-1][1][-1].append(self._cell)
        elif tag == "img":
            self.images.append(attrs["src"])
        elif tag == "a":
            self.links.append(attrs["href"])

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data

    def tables_of(self, css: str) -> list[tuple[dict, list[list[dict]]]]:
        return [table for table in self.tables if table[0].get("class") == css]


def body_rows(table) -> list[dict[str, dict]]:
    """A table's data rows as {data-col: cell}."""
    _, rows = table
    return [{cell["data-col"]: cell for cell in row if "data-col" in cell} for row in rows[1:]]
