"""The backend table (moetune/data/backends.yaml) against the released selection code.

The engines cannot be imported here (no torch, no compiled parts), so their selection
functions are read as source: parsed, never run. Two kinds of checks:

- every row's `source` names a file of the installed release and a function or class
  defined in it (files outside scripts/fetch_engines.py's MEMBERS are checked where the
  folder holds them, and skipped where it does not);
- the facts the rows rest on: the priority lists' order and the moves made for Hopper,
  Blackwell, SWIGLUOAI, expert parallelism, as the release's code writes them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from moetune.engines.backends import load_table, release_to_follow

ORACLE = "model_executor/layers/fused_moe/oracle"
EXPERTS = "model_executor/layers/fused_moe/experts"


def _tree(root: Path, relative: str) -> ast.Module:
    path = root / relative
    if not path.is_file():
        pytest.skip(f"{path} is not in the fetched files (scripts/fetch_engines.py MEMBERS)")
    return ast.parse(path.read_text())


def _defined(tree: ast.Module, dotted: str) -> bool:
    nodes: list[ast.AST] = list(tree.body)
    for part in dotted.split("."):
        found = next(
            (
                node
                for node in nodes
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and node.name == part
            ),
            None,
        )
        if found is None:
            return False
        nodes = list(found.body)
    return True


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"no function {name}")


def _backend_list(function: ast.FunctionDef, target: str) -> list[str]:
    """The enum members of the first list assigned to `target` in `function`, in order."""
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if target in names:
                return [e.attr for e in node.value.elts if isinstance(e, ast.Attribute)]
    raise AssertionError(f"no list assigned to {target} in {function.name}")


def _moves(function: ast.FunctionDef, mover: str) -> list[tuple[str, str]]:
    """(condition text of the enclosing ifs, moved backend) of each `mover(list, X)` call."""
    found = []

    def visit(node: ast.AST, conditions: tuple[str, ...]) -> None:
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            for child in node.body:
                visit(child, (*conditions, test))
            for child in node.orelse:
                visit(child, (*conditions, f"not ({test})"))
            return
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == mover
            and isinstance(node.args[1], ast.Attribute)
        ):
            found.append((" and ".join(conditions), node.args[1].attr))
        for child in ast.iter_child_nodes(node):
            visit(child, conditions)

    for statement in function.body:
        visit(statement, ())
    return found


def _sources(engine: str, release: str) -> list[tuple[str, str | None]]:
    """(file, function or None) of every source cited in `release`'s table."""
    cited = set()
    for row in load_table().rows(engine, release):
        for part in row["source"].split(", "):
            path, _, name = part.partition("::")
            cited.add((path, name or None))
    return sorted(cited, key=lambda item: (item[0], item[1] or ""))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_table_answers_for_the_fetched_release(engine, vllm_installed, sglang_installed):
    installed = {"vllm": vllm_installed, "sglang": sglang_installed}[engine]
    release, why = release_to_follow(engine, installed.version)
    assert (release, why) == (installed.version, "installed"), (
        f"backends.yaml has no table for {installed.label}: read its selection code and add one"
    )


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_cited_source_is_in_the_release(engine, vllm_installed, sglang_installed):
    installed = {"vllm": vllm_installed, "sglang": sglang_installed}[engine]
    checked = 0
    for path, name in _sources(engine, installed.version):
        file = installed.root / path
        if not file.is_file():
            continue  # outside MEMBERS: see the module docstring
        if name is not None:
            assert _defined(ast.parse(file.read_text()), name), f"{file} defines no {name}"
        checked += 1
    if not checked:
        pytest.skip(f"none of {engine}'s cited files is in {installed.root} (MEMBERS)")


def test_vllm_fp8_block_on_hopper_prefers_triton_under_tp_and_flashinfer_cutlass_with_ep(
    vllm_installed,
):
    function = _function(_tree(vllm_installed.root, f"{ORACLE}/fp8.py"), "_get_priority_backends")
    order = _backend_list(function, "_AVAILABLE_BACKENDS")
    assert order.index("FLASHINFER_TRTLLM") < order.index("FLASHINFER_CUTLASS")
    assert order.index("FLASHINFER_CUTLASS") < order.index("DEEPGEMM") < order.index("TRITON")
    moves = _moves(function, "_move_to_front")
    hopper_block = [
        (cond, backend)
        for cond, backend in moves
        if "is_device_capability(90)" in cond and "kFp8Static128BlockSym" in cond
    ]
    assert any(
        backend == "FLASHINFER_CUTLASS" and "ep_size > 1" in cond and "not (" not in cond
        for cond, backend in hopper_block
    ), hopper_block
    assert any(
        backend == "TRITON" and "not (moe_config.moe_parallel_config.ep_size > 1)" in cond
        for cond, backend in hopper_block
    ), hopper_block


def test_vllm_unquantized_demotes_flashinfer_on_hopper_and_for_swigluoai(vllm_installed):
    tree = _tree(vllm_installed.root, f"{ORACLE}/unquantized.py")
    function = _function(tree, "_get_priority_backends")
    moves = _moves(function, "_move_to_back")
    for condition in ("is_device_capability_family(90)", "SWIGLUOAI"):
        demoted = {b for cond, b in moves if condition in cond}
        assert demoted >= {"FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS"}, (condition, moves)
    # The first list assigned is ROCm's; CUDA's has FlashInfer TRT-LLM, before Triton.
    lists = [
        [e.attr for e in node.value.elts if isinstance(e, ast.Attribute)]
        for node in ast.walk(function)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List)
    ]
    cuda = next(order for order in lists if "FLASHINFER_TRTLLM" in order)
    # TRT-LLM, then CUTLASS (where TRT-LLM rejects the layer), then Triton.
    assert cuda.index("FLASHINFER_TRTLLM") < cuda.index("FLASHINFER_CUTLASS")
    assert cuda.index("FLASHINFER_CUTLASS") < cuda.index("TRITON")


def test_vllm_flashinfer_bf16_takes_at_most_2048_experts(vllm_installed):
    source = (vllm_installed.root / EXPERTS / "trtllm_bf16_moe.py").read_text()
    assert "moe_config.num_experts <= 2048" in source


def test_vllm_wna16_runs_marlin_before_triton(vllm_installed):
    tree = _tree(vllm_installed.root, f"{ORACLE}/int_wna16.py")
    order = _backend_list(_function(tree, "_get_priority_backends"), "backends")
    assert order.index("FLASHINFER_TRTLLM") < order.index("MARLIN") < order.index("TRITON")
    mxint4 = (vllm_installed.root / EXPERTS / "trtllm_mxint4_moe.py").read_text()
    assert "is_device_capability_family(100)" in mxint4
    assert "(kInt4Static32, None)" in mxint4  # int4, group 32, no activation quantization


def test_vllm_int8_w8a8_has_only_triton_on_cuda(vllm_installed):
    function = _function(_tree(vllm_installed.root, f"{ORACLE}/int8.py"), "_get_priority_backends")
    listed = {
        e.attr
        for node in ast.walk(function)
        if isinstance(node, ast.List)
        for e in node.elts
        if isinstance(e, ast.Attribute)
    }
    assert "TRITON" in listed
    assert not {b for b in listed if b.startswith(("FLASHINFER", "DEEPGEMM", "MARLIN"))}


def test_vllm_fp4_experts_go_to_flashinfer_then_marlin(vllm_installed):
    tree = _tree(vllm_installed.root, f"{ORACLE}/mxfp4.py")
    order = _backend_list(_function(tree, "_get_priority_backends"), "_AVAILABLE_BACKENDS")
    assert order[0] == "FLASHINFER_TRTLLM_MXFP4_MXFP8"
    assert "TRITON" not in order and "MARLIN" in order
    assert _defined(tree, "select_deepseek_v4_mxfp4_moe_backend")


def test_sglang_override_rows_name_the_architectures_their_override_registers(sglang_installed):
    """Each SGLang row keyed on architectures cites a model override: the architectures
    are those it registers (`_register_for`)."""
    rows = load_table().rows("sglang", sglang_installed.version)
    for row in rows:
        if "architectures" not in row.get("when", {}):
            continue
        cited = row["source"].split("::")[0]
        assert cited.startswith("srt/arg_groups/model_overrides/"), row["source"]
        registered: set[str] = set()
        for node in ast.walk(_tree(sglang_installed.root, cited)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_register_for":
                registered.update(a.value for a in node.args if isinstance(a, ast.Constant))
        assert set(row["when"]["architectures"]) == registered, row["source"]


def test_vllm_renames_every_h200_as_moetune_does(vllm_installed):
    """The release's get_config_file_name maps each H200 variant to NVIDIA_H200, which
    moetune.engines.names.vllm_device_name follows; SGLang keeps torch's name."""
    from moetune.engines.names import sglang_device_name, vllm_device_name

    tree = _tree(vllm_installed.root, "model_executor/layers/fused_moe/fused_moe.py")
    source = ast.unparse(_function(tree, "get_config_file_name"))
    assert "if 'H200' in device_name.split('_'):" in source
    assert "device_name = 'NVIDIA_H200'" in source
    for torch_name in ("NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA H200 141GB HBM3e"):
        assert vllm_device_name(torch_name) == "NVIDIA_H200"
    assert sglang_device_name("NVIDIA H200 NVL") == "NVIDIA_H200_NVL"


def test_sglang_keeps_torch_s_name_with_spaces_to_underscores(sglang_installed):
    lookup = sglang_installed.lookup_source
    assert lookup is not None
    source = ast.unparse(_function(ast.parse(lookup.read_text()), "get_config_file_name"))
    assert "device_name = get_device_name().replace(' ', '_')" in source
    assert "H200" not in source
