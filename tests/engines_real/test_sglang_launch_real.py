"""moetune launches SGLang 0.5.23's kernel exactly as SGLang 0.5.23 does, whole layer and all.

SGLang's own launch code is cut out of the released files at test time: the Python
functions of ``triton_utils/fused_moe.py`` (``fused_experts`` down to
``_fused_moe_kernel_sequence``), ``fused_moe_triton_config.py`` (the tuned-file lookup,
reading the file written here through ``$SGLANG_MOE_CONFIG_DIR``-style roots),
``moe_align_block_size.py`` (the buffers it allocates) and ``fused_moe_triton_kernels.py``
(``invoke_fused_moe_kernel`` and its TMA descriptor helpers) are compiled from the
installed sources with their decorators dropped; only the names they import from the
rest of SGLang are stubbed (the GPU's capability, the CUDA-only quantization and
activation kernels, which allocate their outputs as SGLang's do and compute nothing,
and the alignment kernel, whose buffers SGLang's own Python sizes). Nothing is copied
into moetune.

The same layer then runs through moetune's port (`moetune.kernel.fused_moe.fused_experts`
on SGLang's launch, `moetune.engines.launch.sglang_0_5_23`, with the file read through
`load_tuned_file(...).pick(M)`), and every launch of ``fused_moe_kernel`` on both sides
is intercepted. Each pair must agree in the grid, every keyword (constexprs and launch
options) and everything of each positional argument that enters Triton's compile key
or the grid: integers by value, tensors by dtype and shape, TMA descriptors by block
shape, None as None. Only what a pointer points at may differ. Negative controls show
the comparison catches a wrong launch.
"""

import __future__

import ast
import contextlib
import functools
import inspect
import json
import random
import types
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import triton.language as tl
from stand_ins import KernelRecorder  # tests/ is on sys.path

from moetune.engines.launch import EngineGemm, sglang_0_5_23, twin_ref
from moetune.engines.sglang import file_name
from moetune.engines.tuned_file import load_tuned_file
from moetune.kernel.align import max_padded_slots
from moetune.kernel.fused_moe import fused_experts
from moetune.kernel.probe import Probe
from moetune.kernel.problem import make_problem

pytestmark = [pytest.mark.engines, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

DEVICE_NAME = "NVIDIA H200"
TRITON = "3.8.0"
TILE = {"BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 16, "num_warps": 4}


def compile_functions(path: Path, names: set[str], namespace: dict) -> None:
    """The module-level functions `names` of `path`, defined in `namespace`, decorators dropped."""
    tree = ast.parse(path.read_text())
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in nodes} == names, f"{path} lacks {names - {n.name for n in nodes}}"
    for node in nodes:
        node.decorator_list = []  # lru_cache, register_custom_op: plain functions here
    module = ast.Module(body=nodes, type_ignores=[])
    flags = __future__.annotations.compiler_flag
    exec(compile(module, str(path), "exec", flags=flags, dont_inherit=True), namespace)  # noqa: S102


class Log:
    def __getattr__(self, level):  # noqa: ANN001, ANN204
        return lambda *args, **kwargs: None


# The CUDA-only kernels SGLang calls around the GEMMs: outputs allocated as SGLang's
# allocate them (fp8_kernel.py, int8_kernel.py, per_token_group_quant.py), nothing computed.
def scaled_fp8_quant(x, scale=None, use_per_token_if_dynamic=False, **_):  # noqa: ANN001, ANN003, ANN201
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn)
    if scale is None:
        shape = (x.shape[0], 1) if use_per_token_if_dynamic else (1,)
        scale = torch.empty(shape, dtype=torch.float32)
    return out, scale


def per_token_group_quant_fp8(x, group_size, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201
    scale = torch.empty((*x.shape[:-1], x.shape[-1] // group_size), dtype=torch.float32)
    return torch.empty(x.shape, dtype=torch.float8_e4m3fn), scale


def per_token_group_quant(x, group_size=128, **kwargs):  # noqa: ANN001, ANN003, ANN201
    return per_token_group_quant_fp8(x, group_size)


def per_token_quant_int8(x, **_):  # noqa: ANN001, ANN003, ANN201
    return torch.empty(x.shape, dtype=torch.int8), torch.empty((*x.shape[:-1], 1))


def nothing(*args, **kwargs) -> None:  # noqa: ANN002, ANN003
    return None


class SGLang:
    """SGLang 0.5.23's production path from ``fused_experts`` to the kernel launches."""

    def __init__(self, installed, config_root: Path) -> None:  # noqa: ANN001
        self.capability = (9, 0)
        self.recorder = KernelRecorder()
        utils = Path(installed.lookup_source).parent
        kernels = Path(installed.kernel_source)
        capability = lambda: self.capability  # noqa: E731
        exec_ctx = types.SimpleNamespace(
            deterministic=types.SimpleNamespace(enable_deterministic_inference=False),
            moe=types.SimpleNamespace(enable_fused_moe_sum_all_reduce=False),
        )
        config = {
            "__file__": str(config_root / "fused_moe_triton_config.py"),
            "os": __import__("os"),
            "json": json,
            "triton": types.SimpleNamespace(__version__=TRITON),
            "logger": Log(),
            "get_device_name": lambda: DEVICE_NAME,
            "get_exec": lambda: exec_ctx,
            "_is_hip": False,
            "_use_low_smem_fp8_default": lambda: False,
            "torch": torch,
        }
        compile_functions(
            Path(installed.lookup_source),
            {
                "get_config_file_name",
                "get_moe_configs",
                "get_default_config",
                "try_get_optimal_moe_config",
                "get_config_dtype_str",
            },
            config,
        )
        import sys

        module = types.ModuleType("sglang.srt.layers.moe.moe_runner.triton_utils")
        module.get_config = lambda: None
        self.stubbed = {"sglang.srt.layers.moe.moe_runner.triton_utils": module}
        for name in ("sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.moe"):
            self.stubbed.setdefault(name, types.ModuleType(name))
        self.stubbed["sglang.srt.layers.moe.moe_runner"] = types.ModuleType("runner")
        self.sys = sys
        import triton
        import triton.language as tl
        from triton.tools.tensor_descriptor import TensorDescriptor

        kernel_ns = {
            "torch": torch,
            "triton": triton,
            "tl": tl,
            "functools": functools,
            "OrderedDict": OrderedDict,
            "TensorDescriptor": TensorDescriptor,
            "_support_tensor_descriptor": True,
            "_is_cuda": True,
            "_is_hip": False,
            "_use_aiter": False,
            "padding_size": 0,
            "is_batch_invariant_mode_enabled": lambda: False,
            "is_sm90_supported": lambda: capability()[0] == 9,
            "is_arch_support_pdl": lambda: capability()[0] >= 9,
            "scaled_fp8_quant": scaled_fp8_quant,
            "sglang_per_token_group_quant_fp8": per_token_group_quant_fp8,
            "per_token_group_quant_fp8": per_token_group_quant_fp8,
            "per_token_quant_int8": per_token_quant_int8,
            "fused_moe_kernel": self.recorder,
            "fused_moe_kernel_gptq_awq": self.recorder,
            "_TMA_ALLOCATOR_SET": True,
            "_B_DESC_CACHE": OrderedDict(),
            "_B_DESC_CACHE_MAX": 64,
        }
        compile_functions(
            kernels,
            {
                "support_tensor_descriptor",
                "should_enable_swap_ab",
                "_set_triton_tma_allocator",
                "_get_b_tma_desc_cached",
                "invoke_fused_moe_kernel",
            },
            kernel_ns,
        )
        self.kernel_ns = kernel_ns
        align_ns = {
            "torch": torch,
            "triton": triton,
            "_SGLANG_EXPERIMENTAL_LORA_OPTI": False,
            "_is_cuda": True,
            "SMALL_NUMEL_LIMIT": 1024,  # sglang/kernels/ops/moe/moe_align_small_numel.py
            "_CUDA_SMALL_BATCH_MAX_BUCKETS": 64,
            "moe_align_small_numel": nothing,
            "sgl_moe_align_block_size": nothing,
        }
        compile_functions(utils / "moe_align_block_size.py", {"moe_align_block_size"}, align_ns)
        parallel = types.SimpleNamespace(tp_group=None)
        self.ns = {
            "torch": torch,
            "tl": tl,
            "F": torch.nn.functional,
            "functools": functools,
            "logger": Log(),
            "padding_size": 0,
            "_use_aiter": False,
            "_is_cuda": True,
            "_is_hip": False,
            "_is_xpu": False,
            "_is_musa": False,
            "_has_vllm_ops": False,
            "get_config_dtype_str": config["get_config_dtype_str"],
            "try_get_optimal_moe_config": config["try_get_optimal_moe_config"],
            "support_tensor_descriptor": kernel_ns["support_tensor_descriptor"],
            "invoke_fused_moe_kernel": kernel_ns["invoke_fused_moe_kernel"],
            "moe_align_block_size": align_ns["moe_align_block_size"],
            "use_symmetric_memory": lambda *a, **k: contextlib.nullcontext(),
            "get_parallel": lambda: parallel,
            "is_allocation_symmetric": lambda: False,
            "get_exec": lambda: exec_ctx,
            "silu_and_mul": nothing,
            "per_token_group_quant": per_token_group_quant,
            "moe_sum_reduce": nothing,
            "moe_sum_reduce_triton": nothing,
            "moe_sum_reduce_torch_compile": nothing,
            "is_arch_support_pdl": lambda: capability()[0] >= 9,
            "is_batch_invariant_mode_enabled": lambda: False,
        }
        compile_functions(
            utils / "fused_moe.py",
            {
                "fused_experts",
                "inplace_fused_experts",
                "outplace_fused_experts",
                "fused_experts_impl",
                "_moe_support_tma",
                "_prepare_fused_moe_run",
                "_fused_moe_kernel_sequence",
                "_activation_row_filter",
                "_use_moe_sum_reduce_torch_compile",
                "moe_combine_topk",
            },
            self.ns,
        )

    def run(self, layer, monkeypatch) -> list:  # noqa: ANN001
        """SGLang's launches for `layer`, its config read from the folder `layer` wrote."""
        for name, module in self.stubbed.items():
            monkeypatch.setitem(self.sys.modules, name, module)
        p = layer.problem
        q = p.quant
        dtype = q.dtype if q is not None else None
        scales = [None, None]
        if q is not None:
            scales = [q.w1_scale, q.w2_scale]
            if q.per_channel:  # SGLang keeps per-channel weight scales as [E, N, 1]
                scales = [s.unsqueeze(-1) for s in scales]
        runner = types.SimpleNamespace(
            num_experts=p.w1.shape[0],
            num_local_experts=p.w1.shape[0],
            inplace=False,
            no_combine=False,
            activation="silu",
            is_gated=True,
            apply_router_weight_on_input=False,
            routed_scaling_factor=None,
            gemm1_alpha=None,
            gemm1_clamp_limit=None,
            swiglu_limit=None,
            gate_up_interleaved=True,
            no_combine_keep_router_weight=False,
        )
        self.recorder.launches.clear()
        self.ns["fused_experts"](
            layer.x,
            p.w1,
            p.w2,
            (layer.weights, layer.ids, None),
            runner,
            use_fp8_w8a8=dtype == "fp8_w8a8",
            use_int8_w8a8=dtype == "int8_w8a8",
            per_channel_quant=q is not None and q.per_channel,
            w1_scale=scales[0],
            w2_scale=scales[1],
            block_shape=None if q is None or q.block_shape is None else list(q.block_shape),
        )
        return list(self.recorder.launches)


def moetune_launches(layer, capability, pick=None) -> list:  # noqa: ANN001
    """moetune's launches for `layer` on SGLang's launch, its file read by `load_tuned_file`."""
    gemm = EngineGemm(twin_ref("sglang"))
    gemm.kernel, gemm.capability = KernelRecorder(), capability
    p = layer.problem
    if pick is None and layer.path is not None:
        pick = load_tuned_file(layer.path).pick(layer.x.shape[0])
    config = down = None
    if isinstance(pick, Probe):
        config, down = pick.up_config(), pick.down_config()
    elif pick is not None:
        config = pick.as_config()
    else:  # no file: SGLang's get_default_config
        from moetune.engines.sglang import default_config

        q = p.quant
        config = default_config(
            layer.x.shape[0],
            p.w1.shape[0],
            p.w2.shape[2],
            p.w1.shape[2],
            layer.ids.shape[1],
            None if q is None else q.dtype,
            None if q is None else q.block_shape,
        )
    fused_experts(
        layer.x,
        p.w1,
        p.w2,
        layer.weights,
        layer.ids,
        config=config,
        down_config=down,
        quant=p.quant,
        gemm=gemm,
    )
    return gemm.kernel.launches


def described(value):  # noqa: ANN001, ANN201
    """What of an argument reaches Triton's compile key or the grid (never the address)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if isinstance(value, TensorDescriptor):
        return ("descriptor", value.base.dtype, tuple(value.block_shape), tuple(value.shape))
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), tuple(value.stride()))
    return value


PARAMETERS = None


def differences(theirs: list, ours: list) -> list[str]:
    """Each way moetune's launches differ from SGLang's (empty: the same launches)."""
    global PARAMETERS
    if PARAMETERS is None:
        from moetune.kernel.fused_moe_kernel_sglang import fused_moe_kernel

        PARAMETERS = list(inspect.signature(fused_moe_kernel.fn).parameters)
    if len(theirs) != len(ours):
        return [f"{len(ours)} launches, SGLang makes {len(theirs)}"]
    found = []
    for gemm, (a, b) in zip(("up", "down"), zip(theirs, ours, strict=True), strict=True):
        if a.grid != b.grid:
            found.append(f"{gemm}: grid {b.grid} != SGLang's {a.grid}")
        for name, x, y in zip(PARAMETERS, a.args, b.args, strict=False):
            if described(x) != described(y):
                found.append(f"{gemm}: {name} {described(y)} != SGLang's {described(x)}")
        if len(a.args) != len(b.args):
            found.append(f"{gemm}: {len(b.args)} positional arguments, SGLang {len(a.args)}")
        for key in sorted(a.kwargs.keys() | b.kwargs.keys()):
            if a.kwargs.get(key, "absent") != b.kwargs.get(key, "absent"):
                found.append(
                    f"{gemm}: {key}={b.kwargs.get(key, 'absent')} != "
                    f"SGLang's {a.kwargs.get(key, 'absent')}"
                )
    return found


# dtype, block shape, per channel
DTYPES = [
    ("bf16", None, False),
    ("fp8_w8a8", (128, 128), False),
    ("fp8_w8a8", None, False),
    ("fp8_w8a8", None, True),
    ("int8_w8a8", None, True),
]
# Mixtral's experts and top-k (and the M 117-132 at 32, 189-196 at 16), a wide layer
LAYERS = [(8, 2), (64, 8)]


def row(block_m: int, **extra) -> dict:
    return {"BLOCK_SIZE_M": block_m, **TILE, "num_stages": 3, **extra}


# What the written files hold: None (no file), the up table, and the _down table.
FILES = {
    "none": (None, None),
    "up": ({"1": row(16), "128": row(32), "512": row(64)}, None),
    "up-tma": ({"1": row(16, USE_TMA=True), "128": row(32), "512": row(64, USE_TMA=True)}, None),
    "pair-tma": (
        {"1": row(16), "128": row(32), "512": row(64)},
        {"1": row(16, USE_TMA=True), "128": row(64, USE_TMA=True), "512": row(64)},
    ),
    "both-tma": (
        {"1": row(16, USE_TMA=True), "512": row(16)},
        {"1": row(32, USE_TMA=False), "512": row(16, USE_TMA=True)},
    ),
}


def cases(count: int, seed: int = 33) -> list:
    """`count` sampled layers of every dtype, layer and file kind at small M (moetune's side
    runs its alignment and activation kernels in Triton's interpreter), and every file kind
    at the issue's grid and early-trigger edges (Mixtral, bf16, M 117-132 at BLOCK_SIZE_M 32
    and 189-196 at 16: the written files' row at 128 is BLOCK_SIZE_M 32, at 512 64)."""
    every = [
        (dtype, E, top_k, kind, M, capability)
        for dtype in DTYPES
        for E, top_k in LAYERS
        for kind in FILES
        for M in ((1, 5, 16) if E == 8 else (1, 4))  # slots * BLOCK_SIZE_M rows under TMA
        for capability in ((9, 0), (8, 0))
    ]
    edges = [(DTYPES[0], 8, 2, kind, M, (9, 0)) for kind in FILES for M in (117, 132, 189, 196)]
    return random.Random(seed).sample(every, count) + edges


@functools.cache
def quantized_expert(dtype: tuple, N: int, K: int):  # noqa: ANN201
    """One expert's weights and scales as moetune quantizes them (the layout, not values)."""
    name, block, per_channel = dtype
    return make_problem(1, 1, N, K, 1, name, block, device="cpu", per_channel=per_channel)


def make_layer(dtype, E, top_k, kind, M, folder: Path, seed=0, tables=None):  # noqa: ANN001, ANN201
    """A layer of `E` experts (weights allocated, never read: the kernel is recorded) and
    the tuned files of `kind` written where both SGLang and moetune read them."""
    name, block, per_channel = dtype
    N, K = 128, 256
    one = quantized_expert(dtype, N, K)

    def experts(t):  # noqa: ANN001, ANN202
        return None if t is None else torch.empty((E, *t.shape[1:]), dtype=t.dtype)

    quant = one.quant
    if quant is not None:
        quant = replace(quant, w1_scale=experts(quant.w1_scale), w2_scale=experts(quant.w2_scale))
    problem = types.SimpleNamespace(w1=experts(one.w1), w2=experts(one.w2), quant=quant)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=generator).to(torch.bfloat16)
    logits = torch.randn(M, E, generator=generator)
    weights, ids = torch.softmax(logits, -1).topk(top_k)
    up, down = FILES[kind] if tables is None else tables
    path = None
    root = folder / "configs" / f"triton_{TRITON.replace('.', '_')}"
    root.mkdir(parents=True, exist_ok=True)
    for old in root.iterdir():
        old.unlink()
    file_dtype = None if name == "bf16" else name
    fname = file_name(
        E, N, DEVICE_NAME.replace(" ", "_"), file_dtype, block, per_channel=per_channel
    )
    if up is not None:
        path = root / fname
        path.write_text(json.dumps(up))
    if down is not None:
        (root / fname.replace(".json", "_down.json")).write_text(json.dumps(down))
    return types.SimpleNamespace(
        problem=problem, x=x, weights=weights, ids=ids.to(torch.int32), path=path
    )


@pytest.fixture
def sglang(sglang_installed, tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(tmp_path))
    return SGLang(sglang_installed, tmp_path)


@pytest.mark.parametrize("case", cases(20), ids=str)
def test_each_launch_is_sglangs(sglang, tmp_path, monkeypatch, case) -> None:  # noqa: ANN001
    dtype, E, top_k, kind, M, capability = case
    layer = make_layer(dtype, E, top_k, kind, M, tmp_path)
    sglang.capability = capability
    theirs = sglang.run(layer, monkeypatch)
    found = differences(theirs, moetune_launches(layer, capability))
    assert not found, "\n".join(found)


def shipped_pairs(installed) -> list[tuple[Path, Path]]:  # noqa: ANN001
    """SGLang's shipped up files with a ``_down`` twin beside them (not int4: another kernel)."""
    folder = Path(installed.lookup_source).parent / "configs"
    pairs = []
    for down in sorted(folder.glob("triton_*/*_down.json")):
        up = down.with_name(down.name.replace("_down.json", ".json"))
        if up.is_file() and "int4" not in down.name:
            pairs.append((up, down))
    return pairs


def test_sglangs_shipped_up_and_down_tables_launch_alike(
    sglang, sglang_installed, tmp_path, monkeypatch
) -> None:  # noqa: ANN001, E501
    # The shipped tables' rows (USE_TMA, BLOCK_SIZE_M overridden to the up row's) written
    # under this layer's name: every launch at a few batch sizes, as SGLang makes it.
    pairs = shipped_pairs(sglang_installed)
    assert len(pairs) >= 10
    for up, down in random.Random(5).sample(pairs, 3):
        tables = (json.loads(up.read_text()), json.loads(down.read_text()))
        for M in (1, 16, 117):
            layer = make_layer(DTYPES[0], 8, 2, None, M, tmp_path, tables=tables)
            found = differences(sglang.run(layer, monkeypatch), moetune_launches(layer, (9, 0)))
            assert not found, f"{down.name} at M {M}:\n" + "\n".join(found)


def test_a_wrong_grid_is_caught(sglang, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    # moetune's own alignment bound instead of SGLang's: one row block fewer at M = 117.
    layer = make_layer(DTYPES[0], 8, 2, "up", 117, tmp_path)
    theirs = sglang.run(layer, monkeypatch)
    assert differences(theirs, moetune_launches(layer, (9, 0))) == []
    monkeypatch.setattr(sglang_0_5_23, "align_slots", max_padded_slots)
    found = differences(theirs, moetune_launches(layer, (9, 0)))
    assert "up: grid (64,) != SGLang's (68,)" in found  # 16 row blocks of 32, not 17


def test_the_down_gemm_without_tma_is_caught(sglang, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    # issue 33's H: moetune timed an up-TMA file without _down with a plain down GEMM
    layer = make_layer(DTYPES[1], 8, 2, "up-tma", 1, tmp_path)
    theirs = sglang.run(layer, monkeypatch)
    pick = load_tuned_file(layer.path).pick(1)
    assert differences(theirs, moetune_launches(layer, (9, 0), pick)) == []
    wrong = Probe("pair", pick.candidate, True, pick.candidate, False)
    found = differences(theirs, moetune_launches(layer, (9, 0), wrong))
    assert any(line.startswith("up: c_sorted=False != SGLang's True") for line in found)
    assert any(line.startswith("down: a_desc None != SGLang's ('descriptor'") for line in found)


def test_the_early_trigger_is_caught(sglang, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    # issue 33's G: the sorted activation's rows counted as moetune's bound (M 117, BM 32)
    layer = make_layer(DTYPES[0], 8, 2, "pair-tma", 117, tmp_path)
    theirs = sglang.run(layer, monkeypatch)
    assert differences(theirs, moetune_launches(layer, (9, 0))) == []
    monkeypatch.setattr(sglang_0_5_23, "sorted_rows", max_padded_slots)
    found = differences(theirs, moetune_launches(layer, (9, 0)))
    assert "down: GDC_EARLY=True != SGLang's False" in found


def test_the_top_k_sum_is_compiled_from_sglangs_source(sglang_installed) -> None:  # noqa: ANN001
    from moetune.engines.launch import resolve_kernel

    ref = resolve_kernel("sglang", "sglang").kernel
    kernel = sglang_0_5_23.sum_kernel(ref)
    assert Path(inspect.getsourcefile(kernel.fn)) == Path(sglang_installed.kernel_source)
    assert list(inspect.signature(kernel.fn).parameters)[-2:] == ["NUM_STAGE", "USE_GDC"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind, M", [("up", 5), ("pair-tma", 16)])
def test_an_fp16_checkpoint_launches_as_sglang_launches_it(
    sglang, tmp_path, monkeypatch, dtype, kind, M
) -> None:  # noqa: ANN001
    # SGLang computes in fp16 for fp16 hidden states, w8a8 included (vLLM in bf16), and
    # stores into fp16 buffers: moetune's launch (sglang_0_5_23.COMPUTE) passes the same.
    layer = make_layer(dtype, 8, 2, kind, M, tmp_path)
    layer.x = layer.x.to(torch.float16)
    theirs = sglang.run(layer, monkeypatch)
    assert theirs and all(launch.kwargs["compute_type"] == tl.float16 for launch in theirs)
    assert [launch.args[5].dtype for launch in theirs] == [torch.float16] * len(theirs)  # c_ptr
    found = differences(theirs, moetune_launches(layer, (9, 0)))
    assert not found, "\n".join(found)
