"""Compile an installed engine's ``@triton.jit`` functions from its own source file.

The engines' kernel modules import their whole package (vLLM's ``fused_moe.py``
pulls in ``vllm.envs``, compiled custom ops, the platform layer...), which a tuning
machine may not be able to import, and which would be slow where it can. The Triton
functions themselves need only ``triton`` and ``triton.language``. So the source file
is parsed, the requested ``@triton.jit`` functions and the jit functions they call
are picked out of it, and only those definitions are executed, compiled under the
file's own name and line numbers: Triton reads each function's source back from the
real file, so the kernel it compiles is byte for byte the engine's.

Nothing else of the module runs: no import, no module-level statement.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from pathlib import Path

from moetune.errors import MoetuneError


class EngineSourceError(MoetuneError):
    """The engine's source file is missing, unreadable, or lacks an expected function."""


@dataclass(frozen=True)
class JitFunctions:
    """The compiled functions of one source file, by name, and the file's digest."""

    path: Path
    digest: str
    functions: dict

    def __getitem__(self, name: str):  # noqa: ANN204 - a triton JITFunction
        return self.functions[name]


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return ast.unparse(target) in ("triton.jit", "jit")


def _jit_definitions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and any(map(_is_triton_jit, node.decorator_list))
    }


def _free_names(function: ast.FunctionDef) -> set[str]:
    return {
        node.id
        for node in ast.walk(function)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }


def _closure(definitions: dict[str, ast.FunctionDef], names: tuple[str, ...]) -> list[str]:
    """`names` and every jit function of the file they call, transitively, in file order."""
    wanted: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        todo += [used for used in _free_names(definitions[name]) if used in definitions]
    return [name for name in definitions if name in wanted]


def file_digest(path: Path) -> str:
    """The first 12 hex digits of the file's SHA-256: names the exact source timed."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def load_jit_functions(path: Path, names: tuple[str, ...]) -> JitFunctions:
    """Compile `names` (and the jit helpers they call) from the engine source at `path`.

    Raises `EngineSourceError` when the file cannot be read or parsed, or lacks one of
    `names` as a ``@triton.jit`` function.
    """
    import triton
    import triton.language as tl

    path = Path(path)
    definitions = _definitions_with(path, names)
    picked = [definitions[name] for name in _closure(definitions, names)]
    # Line numbers are kept, so each function's code object points at its real lines.
    module = ast.Module(body=picked, type_ignores=[])
    namespace: dict = {"triton": triton, "tl": tl, "__name__": f"moetune_engine_{path.stem}"}
    exec(compile(module, str(path), "exec"), namespace)  # noqa: S102 - the engine's own kernels
    return JitFunctions(
        path=path,
        digest=file_digest(path),
        functions={node.name: namespace[node.name] for node in picked},
    )


def has_jit_functions(path: Path, names: tuple[str, ...]) -> None:
    """Raise `EngineSourceError` unless `path` parses and defines `names` as ``@triton.jit``.

    Reads the file only (no triton import): the plan can say which kernel it will time.
    """
    _definitions_with(Path(path), names)


def _definitions_with(path: Path, names: tuple[str, ...]) -> dict[str, ast.FunctionDef]:
    """The file's ``@triton.jit`` definitions, after checking that `names` are among them."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError) as exc:
        raise EngineSourceError(f"cannot read the engine's kernel source {path}: {exc}") from None
    definitions = _jit_definitions(tree)
    missing = [name for name in names if name not in definitions]
    if missing:
        raise EngineSourceError(
            f"{path} has no @triton.jit {', '.join(missing)}: not the kernel file of a "
            "release moetune knows"
        )
    return definitions
