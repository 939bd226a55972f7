"""The interface a release's launch was written for, and the installed kernel's, read from source.

A release module launches the kernel it was written for: the parameters it passes
by position and by name, and the config keys its launcher reads from a tuned entry.
An installed release moetune has not read may have changed either (vLLM 0.34 added
two positional parameters to 0.33's ``fused_moe_kernel``): launched with the old list,
every candidate of a tune fails. So before an installed kernel is launched through a
known release's launch, its interface is read from the installed file (its AST only:
no import of the engine, no triton) and compared with the one the release module
declares (``INTERFACE``).

Parameters are written ``name``, ``name: constexpr`` or ``name: constexpr = default``
(the default as written in the source), in the kernel's order; `config_keys` are the
string keys the launcher function reads from its ``config`` argument (subscript,
``get``, ``pop``, ``setdefault``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from moetune.engines.source import EngineSourceError

CONFIG_ARGUMENT = "config"
CONFIG_METHODS = ("get", "pop", "setdefault")


@dataclass(frozen=True)
class KernelInterface:
    """A kernel's parameters in order, and the config keys its launcher reads."""

    kernel: str
    parameters: tuple[str, ...]
    launcher: str | None = None
    config_keys: frozenset[str] = frozenset()


def _parameter(arg: ast.arg, default: ast.expr | None) -> str:
    text = arg.arg
    if arg.annotation is not None and ast.unparse(arg.annotation).endswith("constexpr"):
        text += ": constexpr"
    if default is not None:
        text += f" = {ast.unparse(default)}"
    return text


def _parameters(function: ast.FunctionDef) -> tuple[str, ...]:
    args = function.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    named = [_parameter(a, d) for a, d in zip(positional, defaults, strict=True)]
    named += [_parameter(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    return tuple(named)


def _config_keys(function: ast.FunctionDef) -> frozenset[str]:
    keys = set()
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == CONFIG_ARGUMENT
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            keys.add(node.slice.value)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == CONFIG_ARGUMENT
            and node.func.attr in CONFIG_METHODS
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            keys.add(node.args[0].value)
    return frozenset(keys)


def read_interface(path: Path, kernel: str, launcher: str | None = None) -> KernelInterface:
    """The interface of `kernel` (and `launcher`'s config keys) in the source file at `path`.

    Raises `EngineSourceError` when the file cannot be parsed or lacks either function.
    """
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError) as exc:
        raise EngineSourceError(f"cannot read the engine's kernel source {path}: {exc}") from None
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    missing = [name for name in (kernel, launcher) if name and name not in functions]
    if missing:
        raise EngineSourceError(f"{path} has no {' or '.join(missing)}")
    return KernelInterface(
        kernel=kernel,
        parameters=_parameters(functions[kernel]),
        launcher=launcher,
        config_keys=_config_keys(functions[launcher]) if launcher else frozenset(),
    )


def _names(parameters: tuple[str, ...]) -> list[str]:
    return [parameter.split(":")[0].split("=")[0].strip() for parameter in parameters]


def interface_change(declared: KernelInterface, installed: KernelInterface) -> str | None:
    """What differs between the `declared` interface and the `installed` one, in a short
    phrase (the first differences), or None when they are the same."""
    changes = []
    ours, theirs = _names(declared.parameters), _names(installed.parameters)
    gained = [name for name in theirs if name not in ours]
    lost = [name for name in ours if name not in theirs]
    if gained:
        changes.append(f"{declared.kernel} gained {', '.join(gained)}")
    if lost:
        changes.append(f"{declared.kernel} lost {', '.join(lost)}")
    if not gained and not lost and ours != theirs:
        changes.append(f"{declared.kernel}'s parameters are in another order")
    if not changes and declared.parameters != installed.parameters:
        pairs = zip(declared.parameters, installed.parameters, strict=True)
        differ = [now for was, now in pairs if was != now]
        changes.append(f"{declared.kernel} declares {', '.join(differ)}")
    new_keys = sorted(installed.config_keys - declared.config_keys)
    old_keys = sorted(declared.config_keys - installed.config_keys)
    if new_keys:
        changes.append(f"{declared.launcher} reads config keys {', '.join(new_keys)}")
    if old_keys:
        changes.append(f"{declared.launcher} no longer reads {', '.join(old_keys)}")
    return "; ".join(changes) or None
