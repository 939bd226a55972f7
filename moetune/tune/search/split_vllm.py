"""vLLM 0.34's down file: ``<name>_down.json``, tuned where vLLM reads it.

vLLM 0.34 reads a second table on one serving path (``TritonExperts`` in
``experts/triton_moe.py``; `moetune.engines.launch.vllm_0_34.DOWN_FILE_CONDITIONS`):
fp8_w8a8 with block [128, 128], compute capability 9.0 exactly, DeepGEMM's E8M0
scales in use (the default where DeepGEMM is installed), SiLU, no expert map or
LoRA, hidden size >= 4096, an aligned call (not the naive path of a small batch),
the main entry's BLOCK_SIZE_M a multiple of 16. It takes the entry of the nearest
batch size (``get_moe_configs(..., down_moe=True)``); only an entry with
``"USE_TMA": true`` switches the call to the sorted path: the up GEMM, still on the
main file's entry, writes its rows at the sorted position (``C_is_sorted``), a fused
SiLU-mul-quant runs on them, and the down GEMM reads them through a TMA descriptor
(``A_is_sorted``) on the down entry's tile with the main entry's BLOCK_SIZE_M. A
guard entry (``{"USE_TMA": false}`` alone, as in the H200 files 0.34 ships) keeps the
call on the main entry at the batch sizes nearest it.

So the main file keeps the single config (what every other serving path runs) and
the split search (`moetune.tune.search.split_fast`) searches the down GEMM alone,
with TMA, at the single config's BLOCK_SIZE_M: the up GEMM is fixed to the single
config. The pair is then timed as a whole call on vLLM 0.34's own kernel against the
single config in the same harness (`split_search._confirm`), checked against the
PyTorch reference, and written only where it is strictly faster; every other tuned
batch size gets a guard entry, and no file at all where no pair won.

moetune cannot see the server: the user declares DeepGEMM (``tune --vllm-deepgemm``);
the plan says when the file is tuned and what the server needs to read it.

The harness times vLLM's own GEMM launches (`moetune.engines.launch.vllm_0_34`) but
moetune's SiLU-and-mul: one fused SiLU-mul-quant kernel on both paths, over every row
of the sorted buffer (vLLM's sorted kernel stops at the padded count), with plain
scales (vLLM rounds the sorted path's to powers of two). With DeepGEMM E8M0 vLLM's
single path runs SiLU-and-mul and the quantization as two kernels, so the single call
timed here is, if anything, faster than vLLM's: the pair has to win by more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from moetune.kernel.config import Candidate
from moetune.kernel.probe import Probe
from moetune.tune.search.split import SplitResult
from moetune.tune.search.split_fast import SearchedPair

# The variants timed: the up GEMM (the single config only) and the down GEMM without TMA
# (the single config only: the reference), and the down GEMM on the sorted path (searched).
UP, DOWN, SORTED_DOWN = ("up", False), ("down", False), ("down", True)
VARIANTS = (UP, DOWN, SORTED_DOWN)
FIXED = (UP, DOWN)
DEEPGEMM_FLAG = "--vllm-deepgemm"
PLAN_INDENT = " " * 13  # the plan's label column ("vLLM down:   ")


def down_file_refusal(problem: Any, release: str, capability: tuple[int, int] | None) -> str | None:
    """Why vLLM `release` never runs `problem`'s down GEMM on a ``_down.json`` on this GPU
    (`capability`), or why moetune cannot time it; None: the shape, dtype and GPU allow it
    (the server's own conditions are `DOWN_FILE_CONDITIONS`'s)."""
    from moetune.dtypes import DTYPES
    from moetune.engines import vllm
    from moetune.engines.launch import release_module

    if vllm.down_file_conditions(release) is None:
        return f"vLLM {release} reads no _down.json"
    if not vllm.reads_down_file(release, DTYPES[problem.dtype].quant_dtype, problem.block_shape):
        return None  # silent: a dtype vLLM never looks a down file up for
    module = release_module("vllm", release)
    if not vllm.down_file_used(release, problem.hidden_size):
        return f"hidden size {problem.hidden_size} < {module.DOWN_FILE_MIN_HIDDEN}"
    if problem.intermediate_size % module.SORTED_GROUP_K:
        return f"intermediate size {problem.intermediate_size} not a multiple of 128"
    if tuple(capability or ()) != module.SORTED_CAPABILITY:
        got = "unknown" if capability is None else f"{capability[0]}.{capability[1]}"
        return f"vLLM reads it on compute capability 9.0 only, not {got}"
    kernel = problem.kernel
    if kernel is None or kernel.twin or kernel.engine != "vllm" or kernel.release != release:
        return f"the pair is timed on vLLM {release}'s own kernel, which this tune does not time"
    return None


def down_file_applies(problem: Any, release: str, capability: tuple[int, int] | None) -> bool:
    """Whether vLLM `release` may read a down file for `problem` on this GPU (and moetune
    times it on that release's kernel)."""
    from moetune.dtypes import DTYPES
    from moetune.engines import vllm

    return (
        vllm.down_file_conditions(release) is not None
        and vllm.reads_down_file(release, DTYPES[problem.dtype].quant_dtype, problem.block_shape)
        and down_file_refusal(problem, release, capability) is None
    )


def _release(plan: Any) -> str | None:
    """The release the vLLM file is for (`moetune.tune.output.vllm_file_release`'s rule)."""
    from moetune.engines.installed import current_release

    if "vllm" not in plan.request.engines:
        return None
    return plan.request.vllm_release or current_release("vllm")[0]


def tunes_down_file(plan: Any) -> bool:
    """Whether this tune searches vLLM's down pair: the conditions hold and the user
    declared DeepGEMM E8M0 (``--vllm-deepgemm``)."""
    release = _release(plan)
    return (
        release is not None
        and getattr(plan.request, "vllm_deepgemm", False)
        and down_file_applies(plan.problem, release, plan.limits.compute_capability)
    )


def down_plan_lines(plan: Any) -> list[str]:
    """The plan's word on vLLM's ``_down.json``: nothing where vLLM never looks one up for
    this dtype (or release); one line where it does but never on this shape or GPU; two
    where it is tuned, or would be with DeepGEMM declared: what the server needs to read it."""
    from moetune.dtypes import DTYPES
    from moetune.engines import vllm

    release = _release(plan)
    if release is None:
        return []
    problem = plan.problem

    if vllm.down_file_conditions(release) is None or not vllm.reads_down_file(
        release, DTYPES[problem.dtype].quant_dtype, problem.block_shape
    ):
        return []
    reason = down_file_refusal(problem, release, plan.limits.compute_capability)
    if reason is not None:
        return [f"vLLM down:   _down.json not tuned: {reason}"]
    reads = [
        f"vLLM {release} reads _down.json only with",
        "DeepGEMM E8M0 in use (DeepGEMM installed), SiLU, no expert map/LoRA",
    ]
    if not tunes_down_file(plan):
        return [
            f"vLLM down:   not tuned ({DEEPGEMM_FLAG} tunes it): {reads[0]}",
            f"{PLAN_INDENT}{reads[1]}",
        ]
    return [
        "vLLM down:   _down.json where the sorted-TMA down GEMM is faster as a whole call; "
        f"vLLM {release}",
        f"{PLAN_INDENT}reads it only with {reads[1]}",
    ]


def plan_json(plan: Any) -> dict[str, Any] | None:
    """``--json``'s word on the down file (None: vLLM never looks one up here)."""
    lines = down_plan_lines(plan)
    if not lines:
        return None
    text = " ".join(line[len(PLAN_INDENT) :].strip() for line in lines)
    return {"tuned": tunes_down_file(plan), "plan": text}


def skipped_at(problem: Any, batch_size: int, single: Candidate) -> str | None:
    """Why vLLM runs no sorted path at `batch_size` with `single` in the main file, or None."""
    from moetune.dtypes import DTYPES
    from moetune.engines.launch import release_module

    module = release_module("vllm", problem.kernel.release)
    quant = DTYPES[problem.dtype].quant_dtype
    slots = batch_size * problem.top_k
    if module.naive_assignment(slots, problem.num_experts, quant, problem.block_shape):
        return "vLLM skips the alignment at this batch size"
    if single.BLOCK_SIZE_M % module.SORTED_BLOCK_M_MULTIPLE:
        return f"the up BLOCK_SIZE_M {single.BLOCK_SIZE_M} is not a multiple of 16"
    return None


def down_space(plan: Any, batch_size: int, single: Candidate) -> list[Candidate]:
    """The down configs searched at `batch_size`: the pruned space at the single config's
    BLOCK_SIZE_M (vLLM runs the down entry with the main entry's), tiles dividing the
    hidden size, TMA-B on (the sorted path needs it)."""
    hidden = plan.problem.hidden_size
    return list(
        dict.fromkeys(
            c.with_tma_b(True)
            for c in plan.pruning[batch_size].kept
            if c.BLOCK_SIZE_M == single.BLOCK_SIZE_M and hidden % c.BLOCK_SIZE_N == 0
        )
    )


def tune_down_file(
    plan: Any,
    measurer: Any,
    backend: Any,
    singles: Mapping[int, Candidate],
    notes: list[str],
    rankings: Mapping[int, Sequence[Candidate]] | None = None,
    options: Any = None,
) -> list[SplitResult]:
    """One `SplitResult` per batch size: the down pair, and whether it is written (see the
    module docstring). `singles`: the verified whole-call winners (the main file's)."""
    from moetune.tune.search.split_fast import FastSplitOptions, SeededSplitSearch
    from moetune.tune.search.split_search import _confirm

    batch_sizes = list(plan.request.batch_sizes)
    skipped = {m: skipped_at(plan.problem, m, singles[m]) for m in batch_sizes}
    spaces = {m: down_space(plan, m, singles[m]) for m in batch_sizes}
    for m in batch_sizes:
        if skipped[m] is None and not spaces[m]:
            skipped[m] = "no down config of the space fits the up BLOCK_SIZE_M"
    searched_ms = [m for m in batch_sizes if skipped[m] is None]
    searched: dict[int, SearchedPair] = {
        m: SearchedPair(m, None, None, stopped=skipped[m]) for m in batch_sizes if skipped[m]
    }
    if searched_ms:
        search = SeededSplitSearch(
            measurer,
            plan.problem,
            plan.limits,
            VARIANTS,
            options or FastSplitOptions(),
            notes,
            fixed=FIXED,
        )
        found = search.run(
            searched_ms,
            lambda m: spaces[m],
            singles,
            {m: [c.with_tma_b(True) for c in (rankings or {}).get(m, ())] for m in searched_ms},
        )
        for m, pair in found.items():
            if pair.stopped is None and pair.choice is not None and not pair.choice.down.use_tma:
                pair = replace(pair, stopped="the single config's down GEMM is faster alone")
            searched[m] = pair
    return _confirm(plan, measurer, backend, dict(singles), searched, notes)


def won(result: SplitResult, main_entry: Candidate | None) -> Probe | None:
    """The pair to write at `result`'s batch size: one faster as a whole call, on the sorted
    path, whose up config is what the main file holds there (else it was never timed)."""
    if not result.split or result.choice is None:
        return None
    pair = result.choice.pair()
    if not pair.down_tma or pair.candidate != main_entry:
        return None
    return pair


def settle(results: Mapping[int, Candidate], pairs: Sequence[SplitResult]) -> list[SplitResult]:
    """`pairs` as the ``_down.json`` will hold them: a pair timed with an up config that the
    confirmation did not keep for the vLLM file is not written (vLLM would pair its down
    config with another up GEMM), so its result says so instead of claiming the split."""
    settled = []
    for result in pairs:
        if result.split and won(result, results.get(result.batch_size)) is None:
            result = replace(
                result,
                split=False,
                stopped="the confirmation kept another config for the vLLM file; the pair "
                "was timed with the search's",
            )
        settled.append(result)
    return settled


def down_table(
    results: Mapping[int, Candidate], pairs: Sequence[SplitResult]
) -> dict[int, dict[str, Any]] | None:
    """The ``_down.json`` table: the winning pair's down config with ``"USE_TMA": true``,
    a guard entry ``{"USE_TMA": false}`` at every other tuned batch size (vLLM takes the
    nearest key); None where no pair won (no file)."""
    winners = {r.batch_size: won(r, results.get(r.batch_size)) for r in pairs}
    if not any(winners.values()):
        return None
    table: dict[int, dict[str, Any]] = {}
    for m in results:
        pair = winners.get(m)
        if pair is None:
            table[m] = {"USE_TMA": False}
        else:
            assert pair.down is not None
            table[m] = {**pair.down.with_tma_b(True).as_config(), "USE_TMA": True}
    return table


def write_down_file(
    results: Mapping[int, Candidate],
    pairs: Sequence[SplitResult],
    main: Path,
    triton_version: str,
    notes: list[str],
) -> list[Path]:
    """Write vLLM's ``_down.json`` beside the vLLM file `main` (checked, atomically) where a
    pair won; return the paths written (none: a note says why)."""
    from moetune.engines.tuned_file import write_tuned_files

    path = main.with_name(main.name.removesuffix(".json") + "_down.json")
    table = down_table(results, pairs)
    if table is None:
        notes.append(
            f"vLLM down pair: no pair was faster as a whole call; no {path.name} written"
            + (" (the one in the folder is from an earlier run)" if path.exists() else "")
        )
        return []
    from moetune.engines.tuned_file import FileWriteError, file_payload, validate_tuned_config
    from moetune.errors import TuneError

    payload = file_payload("vllm", table, triton_version, down=True)
    validate_tuned_config(payload, "vllm", name=str(path), down=True)
    try:
        written = write_tuned_files([(path, payload)], notes)
    except FileWriteError as exc:
        raise TuneError(
            f"{exc}; the measurements are in the results store: fix this and rerun the "
            "same command to write the files"
        ) from None
    kept = sorted(m for m, entry in table.items() if entry["USE_TMA"])
    notes.append(
        f"vLLM down pair: faster as a whole call at M={', '.join(map(str, kept))}: "
        f"{path.name} (read by vLLM with DeepGEMM E8M0 in use)"
    )
    return written
