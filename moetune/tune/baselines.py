"""What a tuned file is compared with: the engines' own configs for the same shape.

Per batch size M, up to four baselines, each timed on the GPU in the same run and
with the same harness as the candidates:

    vllm_fallback    vLLM's `get_default_config` (what vLLM runs with no file)
    sglang_fallback  SGLang's `get_default_config` (only when SGLang files are written)
    vllm_file        the row vLLM would use from the file it would load today
    sglang_file      the same for SGLang

"The file it would load today" is found exactly as the engine finds it
(`moetune.engines`): ``--compare-dir`` first, then the engine's env-var folder
and its installed package. A baseline config the kernel cannot run (vLLM's WNA16
path leaves tiles to later code) is None at that M.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moetune.dtypes import DTYPES, engine_file_n
from moetune.engines import sglang, vllm
from moetune.engines.formats import engine_label
from moetune.engines.lookup import load_table, nearest_row, timeable
from moetune.engines.tuned_file import load_tuned_file
from moetune.errors import MoetuneError
from moetune.kernel.config import Candidate
from moetune.kernel.probe import Probe
from moetune.tune.problem import TuneProblem

ORDER = ("vllm_fallback", "sglang_fallback", "vllm_file", "sglang_file")


@dataclass(frozen=True)
class Baseline:
    """One engine config per batch size to time against (None: not runnable at that M)."""

    key: str
    label: str  # column header
    source: str  # the engine version ported, or the file's path
    configs: dict[int, Candidate | Probe | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "source": self.source}


def engine_dtype(problem: TuneProblem) -> str | None:
    return DTYPES[problem.dtype].quant_dtype


def _candidate(config: dict[str, Any], *, tma_b: bool = False) -> Candidate | None:
    """The config an engine entry launches with; `tma_b`: a vLLM entry, whose ``USE_TMA``
    is vLLM 0.34's TMA-B switch (SGLang's, its split TMA, is not timed here)."""
    entry = timeable(config)
    if entry is None:
        return None
    try:
        candidate = Candidate.from_config(entry)
    except MoetuneError:
        return None
    return candidate.with_tma_b(config.get("USE_TMA") is not False) if tma_b else candidate


def engine_baselines(
    problem: TuneProblem,
    batch_sizes: Sequence[int],
    engines: Sequence[str],
    device_name: str,
    triton_version: str | None,
    *,
    compare_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    vllm_package: Path | None | str = "find",
    sglang_package: Path | None | str = "find",
    notes: list[str] | None = None,
    pair_down_tables: bool = False,
    vllm_release: str | None = None,
) -> list[Baseline]:
    """The baselines for this run, in `ORDER`; files only where the engine would find one.

    A file the engine would find but moetune cannot read is left out, with a note.
    SGLang's file with a ``_down`` table beside it: with `pair_down_tables`, each
    batch size's up + down pair (`moetune.engines.tuned_file`, timed in the split
    harness); without it (the tune, whose rows are whole calls), the up table alone,
    with a note saying so. vLLM's file is read as `vllm_release` reads it (None: the
    installed release, else the newest known): a ``USE_TMA`` entry is TMA-B off for 0.34,
    and a file 0.33 would refuse at start-up is left out with a note saying so.
    """
    env = os.environ if env is None else env
    dims = (
        problem.num_experts,
        problem.intermediate_size,
        problem.hidden_size,
        problem.top_k,
        engine_dtype(problem),
        problem.block_shape,
    )
    # Each engine's own fallback, for that engine's file only: a plan of one engine's file
    # times that engine's kernel, on which the other engine's fallback means nothing.
    baselines = []
    if "vllm" in engines:
        baselines.append(
            Baseline(
                "vllm_fallback",
                "vLLM fallback",
                f"get_default_config of {vllm.FOLLOWS}",
                {m: _candidate(c) for m, c in vllm.fallback_table(batch_sizes, *dims).items()},
            )
        )
    if "sglang" in engines:
        table = sglang.fallback_table(batch_sizes, *dims)
        baselines.append(
            Baseline(
                "sglang_fallback",
                "SGLang fallback",
                f"get_default_config of {sglang.FOLLOWS}",
                {m: _candidate(c) for m, c in table.items()},
            )
        )
    extra = (compare_dir,) if compare_dir is not None else ()
    version = None if triton_version in (None, "unknown") else triton_version
    for engine in engines:
        # The N in the file name (SGLang keys int4 on the packed N // 2).
        file_n = engine_file_n(engine, problem.intermediate_size, dims[4])
        name_args = (problem.num_experts, file_n, device_name, dims[4], dims[5])
        down_found = None
        if engine == "vllm":
            found = vllm.lookup(
                vllm.file_name(*name_args), env=env, package_configs=vllm_package, extra_dirs=extra
            ).found
        else:
            up, down = sglang.lookup_pair(
                sglang.file_name(*name_args, per_channel=problem.per_channel),
                version,
                env=env,
                package=sglang_package,
                extra_dirs=extra,
            )
            found, down_found = up.found, down.found
        if found is None:
            continue
        paired = down_found is not None
        # No _down file: SGLang reads the up table for the down GEMM, USE_TMA included.
        reused_tma = engine == "sglang" and not paired and sglang.tma_batch_sizes(Path(found))
        try:
            refused = sglang.entry_refusal(load_table(found)) if engine == "sglang" else None
            if refused:  # SGLang fails on the file: nothing to compare with
                raise MoetuneError(f"{found}: {refused}")
            if (paired or reused_tma) and pair_down_tables:
                tuned = load_tuned_file(
                    Path(found), Path(down_found) if paired else None, engine=engine
                )
                configs: dict[int, Candidate | Probe | None] = {
                    m: tuned.pick(m) for m in batch_sizes
                }
            elif engine == "vllm":
                release = vllm_release or vllm.target_release()[0]
                table = vllm.read_table_for(Path(found), release)
                configs = {m: _candidate(nearest_row(table, m), tma_b=True) for m in batch_sizes}
            else:
                table = load_table(found)
                configs = {m: _candidate(nearest_row(table, m)) for m in batch_sizes}
        except MoetuneError as exc:
            if notes is not None:
                notes.append(f"not compared with the {engine} file: {exc}")
            continue
        if paired and not pair_down_tables and notes is not None:
            notes.append(
                f"the SGLang file {Path(found).name} has a _down table: compared here on its "
                f"up table alone; `moetune benchmark --config {found}` times the pair"
            )
        baselines.append(
            Baseline(
                f"{engine}_file",
                f"{engine_label(engine)} file",
                str(found),
                configs,
            )
        )
    return baselines


def prefetch_baselines(
    measurer: Any, baselines: Sequence[Baseline], batch_sizes: Sequence[int]
) -> None:
    """Have `measurer` time the baselines alongside the search that runs next, behind its own
    work (`StoreMeasurer.alongside`), so `time_baselines` finds them in the store."""
    alongside = getattr(measurer, "alongside", None)
    if alongside is None:
        return
    for m in batch_sizes:
        configs = [c for c in (b.configs.get(m) for b in baselines) if c is not None]
        if configs:
            alongside(m, list(dict.fromkeys(configs)), "full")


def time_baselines(
    measurer: Any, baselines: Sequence[Baseline], batch_sizes: Sequence[int], notes: list[str]
) -> dict[int, dict[str, float | None]]:
    """{M: {baseline key: latency in us or None}}, every baseline timed at "full" fidelity.

    `measurer` is the run's `StoreMeasurer`: baselines are stored, resumed and
    compete with the candidates like any other measurement.
    """
    times: dict[int, dict[str, float | None]] = {}
    for m in batch_sizes:
        picks = {b.key: b.configs.get(m) for b in baselines}
        measured = measurer.measure(m, [c for c in picks.values() if c is not None], "full")
        times[m] = {}
        for baseline in baselines:
            candidate = picks[baseline.key]
            result = measured.get(candidate) if candidate is not None else None
            if candidate is None:
                times[m][baseline.key] = None
                notes.append(f"M={m}: {baseline.label} has no runnable config; not timed")
            elif result.status != "ok":
                times[m][baseline.key] = None
                notes.append(
                    f"M={m}: {baseline.label} {candidate.short()} failed "
                    f"({result.status}: {result.error})"
                )
            else:
                times[m][baseline.key] = result.latency_us
    return times


def geomean_speedup(pairs: Sequence[tuple[float | None, float | None]]) -> float | None:
    """Geometric mean of baseline / tuned over the batch sizes where both were timed."""
    ratios = [base / tuned for base, tuned in pairs if base and tuned]
    if not ratios:
        return None
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))
