"""The candidate grid and its provably safe pruning.

A `Candidate` is one kernel config: the six keys vLLM's and SGLang's tuned
files hold per batch size. The default grid is the one both engines' tuners
sweep on CUDA (1,920 candidates); a user may narrow it with a JSON/YAML file.

`prune` removes, for one problem and batch size, candidates that cannot be the
winner. Each rule is a function whose docstring gives its safety argument; a
rule either removes candidates that cannot run correctly (or at all) on the
device, or removes a candidate only when another candidate that is kept does
the same work with less (or identical) effort. Rules run in `PRUNE_RULES`
order and `PruneReport.removed` counts what each one removed.

`MEASURED_RULES` are kept apart: they remove candidates that the recorded
measurements show are never near the best, without a proof. Only the fast search
(the default) applies them (`prune_rules`); ``--search thorough`` and
``exhaustive`` search the grid the safe rules leave, so what a measured rule
loses can still be measured.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moetune.device import DeviceLimits
from moetune.dtypes import DTYPES
from moetune.engines.lookup import ENGINE_BATCH_SIZES
from moetune.errors import TuneError
from moetune.extract.mappings import PlainYamlError, parse_plain_yaml
from moetune.fileio import read_input_text
from moetune.kernel.config import CONFIG_KEYS, SWAP_AB_BLOCK_M, Candidate
from moetune.tune.problem import TuneProblem

PARAM_NAMES = CONFIG_KEYS  # the engines' six keys, in their order
# The most a --space file may hold: its size, the configs it lists, the candidates its grid
# spans (the default grid: 1,920). Each config of a list is schema-checked: 10,000 take 2 s.
SPACE_FILE_LIMIT = 1 << 20
MAX_SPACE_CONFIGS = 10_000
MAX_SPACE_CANDIDATES = 100_000

# The grid vLLM's benchmark_moe.py and SGLang's tuning_fused_moe_triton.py sweep on CUDA.
DEFAULT_VALUES: dict[str, tuple[int, ...]] = {
    "BLOCK_SIZE_M": (16, 32, 64, 128, 256),
    "BLOCK_SIZE_N": (32, 64, 128, 256),
    "BLOCK_SIZE_K": (64, 128, 256),
    "GROUP_SIZE_M": (1, 16, 32, 64),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4, 5),
}

# The engines' tuners' 18 batch sizes, 1 ... 4096 (one list: moetune.engines.lookup).
DEFAULT_BATCH_SIZES = ENGINE_BATCH_SIZES

# The thinnest token tile (SWAP_AB_BLOCK_M) is legal only where the kernel swaps A and B
# (`swap_ab_candidates`), and only with N tiles this wide.
SWAP_AB_MIN_BLOCK_N = 64


def grid(values: dict[str, Sequence[int]]) -> list[Candidate]:
    """Every combination of the given values (all six parameters), sorted."""
    product = itertools.product(*(values[name] for name in PARAM_NAMES))
    return sorted({Candidate(*combo) for combo in product})


def default_space() -> list[Candidate]:
    """vLLM's and SGLang's CUDA grid: 5 x 4 x 3 x 4 x 2 x 4 = 1,920 candidates."""
    return grid(DEFAULT_VALUES)


def load_space(path: str | Path) -> list[Candidate]:
    """A user-narrowed space from JSON or YAML (``schemas/search_space.schema.json``).

    Either a grid, ``{"BLOCK_SIZE_M": [16, 32], "num_warps": 4, ...}`` (a
    missing parameter takes the default grid's values), or a list of complete
    configs. Any problem is one `TuneError` line naming the file and, where it
    is one value, its place (see docs/search-space.md).
    """
    source = Path(path)
    data = _read_space_file(source)
    try:
        _check_space_size(data)
        _check_space_schema(data)
        candidates = _space_from_data(data)
    except TuneError as exc:
        raise TuneError(f"search space {source}: {exc}") from None
    if not candidates:
        raise TuneError(f"search space {source} holds no candidates")
    return candidates


def _read_space_file(source: Path) -> Any:
    """The data of a --space file: a regular file of at most `SPACE_FILE_LIMIT` bytes, JSON
    or plain YAML (no anchors or aliases: one can expand a small file without bound)."""
    try:
        text = read_input_text(source, SPACE_FILE_LIMIT)
    except UnicodeDecodeError:
        raise TuneError(f"search space {source} is not UTF-8 text") from None
    except OSError as exc:
        raise TuneError(f"cannot read search space {source}: {exc.strerror or exc}") from None
    language = source.suffix[1:] or "YAML"
    try:
        if source.suffix == ".json":
            return json.loads(text)
        return parse_plain_yaml(text)[1]
    except PlainYamlError as exc:
        where = f"search space {exc.place(source)}"
        if exc.alias:
            raise TuneError(
                f"{where}: YAML anchors and aliases are not allowed in a search space "
                "(an alias can expand without bound); write the values out"
            ) from None
        raise TuneError(f"{where}: {exc.problem}") from None
    except json.JSONDecodeError as exc:
        raise TuneError(
            f"search space {source}:{exc.lineno}:{exc.colno}: malformed JSON ({exc.msg})"
        ) from None
    except RecursionError:
        raise TuneError(
            f"search space {source} is not valid {language}: nested too deeply"
        ) from None
    except ValueError as exc:  # invalid JSON, or an integer with too many digits
        detail = str(exc).splitlines()[0].split(";")[0]
        raise TuneError(f"search space {source} is not valid {language}: {detail}") from None


def _check_space_size(data: Any) -> None:
    """At most `MAX_SPACE_CONFIGS` configs in a list and `MAX_SPACE_CANDIDATES` in a grid,
    checked before the list is validated or the grid built (a grid of every GROUP_SIZE_M
    and num_stages is 94 million)."""
    if isinstance(data, list):
        count, bound, what = len(data), MAX_SPACE_CONFIGS, "a list of"
    elif isinstance(data, dict):
        count, bound, what = 1, MAX_SPACE_CANDIDATES, "a grid of"
        for name in PARAM_NAMES:
            given = data.get(name, DEFAULT_VALUES[name])
            count *= len(set(given)) if isinstance(given, (list, tuple)) and _hashable(given) else 1
    else:
        return
    if count > bound:
        raise TuneError(
            f"{what} {count:,} configs, more than the {bound:,} a search space "
            "may hold (the default grid has 1,920); narrow it (see docs/search-space.md)"
        )


def _hashable(values: list[Any]) -> bool:
    try:
        set(values)
    except TypeError:
        return False
    return True


def _check_space_schema(data: Any) -> None:
    """`data` against ``schemas/search_space.schema.json``: the first fault, in one line."""
    from jsonschema import Draft202012Validator, validators
    from jsonschema.exceptions import best_match

    if not isinstance(data, (dict, list)):
        raise TuneError(
            "expected a mapping of parameter -> values or a list of configs, "
            f"got {type(data).__name__} (see docs/search-space.md)"
        )

    def is_integer(checker: Any, instance: Any) -> bool:  # 64.0 and "64" are no tile sizes
        return isinstance(instance, int) and not isinstance(instance, bool)

    strict = validators.extend(
        Draft202012Validator,
        type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", is_integer),
    )
    schema = _space_schema()
    definition = "grid" if isinstance(data, dict) else "configs"
    validator = strict({"$defs": schema["$defs"], "$ref": f"#/$defs/{definition}"})
    error = best_match(validator.iter_errors(data))
    if error is None:
        return
    # A value that is neither a good value nor a list of them: say what one value must be.
    while error.context and error.validator == "oneOf":
        error = best_match(error.context)
    where = ", ".join(
        f"config {step + 1}"
        if isinstance(step, int) and definition == "configs" and not i
        else f"item {step + 1}"
        if isinstance(step, int)
        else str(step)
        for i, step in enumerate(error.absolute_path)
    )
    described = error.schema.get("description") if isinstance(error.schema, dict) else None
    whole = _integral_non_integer(error.instance)
    if whole is not None:
        problem = f"{json.dumps(error.instance)} must be an integer: write {whole}"
    elif error.validator in ("enum", "type", "minimum", "maximum") and described:
        problem = f"{json.dumps(error.instance)} is not {described}"
    elif error.validator == "additionalProperties":
        unknown = sorted(map(str, set(error.instance) - set(PARAM_NAMES)))
        problem = f"unknown parameter(s) {', '.join(unknown)}; expected {', '.join(PARAM_NAMES)}"
    elif error.validator == "required":
        missing = [name for name in PARAM_NAMES if name not in error.instance]
        problem = f"missing {', '.join(missing)} (a config has all six keys)"
    elif error.validator == "minItems":
        problem = "an empty list (give at least one value)"
    else:
        problem = error.message
    if len(problem) > 160:
        problem = problem[:157] + "..."
    raise TuneError(f"{where + ': ' if where else ''}{problem} (see docs/search-space.md)")


def _integral_non_integer(value: Any) -> int | None:
    """The integer that a float or string such as ``64.0`` or ``"64"`` writes, else None:
    the schema wants integers, so such a value is refused for its type, not its number."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value)
    return None


def _space_schema() -> dict[str, Any]:
    """The packaged ``search_space.schema.json`` (``moetune/data/schemas`` links to ``schemas/``)."""
    from importlib import resources

    source = resources.files("moetune") / "data" / "schemas" / "search_space.schema.json"
    return json.loads(source.read_text())


def _space_from_data(data: Any) -> list[Candidate]:
    if isinstance(data, list):
        return sorted({Candidate.from_config(item) for item in data})
    if not isinstance(data, dict):
        raise TuneError(
            "expected a mapping of parameter -> values or a list of configs, "
            f"got {type(data).__name__}"
        )
    unknown = sorted(set(map(str, data)) - set(PARAM_NAMES))
    if unknown:
        raise TuneError(
            f"unknown parameter(s) {', '.join(unknown)}; expected {', '.join(PARAM_NAMES)}"
        )
    values: dict[str, Sequence[int]] = {}
    for name in PARAM_NAMES:
        given = data.get(name, DEFAULT_VALUES[name])
        given = given if isinstance(given, (list, tuple)) else [given]
        if not given:
            raise TuneError(f"{name} has an empty list of values")
        values[name] = given
    return grid(values)


@dataclass(frozen=True)
class PruneReport:
    """What `prune` kept, and how many each rule removed (in rule order)."""

    kept: list[Candidate]
    removed: dict[str, int]

    @property
    def total_removed(self) -> int:
        return sum(self.removed.values())


@dataclass(frozen=True)
class PruneContext:
    """Everything a rule may look at besides the candidates."""

    problem: TuneProblem
    batch_size: int
    limits: DeviceLimits


# Hopper's tensor-core paths: Triton uses wgmma for tiles of 64 rows and more, mma.sync below.
WGMMA_MIN_BLOCK_M = 64


def pipeline_buffers(
    candidate: Candidate, problem: TuneProblem, limits: DeviceLimits | None = None
) -> int:
    """How many copies of its A and B tiles the K loop keeps in shared memory, at least.

    Compiled offline for sm_90 (no GPU needed), moetune's fused-MoE kernel over
    the whole default grid allocates exactly ``num_stages`` copies with wgmma
    (BLOCK_SIZE_M >= 64) and ``num_stages - 1`` with mma.sync (BLOCK_SIZE_M 16
    and 32), in Triton 3.6 (bf16) and 3.9 (bf16, fp8 per-tensor and block). So
    ``num_stages`` is used only where that was seen (a Hopper device, those
    dtypes, wgmma tiles) and ``num_stages - 1`` everywhere else, which never
    overstates: elsewhere Triton keeps at least ``num_stages - 1`` copies too.
    """
    hopper = limits is not None and limits.compute_capability == (9, 0)
    if (
        hopper
        and DTYPES[problem.dtype].wgmma_stages_seen
        and candidate.BLOCK_SIZE_M >= WGMMA_MIN_BLOCK_M
    ):
        return candidate.num_stages
    return max(candidate.num_stages - 1, 1)


def shared_memory_lower_bound(
    candidate: Candidate, problem: TuneProblem, limits: DeviceLimits | None = None
) -> int:
    """Bytes of shared memory the kernel's pipelined A and B tiles need, at least.

    `pipeline_buffers` copies of one A tile (BLOCK_SIZE_M x BLOCK_SIZE_K
    activations) and one B tile (BLOCK_SIZE_K x BLOCK_SIZE_N weights). The
    epilogue's scratch and the scale tiles of quantized kernels only add to it.
    """
    a_bytes = DTYPES[problem.dtype].activation_bytes
    w_bytes = DTYPES[problem.dtype].weight_bytes
    m, n, k = candidate.BLOCK_SIZE_M, candidate.BLOCK_SIZE_N, candidate.BLOCK_SIZE_K
    per_stage = m * k * a_bytes + k * n * w_bytes
    return int(pipeline_buffers(candidate, problem, limits) * per_stage)  # int4: half bytes


def swap_ab_candidates(
    space: Iterable[Candidate], problem: TuneProblem, limits: DeviceLimits
) -> list[Candidate]:
    """The 8-row twins of the space's BLOCK_SIZE_M=16 tiles, where the timed kernel swaps.

    vLLM 0.33's and SGLang 0.5.23's kernels, and moetune's twin (vLLM's rule,
    `moetune.kernel.fused_moe_kernel.swaps_ab`), swap A and B (``SWAP_AB``) for
    fp8_w8a8 on compute capability 9.0 when BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64:
    the tokens become the dot's N, so an 8-row tile is legal (vLLM ships such configs
    for decode).
    """
    if problem.dtype != "fp8_w8a8" or limits.compute_capability != (9, 0):
        return []
    return sorted(
        {
            replace(c, BLOCK_SIZE_M=SWAP_AB_BLOCK_M)
            for c in space
            if c.BLOCK_SIZE_M == 16 and c.BLOCK_SIZE_N >= SWAP_AB_MIN_BLOCK_N
        }
    )


def rule_block_quant(candidates: list[Candidate], ctx: PruneContext) -> list[Candidate]:
    """Block-quantized fp8: BLOCK_SIZE_K must divide the weight block's block_k.

    Safety: the engines' kernel loads one activation and one weight scale per
    K step (``k * BLOCK_SIZE_K // block_k``), so a K tile that straddles two
    quantization blocks is scaled with the wrong factor: such a config computes
    wrong numbers in vLLM and SGLang and can never be written. BLOCK_SIZE_N needs
    no rule: weight scales are loaded per output column (``offs_n // block_n``),
    correct for any tile width (vLLM's tuner also drops BLOCK_SIZE_N that do not
    divide block_n; that is a narrowing, not a safety rule, so it is not done here).
    """
    if ctx.problem.block_shape is None:
        return candidates
    block_k = ctx.problem.block_shape[1]
    return [c for c in candidates if block_k % c.BLOCK_SIZE_K == 0]


def rule_eight_bit_dot(candidates: list[Candidate], ctx: PruneContext) -> list[Candidate]:
    """fp8 and int8 w8a8: BLOCK_SIZE_K of at least 32.

    Safety: Hopper's 8-bit tensor-core dot reduces over 32 elements and Triton
    refuses a narrower one (`moetune.kernel.fused_moe_kernel.check_config` refuses
    it on every machine), so such a candidate cannot run. The default grid has none.
    """
    if not DTYPES[ctx.problem.dtype].quantizes_activations:
        return candidates
    return [c for c in candidates if c.BLOCK_SIZE_K >= 32]


def rule_wna16_blocks(candidates: list[Candidate], ctx: PruneContext) -> list[Candidate]:
    """int4 w4a16: BLOCK_SIZE_K a multiple of the group size and a divisor of K and N.

    Safety: vLLM hands a tuned config's BLOCK_SIZE_N/K unchanged to its
    ``moe_wna16`` CUDA kernel whenever it picks that kernel (CUDA, group size 32,
    64 or 128, at most 6 token slots per expert: the small batch sizes), and that
    kernel needs ``BLOCK_SIZE_K % group_size == 0`` and ``size_k % BLOCK_SIZE_K ==
    0``; its Triton kernel (``fused_moe_kernel_gptq_awq``) loads the packed weight
    tile without a K mask, so a partial last K tile reads past the row. vLLM's own
    WNA16 tuner (``benchmarks/kernels/tune_moe_wna16_triton.py``) keeps exactly the
    candidates with ``BLOCK_SIZE_K % group_size == 0`` and BLOCK_SIZE_K dividing
    both K (hidden size) and N (intermediate size); anything else may compute
    wrong numbers or fault in vLLM, so it is never written.
    """
    problem = ctx.problem
    if problem.group_size is None:
        return candidates
    return [
        c
        for c in candidates
        if c.BLOCK_SIZE_K % problem.group_size == 0
        and problem.hidden_size % c.BLOCK_SIZE_K == 0
        and problem.intermediate_size % c.BLOCK_SIZE_K == 0
    ]


def rule_shared_memory(candidates: list[Candidate], ctx: PruneContext) -> list[Candidate]:
    """Tiles whose pipelined buffers cannot fit the device's shared memory per block.

    Safety: `shared_memory_lower_bound` never exceeds what Triton allocates, and
    Triton refuses to launch (OutOfResources) a kernel needing more than the
    device's opt-in limit, so every candidate removed here would fail.
    """
    limit = ctx.limits.shared_memory_per_block
    return [c for c in candidates if shared_memory_lower_bound(c, ctx.problem, ctx.limits) <= limit]


def _keep_smallest_covering(
    candidates: list[Candidate],
    param: str,
    covers: Callable[[Candidate], bool],
    kind: Callable[[Candidate], object] = lambda c: None,
) -> list[Candidate]:
    """Among candidates equal except in `param` (and of the same `kind`), drop those that
    cover the problem, except the smallest."""

    def anchor(c: Candidate) -> tuple[Candidate, object]:
        return replace(c, **{param: 16}), kind(c)

    smallest: dict[tuple[Candidate, object], int] = {}
    for c in candidates:
        if covers(c):
            key = anchor(c)
            smallest[key] = min(smallest.get(key, getattr(c, param)), getattr(c, param))
    return [c for c in candidates if not covers(c) or getattr(c, param) == smallest[anchor(c)]]


def rule_block_m_covers_experts(candidates: list[Candidate], ctx: PruneContext) -> list[Candidate]:
    """BLOCK_SIZE_M at or above the batch size: keep only the smallest such tile per MMA path.

    An expert receives at most M token slots (each token picks an expert at
    most once), so once BLOCK_SIZE_M >= M every expert that got tokens is
    padded to exactly one block of rows, whatever the routing. Two candidates
    equal but for such a BLOCK_SIZE_M read the same weights and the same
    tokens through the same number of working programs; the larger tile only
    multiplies more padding rows and holds more shared memory and registers.
    That holds within one tensor-core path: Triton compiles tiles of 64 rows
    and more to wgmma and smaller ones to mma.sync, with a different pipeline
    depth, so the smallest covering tile of each path is kept (at M=1: 16 and 64).
    """
    m = ctx.batch_size
    return _keep_smallest_covering(
        candidates,
        "BLOCK_SIZE_M",
        lambda c: c.BLOCK_SIZE_M >= m,
        kind=lambda c: (c.BLOCK_SIZE_M >= WGMMA_MIN_BLOCK_M, c.BLOCK_SIZE_M < 16),
    )


def rule_block_n_covers_width(candidates: list[Candidate], ctx: PruneContext) -> list[Candidate]:
    """BLOCK_SIZE_N at or above both GEMMs' output widths (2N and K): keep the smallest.

    The same config runs the gate/up GEMM (2N outputs) and the down GEMM (K
    outputs). A tile at least as wide as both gives one column of programs in
    each; a wider one computes the same outputs with more masked lanes, more
    MMA work and more shared memory. The smallest covering tile is kept.
    """
    width = max(ctx.problem.w1_width, ctx.problem.hidden_size)
    return _keep_smallest_covering(candidates, "BLOCK_SIZE_N", lambda c: c.BLOCK_SIZE_N >= width)


def rule_block_k_covers_depth(candidates: list[Candidate], ctx: PruneContext) -> list[Candidate]:
    """BLOCK_SIZE_K at or above both GEMMs' reduction depths (K and N): keep the smallest.

    A tile that deep runs the K loop once in both GEMMs; a deeper one loads
    the same (masked) data and multiplies more zeros. The smallest covering
    tile is kept.
    """
    depth = max(ctx.problem.hidden_size, ctx.problem.intermediate_size)
    return _keep_smallest_covering(candidates, "BLOCK_SIZE_K", lambda c: c.BLOCK_SIZE_K >= depth)


def max_row_blocks(problem: TuneProblem, batch_size: int, block_size_m: int) -> int:
    """An upper bound on the kernel grid's row blocks: ceil(M * top_k / BLOCK_SIZE_M) + E.

    The aligned token list holds M * top_k slots plus at most BLOCK_SIZE_M - 1
    padding slots per expert (vLLM, SGLang and moetune size it that way, then
    round it up to whole blocks).
    """
    return -(-batch_size * problem.top_k // block_size_m) + problem.num_experts


def rule_group_size_m_degenerate(candidates: list[Candidate], ctx: PruneContext) -> list[Candidate]:
    """GROUP_SIZE_M at or above the number of row blocks: keep the smallest such value.

    The kernel maps a program id to a tile with the grouped ordering of
    Triton's matmul tutorial. When GROUP_SIZE_M >= the number of row blocks
    there is a single group and the mapping is ``pid_m = pid % num_pid_m,
    pid_n = pid // num_pid_m`` for every such GROUP_SIZE_M: the candidates run
    identical programs in an identical order, so keeping one loses nothing.
    The bound on row blocks is `max_row_blocks` (an over-estimate only keeps more).
    """
    problem, m = ctx.problem, ctx.batch_size
    return _keep_smallest_covering(
        candidates,
        "GROUP_SIZE_M",
        lambda c: c.GROUP_SIZE_M >= max_row_blocks(problem, m, c.BLOCK_SIZE_M),
    )


# A thread's share of a tile's accumulator at and above which the tile spills (see
# `rule_accumulator_spills`): NVIDIA's cap is 255 32-bit registers per thread.
ACCUMULATOR_SPILL_REGISTERS = 256
# From this compute capability on (Blackwell's tcgen05) the MMA accumulates in tensor memory.
TENSOR_MEMORY_ACCUMULATOR_CC = (10, 0)


def accumulator_registers(candidate: Candidate) -> float:
    """32-bit registers each thread holds of the tile's accumulator.

    BLOCK_SIZE_M x BLOCK_SIZE_N fp32 (int32 for int8) values over ``32 * num_warps``
    threads; a swapped 8-row tile (`swap_ab_candidates`) accumulates BLOCK_SIZE_N x 8,
    the same product.
    """
    return candidate.BLOCK_SIZE_M * candidate.BLOCK_SIZE_N / (32 * candidate.num_warps)


def rule_accumulator_spills(candidates: list[Candidate], ctx: PruneContext) -> list[Candidate]:
    """Tiles whose accumulator needs 256 or more registers per thread, where they spill.

    Measured, not proven (a `MEASURED_RULES` rule: the fast search only). On NVIDIA
    GPUs before compute capability 10 the tensor-core accumulator lives in registers,
    at most 255 per thread, so a tile with ``BLOCK_SIZE_M * BLOCK_SIZE_N / (32 *
    num_warps) >= ACCUMULATOR_SPILL_REGISTERS`` (128x256 or 256x128 with 4 warps,
    256x256 with 4 or 8) spills it to local memory. In the 22 recorded H200 stores
    under bench/results that timed such tiles (bf16, fp8, int8, int4), none of their
    930 whole-call timings came closer than 1.88x to the best of its batch size and
    fidelity (median 6.1x, up to 150x; BENCHMARKS.md, Tune time). They are also the
    dearest compiles: in a recorded DeepSeek-V3 TP8 fp8-block default tune's store all
    19 compiles over 5 s were such tiles,
    359 of its 1,086 compile CPU-s. Neither vLLM's nor SGLang's shipped H100, H200
    or H20 files use one. Blackwell (tcgen05, compute capability 10 and up)
    accumulates in tensor memory, and an unknown device may too: there the rule
    keeps everything. It never empties the space: if every
    candidate left would spill, all are kept.
    """
    capability = ctx.limits.compute_capability
    if capability is None or capability >= TENSOR_MEMORY_ACCUMULATOR_CC:
        return candidates
    fits = [c for c in candidates if accumulator_registers(c) < ACCUMULATOR_SPILL_REGISTERS]
    return fits or candidates


Rule = Callable[[list[Candidate], PruneContext], list[Candidate]]

# (name, rule) in the order they run; the names are the keys of PruneReport.removed.
PRUNE_RULES: tuple[tuple[str, Rule], ...] = (
    ("block_quant", rule_block_quant),
    ("eight_bit_dot", rule_eight_bit_dot),
    ("wna16_blocks", rule_wna16_blocks),
    ("shared_memory", rule_shared_memory),
    ("block_m_covers_experts", rule_block_m_covers_experts),
    ("block_n_covers_width", rule_block_n_covers_width),
    ("block_k_covers_depth", rule_block_k_covers_depth),
    ("group_size_m_degenerate", rule_group_size_m_degenerate),
)

# Rules the recorded measurements support but no proof does (module docstring): run after
# `PRUNE_RULES`, by the fast search only.
MEASURED_RULES: tuple[tuple[str, Rule], ...] = (("accumulator_spills", rule_accumulator_spills),)


def prune_rules(search: str) -> tuple[tuple[str, Rule], ...]:
    """The rules a search prunes with: `PRUNE_RULES`, and `MEASURED_RULES` for ``fast``."""
    return PRUNE_RULES + MEASURED_RULES if search == "fast" else PRUNE_RULES


def prune(
    candidates: Iterable[Candidate],
    problem: TuneProblem,
    batch_size: int,
    limits: DeviceLimits,
    rules: Sequence[tuple[str, Rule]] = PRUNE_RULES,
) -> PruneReport:
    """Apply `rules` in order (the provably safe ones unless told: `prune_rules`); report
    what survived and what each rule removed."""
    if batch_size < 1:
        raise TuneError(f"batch size must be a positive integer, got {batch_size}")
    kept = sorted(set(candidates))
    ctx = PruneContext(problem=problem, batch_size=batch_size, limits=limits)
    removed: dict[str, int] = {}
    for name, rule in rules:
        survivors = rule(kept, ctx)
        removed[name] = len(kept) - len(survivors)
        kept = survivors
    return PruneReport(kept=kept, removed=removed)


def values_by_param(candidates: Iterable[Candidate]) -> dict[str, list[int]]:
    """The sorted distinct values each parameter takes in `candidates`."""
    seen: dict[str, set[int]] = defaultdict(set)
    for c in candidates:
        for name in PARAM_NAMES:
            seen[name].add(getattr(c, name))
    return {name: sorted(seen[name]) for name in PARAM_NAMES}


# How many of a batch size's fastest configs are re-timed with vLLM 0.34's TMA-B off.
TMA_B_OFF_TOP = 3


def tma_b_kernel(problem: TuneProblem, file_release: str) -> Any:
    """The release module whose TMA-B switch a tune of `problem` may write, or None.

    All must hold: the problem is block fp8 (the only TMA-B path), the timed kernel's launch
    honours a per-entry ``USE_TMA`` (vLLM 0.34's own kernel and on; vLLM's twin, which follows
    0.34; not SGLang's kernels), and the vLLM file is for a release that reads it
    (`file_release`; 0.33 stops at start-up on the key).
    """
    from moetune.engines import vllm
    from moetune.engines.launch import TWINS, release_module
    from moetune.kernel.config import TMA_B_KEY

    kernel = problem.kernel
    if kernel is not None and (kernel.twin or kernel.engine != "vllm"):
        return None
    if DTYPES[problem.dtype].quant_dtype != "fp8_w8a8" or not problem.block_shape:
        return None  # TMA-B is block fp8's only
    if TMA_B_KEY not in vllm.file_keys(file_release):
        return None
    release = TWINS["vllm"][0] if kernel is None else kernel.release
    module = release_module("vllm", release)
    return module if hasattr(module, "use_tma_b") else None


def tma_b_off_candidates(
    ranking: Sequence[Candidate],
    problem: TuneProblem,
    limits: DeviceLimits,
    file_release: str,
    top: int = TMA_B_OFF_TOP,
) -> list[Candidate]:
    """The TMA-B-off twins (``USE_TMA: false``) of the first `top` configs of `ranking`
    (fastest first, TMA-B on as timed) where the switch changes the launch.

    TMA-B is tried off only on the best few tiles, not across the space: the switch changes
    how the weights are loaded, not the tiling, so the tiles fastest with TMA-B on are where
    off can win, at `top` more timings per batch size instead of a doubled search. None
    when the kernel or the file's release has no such switch (`tma_b_kernel`), and for a
    config neither of whose GEMMs would take TMA-B (the launch's own conditions: block
    fp8, capability 9.x/10.x, N and K multiples of the tile), whose off twin is the
    same launch.
    """
    module = tma_b_kernel(problem, file_release)
    if module is None:
        return []
    quant_dtype = DTYPES[problem.dtype].quant_dtype
    block = problem.block_shape
    # (N, K) of the up GEMM (w1: [E, 2I, H]) and the down GEMM (w2: [E, H, I]).
    gemms = (
        (2 * problem.intermediate_size, problem.hidden_size),
        (problem.hidden_size, problem.intermediate_size),
    )
    chosen = []
    for candidate in [c for c in ranking if c.USE_TMA][:top]:
        config = candidate.as_config()
        # The launcher's clamp of BLOCK_SIZE_K to the quantization block (vLLM 0.33 on).
        block_k = min(candidate.BLOCK_SIZE_K, *block) if block else candidate.BLOCK_SIZE_K
        if any(
            module.use_tma_b(config, quant_dtype, block, limits.compute_capability, n, k, block_k)
            for n, k in gemms
        ):
            chosen.append(candidate.with_tma_b(False))
    return chosen
