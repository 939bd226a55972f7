"""Know when the next vLLM or SGLang lands, and what in it moetune would have to read anew.

    python scripts/check_releases.py [--engine vllm] [--dest .engines/wheels]
    python scripts/check_releases.py --wheel OLD.whl --wheel NEW.whl

The first form asks the package registry (``pip index versions``, pip's own
machinery, so it needs the network: it is kept out of CI) for the newest release
of each engine. Each release newer than the newest moetune has read
(`moetune.engines.installed.RELEASES`) is downloaded ``--no-deps`` into
``--dest``, as is the nearest release moetune knows, and the two are compared.
The second form compares two wheels already on disk.

What is compared is what moetune reads of a release, found where the known
release's `Layout` puts it (and, where the file moved, where another known
layout does), by parsing, never importing:

- the kernel's interface: ``fused_moe_kernel``'s parameters in order, and which
  are ``tl.constexpr``;
- the launcher's config keys: the keys of ``config`` read (``config["K"]``,
  ``config.get``, ``config.pop``) in the function that launches
  ``fused_moe_kernel[grid](...)``, and whether it passes ``**config`` on;
- the lookup's function signatures: the module-level functions of the lookup
  file whose name holds ``config``;
- the shipped config folders: the files added and removed.

Exit status: 0 when every release on the registry is one moetune knows, or the
two wheels agree on all of the above; 1 when something differs (so a scheduled
job can tell); 2 for an error, in one ``error:`` line.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from moetune.engines.installed import ENGINES, RELEASES, Layout, version_key  # noqa: E402

KERNEL = "fused_moe_kernel"
SHOWN_FILES = 8  # config files named one by one; beyond this, counted


class CheckError(Exception):
    """A registry, a download or a wheel that cannot be read."""


@dataclass(frozen=True)
class Parameter:
    name: str
    constexpr: bool


@dataclass
class ReleaseView:
    """What moetune reads of one release, parsed from its wheel."""

    engine: str
    version: str
    kernel_file: str | None = None
    kernel: tuple[Parameter, ...] | None = None
    launcher: str | None = None
    launcher_keys: tuple[str, ...] = ()
    launcher_splats_config: bool = False
    lookup_file: str | None = None
    lookups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    configs_dir: str | None = None
    configs: frozenset[str] = frozenset()


# Reading a wheel ----------------------------------------------------------------------


def wheel_release(wheel: Path) -> tuple[str, str]:
    """(engine, version) from a wheel's file name: ``vllm-0.34.0-cp38-abi3-....whl``."""
    parts = wheel.name.split("-")
    if not wheel.name.endswith(".whl") or len(parts) < 3 or parts[0] not in ENGINES:
        raise CheckError(f"{wheel.name}: not a vllm or sglang wheel (ENGINE-VERSION-...whl)")
    return parts[0], parts[1]


def nearest_known(engine: str, version: str) -> str:
    """The newest release moetune has read that is not newer than `version` (else the oldest)."""
    known = sorted(RELEASES[engine], key=version_key)
    older = [v for v in known if version_key(v) <= version_key(version)]
    return older[-1] if older else known[0]


def layouts_to_try(engine: str, version: str) -> list[Layout]:
    """The nearest known release's layout first, then every other known layout."""
    first = RELEASES[engine][nearest_known(engine, version)]
    others = [layout for layout in RELEASES[engine].values() if layout != first]
    return [first, *dict.fromkeys(others)]


def read_view(wheel: Path) -> ReleaseView:
    engine, version = wheel_release(wheel)
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = set(archive.namelist())
            view = ReleaseView(engine, version)
            for layout in layouts_to_try(engine, version):
                kernel = f"{engine}/{layout.kernel_source}"
                lookup = f"{engine}/{layout.lookup_source}"
                if view.kernel_file is None and kernel in names:
                    view.kernel_file = layout.kernel_source
                    read_kernel(view, archive.read(kernel).decode())
                if view.lookup_file is None and lookup in names:
                    view.lookup_file = layout.lookup_source
                    view.lookups = lookup_signatures(archive.read(lookup).decode())
                configs = f"{engine}/{layout.configs}/"
                found = {n[len(configs) :] for n in names if n.startswith(configs)}
                found = {n for n in found if n.endswith(".json")}
                if view.configs_dir is None and found:
                    view.configs_dir, view.configs = layout.configs, frozenset(found)
    except (OSError, zipfile.BadZipFile) as exc:
        raise CheckError(f"{wheel}: cannot read the wheel ({exc})") from None
    except SyntaxError as exc:
        raise CheckError(f"{wheel}: {exc.filename or 'a file'} does not parse ({exc})") from None
    return view


def is_constexpr(annotation: ast.expr | None) -> bool:
    return annotation is not None and ast.unparse(annotation).endswith("constexpr")


def kernel_parameters(tree: ast.Module) -> tuple[Parameter, ...] | None:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == KERNEL:
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            return tuple(Parameter(a.arg, is_constexpr(a.annotation)) for a in args)
    return None


def launches_kernel(function: ast.FunctionDef) -> bool:
    """True when `function` holds a call ``fused_moe_kernel[...](...)``."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Subscript)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == KERNEL
        for node in ast.walk(function)
    )


def config_keys(function: ast.FunctionDef) -> tuple[tuple[str, ...], bool]:
    """The string keys `function` reads of ``config``, sorted; and whether it splats it."""
    keys, splat = set(), False
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "config"
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            keys.add(node.slice.value)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "config"
            and node.func.attr in ("get", "pop")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            keys.add(node.args[0].value)
        elif isinstance(node, ast.keyword) and node.arg is None:
            splat |= isinstance(node.value, ast.Name) and node.value.id == "config"
    return tuple(sorted(keys)), splat


def read_kernel(view: ReleaseView, source: str) -> None:
    tree = ast.parse(source)
    view.kernel = kernel_parameters(tree)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and launches_kernel(node):
            view.launcher = node.name
            view.launcher_keys, view.launcher_splats_config = config_keys(node)
            return


def parameter_texts(arguments: ast.arguments) -> tuple[str, ...]:
    """Each parameter as written: ``block_n: int | None = None``, ``*args``, ``**kwargs``."""
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults = [None] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
    pairs = [
        *zip(positional, defaults, strict=True),
        *zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True),
    ]
    texts = []
    for arg, default in pairs:
        text = ast.unparse(arg)
        texts.append(text if default is None else f"{text} = {ast.unparse(default)}")
    if arguments.vararg:
        texts.append(f"*{ast.unparse(arguments.vararg)}")
    if arguments.kwarg:
        texts.append(f"**{ast.unparse(arguments.kwarg)}")
    return tuple(texts)


def lookup_signatures(source: str) -> dict[str, tuple[str, ...]]:
    """{name: its parameters, then "-> returns"} of the module-level functions named *config*."""
    signatures = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and "config" in node.name:
            returns = (f"-> {ast.unparse(node.returns)}",) if node.returns else ()
            signatures[node.name] = (*parameter_texts(node.args), *returns)
    return signatures


# Comparing ----------------------------------------------------------------------------


def describe_parameters(old: tuple[Parameter, ...], new: tuple[Parameter, ...]) -> list[str]:
    lines = []
    old_names, new_names = [p.name for p in old], [p.name for p in new]
    added = [n for n in new_names if n not in old_names]
    removed = [n for n in old_names if n not in new_names]
    if added:
        where = []
        for name in added:
            at = new_names.index(name)
            kind = "constexpr " if new[at].constexpr else ""
            place = f"after {new_names[at - 1]}" if at else "first"
            where.append(f"{kind}{name} ({place})")
        lines.append(f"parameters added: {', '.join(where)}")
    if removed:
        lines.append(f"parameters removed: {', '.join(removed)}")
    kept_old = [n for n in old_names if n in new_names]
    kept_new = [n for n in new_names if n in old_names]
    if kept_old != kept_new:
        lines.append(f"parameters reordered: {', '.join(kept_new)}")
    old_const = {p.name for p in old if p.constexpr}
    new_const = {p.name for p in new if p.constexpr}
    became = [n for n in kept_new if n in new_const - old_const]
    ceased = [n for n in kept_new if n in old_const - new_const]
    if became:
        lines.append(f"now constexpr: {', '.join(became)}")
    if ceased:
        lines.append(f"no longer constexpr: {', '.join(ceased)}")
    if lines:
        lines.append(f"parameters: {len(old)} -> {len(new)}")
    return lines


def signature_text(name: str, parts: tuple[str, ...]) -> str:
    """``name(a, b = 1) -> int`` from `lookup_signatures`' parts."""
    params = [p for p in parts if not p.startswith("-> ")]
    returns = [p for p in parts if p.startswith("-> ")]
    return f"{name}({', '.join(params)})" + "".join(f" {r}" for r in returns)


def listed(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN_FILES])
    more = len(names) - SHOWN_FILES
    return shown + (f" and {more} more" if more > 0 else "")


def compare(old: ReleaseView, new: ReleaseView) -> list[str]:
    """What differs from `old` to `new` in the files moetune reads; [] when nothing does."""
    lines: list[str] = []
    if new.kernel_file != old.kernel_file:
        lines.append(f"kernel file: {old.kernel_file} -> {new.kernel_file}")
    if new.kernel is None:
        lines.append(f"kernel: no {KERNEL} found where any known layout puts it")
    elif old.kernel is not None:
        changes = describe_parameters(old.kernel, new.kernel)
        lines += [f"kernel {KERNEL}: {line}" for line in changes]
    if new.launcher != old.launcher:
        lines.append(f"launcher: {old.launcher} -> {new.launcher}")
    added = sorted(set(new.launcher_keys) - set(old.launcher_keys))
    removed = sorted(set(old.launcher_keys) - set(new.launcher_keys))
    if added:
        lines.append(f"launcher {new.launcher}: config keys added: {', '.join(added)}")
    if removed:
        lines.append(f"launcher {new.launcher}: config keys no longer read: {', '.join(removed)}")
    if new.launcher_splats_config != old.launcher_splats_config:
        now = "passes" if new.launcher_splats_config else "no longer passes"
        lines.append(f"launcher {new.launcher}: {now} **config on to the kernel")
    if new.lookup_file != old.lookup_file:
        lines.append(f"lookup file: {old.lookup_file} -> {new.lookup_file}")
    for name in sorted(set(old.lookups) | set(new.lookups)):
        before, after = old.lookups.get(name), new.lookups.get(name)
        if before == after:
            continue
        if before is None:
            lines.append(f"lookup {name}: new, {signature_text(name, after)}")
        elif after is None:
            lines.append(f"lookup {name}: gone")
        else:
            gained = [p for p in after if p not in before]
            lost = [p for p in before if p not in after]
            change = [f"+ {p}" for p in gained] + [f"- {p}" for p in lost]
            lines.append(f"lookup {name}: {'; '.join(change) or 'parameters reordered'}")
    if new.configs_dir != old.configs_dir:
        lines.append(f"configs folder: {old.configs_dir} -> {new.configs_dir or '(none found)'}")
    gained = sorted(new.configs - old.configs)
    lost = sorted(old.configs - new.configs)
    if gained or lost:
        lines.append(f"config files: {len(old.configs)} -> {len(new.configs)}")
    if gained:
        lines.append(f"config files added: {listed(gained)}")
    if lost:
        lines.append(f"config files removed: {listed(lost)}")
    return lines


def report(old: ReleaseView, new: ReleaseView) -> list[str]:
    head = f"{new.engine} {new.version} against {old.version}"
    changes = compare(old, new)
    if not changes:
        return [f"{head}: the same in every file moetune reads"]
    return [f"{head}:", *(f"  {line}" for line in changes)]


# The registry -------------------------------------------------------------------------


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False
    )


def last_line(result: subprocess.CompletedProcess) -> str:
    return (result.stderr.strip().splitlines() or ["no output"])[-1].strip()


def registry_versions(engine: str) -> list[str]:
    """`engine`'s releases on the registry, newest first (pip leaves out pre-releases)."""
    result = pip("index", "versions", engine)
    match = re.search(r"^Available versions: (.+)$", result.stdout, re.MULTILINE)
    if result.returncode != 0 or match is None:
        raise CheckError(f"pip index versions {engine} failed: {last_line(result)}")
    versions = [v.strip() for v in match[1].split(",") if v.strip()]
    return sorted(versions, key=version_key, reverse=True)


def download(engine: str, version: str, dest: Path) -> Path:
    hits = sorted(dest.glob(f"{engine}-{version}-*.whl"))
    if hits:
        return hits[0]
    dest.mkdir(parents=True, exist_ok=True)
    spec = f"{engine}=={version}"
    result = pip("download", "--no-deps", "--only-binary=:all:", "--dest", str(dest), spec)
    hits = sorted(dest.glob(f"{engine}-{version}-*.whl"))
    if result.returncode != 0 or not hits:
        raise CheckError(f"pip download {spec} failed: {last_line(result)}")
    return hits[0]


def check_registry(engines: list[str], dest: Path) -> tuple[list[str], bool]:
    """(lines, whether the registry holds a release moetune does not know)."""
    lines, unknown = [], False
    for engine in engines:
        newest_known = max(RELEASES[engine], key=version_key)
        versions = registry_versions(engine)
        newer = [v for v in versions if version_key(v) > version_key(newest_known)]
        lines.append(
            f"{engine}: newest on the registry {versions[0]}; newest moetune knows {newest_known}"
            + (f"; not known: {', '.join(reversed(newer))}" if newer else "")
        )
        if not newer:
            continue
        unknown = True
        base = nearest_known(engine, newer[0])
        old = read_view(download(engine, base, dest))
        for version in reversed(newer):
            lines += report(old, read_view(download(engine, version, dest)))
    return lines, unknown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--wheel",
        type=Path,
        action="append",
        default=[],
        help="compare two wheels on disk (give it twice: the older, then the newer)",
    )
    parser.add_argument(
        "--engine", choices=ENGINES, action="append", help="only this engine (repeatable)"
    )
    parser.add_argument(
        "--dest", type=Path, default=ROOT / ".engines" / "wheels", help="where wheels go"
    )
    args = parser.parse_args(argv)
    try:
        if args.wheel:
            if len(args.wheel) != 2:
                raise CheckError("--wheel takes two wheels, the older then the newer")
            old, new = (read_view(wheel) for wheel in args.wheel)
            if old.engine != new.engine:
                raise CheckError(f"{old.engine} against {new.engine}: compare one engine's wheels")
            lines = report(old, new)
            differs = not lines[0].endswith("the same in every file moetune reads")
        else:
            lines, differs = check_registry(args.engine or list(ENGINES), args.dest)
    except CheckError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
