"""vLLM's own code decides an fp16 checkpoint's w8a8 compute type; moetune launches the same.

From the site's vLLM release (0.33.0 or 0.34.0), cut out of the released files at test time
(nothing is copied into moetune):

- the compute type ``TritonExperts.apply`` picks (experts/triton_moe.py): its if-chain on
  ``hidden_states.dtype``, run on the activations as ``apply`` receives them (w8a8: already
  quantized to fp8/int8, which it maps to bf16);
- the dtype of the workspaces the GEMMs store into: ``workspace_dtype`` (modular_kernel.py,
  which ``TritonExperts`` does not override) of the unquantized hidden states' dtype
  (``_fused_experts(..., in_dtype=hidden_states.dtype)``);
- ``invoke_fused_moe_triton_kernel`` (fused_moe.py), with ``enable_swap_ab`` (utils.py), its
  kernel recorded; only the platform (compute capability 9.0 or 8.0, not CUDA: no TMA-B)
  and the TD switches are stubbed.

moetune's layer (`fused_experts` on the release's own launch module, `EngineGemm`) runs on an
fp16 or bf16 checkpoint's activations with fp8 or int8 w8a8 weights (and unquantized, as a
control); each of its two GEMM launches is handed to vLLM's launcher with vLLM's compute type,
and both launches must agree: grid, every keyword (``compute_type`` included), every integer
argument (strides, sizes) and every tensor's element type and memory. C's dtype must be vLLM's workspace dtype.
A negative control shows that the bf16-in / bf16-out launch moetune made before is caught.
"""

import ast
import os
import textwrap
import types
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from stand_ins import KernelRecorder  # tests/ is on sys.path

from moetune.engines.launch import EngineGemm, resolve_kernel
from moetune.engines.launch.common import GemmCall
from moetune.kernel.fused_moe import fused_experts
from moetune.kernel.problem import make_problem
from tests.engines_real.test_sglang_launch_real import Log, compile_functions, described

pytestmark = [pytest.mark.engines, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

GPU = os.environ.get("MOETUNE_GPU_TESTS") == "1"
# Interpreter tests build their tensors on the CPU; `make test-gpu` runs them on the GPU.
DEVICE = "cuda" if GPU else "cpu"
TILE = {"BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    owner = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(n for n in owner.body if isinstance(n, ast.FunctionDef) and n.name == name)


class VLLM:
    """The pieces of the installed vLLM that decide and make a GEMM launch."""

    def __init__(self, installed) -> None:  # noqa: ANN001
        fused_moe = Path(installed.kernel_source)
        folder = fused_moe.parent
        self.version = installed.version
        self.capability = (9, 0)
        # TritonExperts.apply's compute type: the if-chain on hidden_states.dtype.
        experts = ast.parse((folder / "experts" / "triton_moe.py").read_text())
        apply = _method(experts, "TritonExperts", "apply")
        chain = next(
            node
            for node in ast.walk(apply)
            if isinstance(node, ast.If)
            and ast.unparse(node.test) == "hidden_states.dtype == torch.bfloat16"
        )
        source = "def compute_type_of(hidden_states):\n"
        source += textwrap.indent(ast.unparse(chain), "    ") + "\n    return compute_type\n"
        namespace = {"torch": torch, "tl": tl}
        exec(compile(source, str(folder / "experts" / "triton_moe.py"), "exec"), namespace)  # noqa: S102
        self.compute_type_of = namespace["compute_type_of"]
        # The workspaces' dtype: the base class's workspace_dtype, not overridden by TritonExperts
        # (nor its LoRA mixin), of the unquantized hidden states' dtype.
        assert not any(
            isinstance(n, ast.FunctionDef) and n.name == "workspace_dtype"
            for n in ast.walk(experts)
        )
        mixin = folder / "experts" / "lora_experts_mixin.py"
        assert not mixin.is_file() or "def workspace_dtype" not in mixin.read_text()
        modular = ast.parse((folder / "modular_kernel.py").read_text())
        method = _method(modular, "FusedMoEExpertsModular", "workspace_dtype")
        namespace = {"torch": torch}
        method.decorator_list = []
        exec(compile(ast.Module([method], []), "modular_kernel.py", "exec"), namespace)  # noqa: S102
        self.workspace_dtype = lambda dtype: namespace["workspace_dtype"](None, dtype)
        passed = [
            ast.unparse(k.value)
            for n in ast.walk(modular)
            if isinstance(n, ast.Call)
            for k in n.keywords
            if k.arg == "in_dtype"
        ]
        assert passed == ["hidden_states.dtype"], passed
        # The launcher and its SWAP_AB rule.
        capability = lambda: self.capability  # noqa: E731
        platform = types.SimpleNamespace(
            is_cuda=torch.cuda.is_available,  # `make test-gpu`: the launches' tensors are CUDA
            is_device_capability=lambda c: capability()[0] * 10 + capability()[1] == c,
            is_device_capability_family=lambda c: capability()[0] * 10 == c,
        )
        utils_ns = {"current_platform": platform, "torch": torch}
        compile_functions(folder / "utils.py", {"enable_swap_ab"}, utils_ns)
        self.recorder = KernelRecorder()
        self.ns = {
            "torch": torch,
            "triton": triton,
            "tl": tl,
            "logger": Log(),
            "current_platform": platform,
            "enable_swap_ab": utils_ns["enable_swap_ab"],
            "warn_if_moe_use_td_ineffective": lambda *args, **kwargs: None,
            "resolve_moe_use_td": lambda: False,
            "set_triton_allocator": lambda device: None,
            "fused_moe_kernel": self.recorder,
        }
        compile_functions(fused_moe, {"invoke_fused_moe_triton_kernel"}, self.ns)

    def launch(self, call: GemmCall, compute_type, num_tokens: int):  # noqa: ANN001, ANN201
        """vLLM's launch of `call` (C as vLLM shapes it: [tokens, top_k, N])."""
        self.recorder.launches.clear()
        c = call.c if call.c.dim() == 3 else call.c.view(num_tokens, -1, call.c.shape[-1])
        self.ns["invoke_fused_moe_triton_kernel"](
            call.a,
            call.w,
            c,
            call.a_scale,
            call.w_scale,
            call.topk_weights,
            call.sorted_token_ids,
            call.expert_ids,
            call.num_tokens_post_padded,
            call.mul_routed_weight,
            call.top_k,
            dict(call.config),
            compute_type=compute_type,
            use_fp8_w8a8=call.quant_dtype == "fp8_w8a8",
            use_int8_w8a8=call.quant_dtype == "int8_w8a8",
            use_int8_w8a16=call.quant_dtype == "int8_w8a16",
            use_int4_w4a16=False,
            per_channel_quant=call.per_channel,
            block_shape=None if call.block_shape is None else list(call.block_shape),
        )
        return self.recorder.launches[0]


class Calls:
    """moetune's engine GEMM, its launches recorded and each call's arguments kept."""

    def __init__(self, capability) -> None:  # noqa: ANN001
        self.gemm = EngineGemm(resolve_kernel("vllm", "vllm").kernel)
        self.gemm.kernel, self.gemm.capability = KernelRecorder(), capability
        self.calls: list[GemmCall] = []

    def __getattr__(self, name):  # noqa: ANN001, ANN204
        return getattr(self.gemm, name)

    def __call__(self, a, w, c, **launch):  # noqa: ANN001, ANN003, ANN204
        self.calls.append(GemmCall(a, w, c, **launch))
        return self.gemm(a, w, c, **launch)


@pytest.fixture
def vllm(vllm_installed):  # noqa: ANN001, ANN201
    if vllm_installed is None:
        pytest.skip("no vLLM in this site")
    return VLLM(vllm_installed)


def pointer(value):  # noqa: ANN001, ANN201
    """What a launch passes for a tensor: its element type and memory (both launches get the
    same tensors; vLLM views C as [tokens, top_k, N] and passes its strides separately)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.data_ptr())
    return described(value)


def differences(theirs, ours) -> list[str]:  # noqa: ANN001
    """Each way moetune's launch differs from vLLM's (empty: the same launch)."""
    found = []
    if theirs.grid != ours.grid:
        found.append(f"grid {ours.grid} != vLLM's {theirs.grid}")
    if len(theirs.args) != len(ours.args):
        found.append(f"{len(ours.args)} positional arguments, vLLM {len(theirs.args)}")
    for i, (x, y) in enumerate(zip(theirs.args, ours.args, strict=False)):
        if pointer(x) != pointer(y):
            found.append(f"argument {i}: {pointer(y)} != vLLM's {pointer(x)}")
    for key in sorted(theirs.kwargs.keys() | ours.kwargs.keys()):
        if theirs.kwargs.get(key, "absent") != ours.kwargs.get(key, "absent"):
            found.append(
                f"{key}={ours.kwargs.get(key, 'absent')} != vLLM's {theirs.kwargs.get(key, 'absent')}"
            )
    return found


def moetune_layer(dtype, block_shape, per_channel, checkpoint, M, capability, bm=16):  # noqa: ANN001, ANN201
    """moetune's two GEMM calls and launches of one layer (E 8, top-k 2, N 128, K 256)."""
    E, N, K, top_k = 8, 128, 256, 2
    p = make_problem(
        M, E, N, K, top_k, dtype, block_shape, device=DEVICE, per_channel=per_channel,
        checkpoint_dtype=checkpoint,
    )  # fmt: skip
    if dtype in ("bf16", "fp16"):
        assert p.x.dtype == getattr(torch, checkpoint)
    ids = torch.stack([torch.randperm(E)[:top_k] for _ in range(M)]).to(torch.int32)
    weights = torch.rand(M, top_k)
    calls = Calls(capability)
    config = {"BLOCK_SIZE_M": bm, **TILE}
    fused_experts(p.x, p.w1, p.w2, weights, ids, config=config, quant=p.quant, gemm=calls)
    return p, calls


# (dtype, block shape, per channel): the w8a8 layouts, and unquantized as a control
LAYOUTS = [
    ("fp8_w8a8", None, False),
    ("fp8_w8a8", (128, 128), False),
    ("fp8_w8a8", None, True),
    ("int8_w8a8", None, True),
    ("unquantized", None, False),
]
LAYOUT_IDS = ["fp8-tensor", "fp8-block", "fp8-channel", "int8-channel", "unquantized"]


@pytest.mark.parametrize("checkpoint", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("M, capability", [(1, (9, 0)), (5, (9, 0)), (24, (8, 0))])
def test_each_launch_is_vllms_compute_type_and_buffers_included(
    vllm, layout, checkpoint, M, capability
):  # noqa: ANN001
    dtype, block_shape, per_channel = layout
    if dtype == "unquantized":
        dtype = "fp16" if checkpoint == "float16" else "bf16"
    vllm.capability = capability
    p, calls = moetune_layer(dtype, block_shape, per_channel, checkpoint, M, capability)
    up, down = calls.calls
    # What TritonExperts.apply receives as hidden_states: the up GEMM's A (w8a8: quantized).
    compute_type = vllm.compute_type_of(up.a)
    w8a8 = dtype in ("fp8_w8a8", "int8_w8a8")
    assert compute_type == (tl.bfloat16 if w8a8 else getattr(tl, checkpoint))
    buffers = vllm.workspace_dtype(p.x.dtype)
    assert buffers == p.x.dtype == getattr(torch, checkpoint)
    ours = calls.gemm.kernel.launches
    assert len(ours) == 2
    for name, call, launched in (("up", up, ours[0]), ("down", down, ours[1])):
        assert call.c.dtype == buffers, name
        theirs = vllm.launch(call, compute_type, M)
        found = differences(theirs, launched)
        assert not found, f"vLLM {vllm.version}, {name} GEMM:\n" + "\n".join(found)
        assert launched.kwargs["compute_type"] == compute_type


def test_the_launch_moetune_made_before_is_caught(vllm, monkeypatch):  # noqa: ANN001
    # Before: an fp16 checkpoint's fp8 GEMMs computed in the output's dtype (fp16).
    from moetune.engines.launch import vllm_0_33, vllm_0_34
    from moetune.kernel.launch_rules import ComputeRule

    def up_gemm() -> list[str]:
        _, calls = moetune_layer("fp8_w8a8", None, False, "float16", 5, (9, 0))
        up = calls.calls[0]
        theirs = vllm.launch(up, vllm.compute_type_of(up.a), 5)
        return differences(theirs, calls.gemm.kernel.launches[0])

    assert up_gemm() == []
    for module in (vllm_0_33, vllm_0_34):
        monkeypatch.setattr(module, "COMPUTE", ComputeRule())
    assert up_gemm() == ["compute_type=fp16 != vLLM's bf16"]


@pytest.mark.parametrize(
    "layout",
    [("fp8_w8a8", None, False), ("fp8_w8a8", (32, 32), False), ("fp8_w8a8", None, True),
     ("int8_w8a8", None, True)],
    ids=["fp8-tensor", "fp8-block", "fp8-channel", "int8-channel"],
)  # fmt: skip
def test_vllms_kernel_on_an_fp16_checkpoint_matches_the_reference(vllm, layout):  # noqa: ANN001
    # vLLM's own kernel (Triton's interpreter; compiled under MOETUNE_GPU_TESTS=1), launched
    # by its release module: fp16 out, rounded through bf16 as the reference rounds it.
    from moetune.kernel.fused_moe import fused_moe, gemm_compute_dtype
    from moetune.kernel.naive import naive_fused_moe
    from moetune.tune.measure.verify import compare

    dtype, block_shape, per_channel = layout
    p = make_problem(
        9, 8, 64, 64, 2, dtype, block_shape, device="cuda" if GPU else "cpu", seed=5,
        per_channel=per_channel, checkpoint_dtype="float16",
    )  # fmt: skip
    gemm = EngineGemm(resolve_kernel("vllm", "vllm").kernel)
    config = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
              "num_warps": 4, "num_stages": 2}  # fmt: skip
    args = (p.x, p.w1, p.w2, p.router_logits, 2)
    out = fused_moe(*args, config=config, quant=p.quant, gemm=gemm)
    assert out.dtype == torch.float16 and gemm_compute_dtype(p.x, p.quant, gemm) == torch.bfloat16
    ref = naive_fused_moe(*args, quant=p.quant, compute_dtype=torch.bfloat16)
    result = compare(out, ref, dtype)
    assert result.ok and result.rel_rms < 5e-3, result
