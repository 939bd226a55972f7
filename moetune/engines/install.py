"""Put tuned files where an engine reads them (`moetune tune --install`).

The target folder, per engine:

    vLLM    $VLLM_TUNED_CONFIG_FOLDER, else <vllm>/model_executor/layers/fused_moe/configs,
            else --install-dir (then: export VLLM_TUNED_CONFIG_FOLDER=<dir>)
    SGLang  <root>/configs/triton_X_Y_Z/ with root = $SGLANG_MOE_CONFIG_DIR, else the
            installed release's config root (0.5.11 on:
            <sglang>/srt/layers/moe/moe_runner/triton_utils), else --install-dir (then:
            export SGLANG_MOE_CONFIG_DIR=<dir>; SGLang reads only that root then)

The installed engine is found as `moetune check` finds it (`moetune.engines.installed`),
so both name the same folder. A variable set but empty is refused: the engine would
read its working folder.

`--install-dir` wins over both. Copies are atomic; a different file already
there is replaced only with `overwrite`, after a ``<file>.bak-<UTC time>`` copy
beside it; an identical one is left alone ("already installed").

A symlink where a file goes is refused, before tuning (`check_target_files`) and again
when copying: a dangling one would be replaced by the copy without a word, and one to a
real file would be turned into moetune's own file. The folder may be a link to a real
folder (the engine, or the user, chose it), but not a dangling one (`check_writable`).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from moetune.engines import sglang, vllm
from moetune.engines.formats import engine_format, engine_label
from moetune.errors import MoetuneError
from moetune.fileio import Within, atomic_write_text, refuse_links_under

ENV = {"vllm": vllm.FOLDER_ENV, "sglang": sglang.FOLDER_ENV}
# What the engine reads once the user runs `InstallTarget.export`.
EXPORT_EFFECTS = {
    "vllm": "vLLM reads it before its own configs",
    "sglang": "SGLang then reads only this folder, not its bundled configs",
}


class InstallError(MoetuneError):
    """No place to install to, or a different file is in the way."""


@dataclass(frozen=True)
class InstallTarget:
    """Where one engine's files go; `export` is the shell line the user needs, if any."""

    engine: str
    folder: Path
    source: str
    export: str | None = None

    @property
    def export_effect(self) -> str:
        """What the engine reads once `export` is run, for the line that prints it."""
        return EXPORT_EFFECTS[self.engine]


@dataclass(frozen=True)
class Installed:
    source: Path
    target: Path
    status: str  # "installed", "already installed", "replaced"
    backup: Path | None = None


def install_target(
    engine: str,
    triton_version: str,
    install_dir: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    package: Path | None | str = "find",
) -> InstallTarget:
    """The folder `engine` reads, chosen as the module docstring says; InstallError if none.

    `package` is the engine's package folder (vLLM: its configs/, SGLang: its config
    root); by default the installed engine's (`find_installed`), never imported.
    """
    env = os.environ if env is None else env
    var = ENV[engine]
    if install_dir is not None:
        _refuse_dangling_folder(engine, Path(install_dir).expanduser())  # resolve() hides it
        root = Path(install_dir).expanduser().resolve()
        current = env.get(var)
        export = None if current and Path(current).resolve() == root else f"export {var}={root}"
        source = "--install-dir"
    elif var in env and not env[var]:
        # Both engines read a set-but-empty variable as "" (their working folder).
        raise InstallError(
            f"--install {engine}: ${var} is set but empty, so {engine_label(engine)} reads tuned "
            "files from the folder it starts in; set it to a folder, unset it, or pass "
            "--install-dir DIR"
        )
    elif env.get(var):
        root, source, export = Path(env[var]), f"${var}", None
    else:
        source = f"the installed {engine} package"
        if package == "find":
            found = vllm.installed() if engine == "vllm" else sglang.installed()
            package = None
            if found is not None:
                package = found.configs_dir if engine == "vllm" else found.config_root
                source = f"the installed {found.label} package"
        if package is None:
            raise InstallError(
                f"--install {engine}: {engine_label(engine)} is not installed here and ${var} is "
                "not set; pass --install-dir DIR (moetune prints the export line to use)"
            )
        root, export = Path(package), None
    folder = root / engine_format(engine).folder(triton_version)
    return InstallTarget(engine, folder, source, export)


def dangling_link(path: Path) -> Path | None:
    """The symlink that leaves `path` unresolvable (`path` or a folder above it pointing
    where nothing is), or None."""
    for probe in (path, *path.parents):
        if probe.exists():
            return None  # it, and every folder above it, resolves
        if probe.is_symlink():
            return probe
    return None


def _refuse_dangling_folder(engine: str, folder: Path) -> None:
    link = dangling_link(folder)
    if link is not None:
        raise InstallError(
            f"--install {engine}: {link} is a dangling symlink (to {os.readlink(link)}); "
            "moetune does not replace it unasked: remove it, or point it at a folder, and rerun"
        )


def _refuse_linked_file(dest: Path) -> None:
    """Refuse a symlink where an installed file goes (see the module docstring)."""
    if not dest.is_symlink():
        return
    points_to = os.readlink(dest)
    if not dest.exists():
        raise InstallError(
            f"{dest} is a dangling symlink (to {points_to}); moetune does not "
            "replace it unasked: remove it, or point it at a file, and rerun"
        )
    raise InstallError(
        f"{dest} is a symlink (to {points_to}); moetune does not replace a link with its own "
        "file: remove it and rerun, or pass another --install-dir"
    )


def check_writable(target: InstallTarget) -> None:
    """Fail before tuning when the folder cannot be created or written, or is a dangling
    symlink (or lies below one)."""
    _refuse_dangling_folder(target.engine, target.folder)
    probe = target.folder
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise InstallError(
            f"--install {target.engine}: cannot write to {target.folder} ({target.source}); "
            "pass --install-dir DIR"
        )


def check_target_files(target: InstallTarget, names: Sequence[str]) -> None:
    """Fail before tuning when a file of `names` would be installed over a symlink."""
    for name in names:
        _refuse_linked_file(target.folder / name)


def install_files(
    target: InstallTarget,
    files: Sequence[Path],
    *,
    overwrite: bool = False,
    now: float | None = None,
) -> list[Installed]:
    """Copy `files` into `target.folder`, atomically, never clobbering a different file silently.

    Every conflict is checked before anything is copied, so a refusal leaves the
    folder as it was.
    """
    _refuse_dangling_folder(target.engine, target.folder)
    plan = []
    for source in files:
        dest = target.folder / Path(source).name
        _refuse_linked_file(dest)  # checked before tuning too; a link may appear meanwhile
        try:
            new = Path(source).read_text()
            old = existing_bytes(dest)
        except OSError as exc:
            raise InstallError(f"cannot install {dest}: {exc.strerror or exc}") from None
        if old is not None and old != new.encode() and not overwrite:
            raise InstallError(
                f"{dest} exists and differs from the tuned {Path(source).name}; "
                "rerun with --overwrite-installed to replace it (a backup is kept beside it)"
            )
        plan.append((Path(source), dest, new, old))
    stamp = backup_stamp(now)
    done = []
    for source, dest, new, old in plan:
        if old == new.encode():
            done.append(Installed(source, dest, "already installed"))
            continue
        try:
            backup = write_keeping_backup(dest, new, stamp)
        except OSError as exc:
            raise InstallError(f"cannot install {dest}: {exc.strerror or exc}") from None
        done.append(Installed(source, dest, "replaced" if old is not None else "installed", backup))
    return done


def backup_stamp(now: float | None = None) -> str:
    """The UTC time in a backup's name: ``20260102-030405``."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))


def existing_bytes(path: Path) -> bytes | None:
    """The bytes of the file at `path`; None when nothing is there (OSError when a folder is)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def keep_backup(path: Path, stamp: str) -> Path:
    """Keep the file at `path`, byte for byte, as ``<file>.bak-<stamp>`` beside it.

    A name already taken gets ``-2``, ``-3``...; an existing backup is never replaced.
    """
    base = path.with_name(f"{path.name}.bak-{stamp}")
    backup, number = base, 1
    while True:
        try:
            os.link(path, backup)  # atomic, and the old bytes stay as they were
            return backup
        except FileExistsError:
            number += 1
            backup = base.with_name(f"{base.name}-{number}")
        except OSError:  # a filesystem without hard links: copy, then rename into place
            if backup.exists():
                number += 1
                backup = base.with_name(f"{base.name}-{number}")
                continue
            partial = backup.with_name(f".{backup.name}.tmp")
            shutil.copy2(path, partial)
            os.replace(partial, backup)
            return backup


def write_keeping_backup(
    path: Path, text: str, stamp: str, *, within: Within = None
) -> Path | None:
    """Write `text` to `path` atomically; return the backup kept of a different old file.

    A different file already at `path` is first kept as its ``.bak-<stamp>``
    (`keep_backup`); an identical one is left untouched and nothing is written. With
    `within` (a save dir), a symlink at `path` or a folder between is refused first
    (`moetune.fileio.refuse_links_under`, a `LinkedPathError`).
    """
    if within is not None:
        refuse_links_under(within, path)
    old = existing_bytes(path)
    if old == text.encode():
        return None
    backup = keep_backup(path, stamp) if old is not None else None
    atomic_write_text(path, text, within=within)
    return backup


def engine_files(engine: str, main: Path, written: Sequence[Path] = ()) -> list[Path]:
    """The file for an engine plus, for one that reads a down table, its ``_down`` twin
    when the tuner wrote one; vLLM's (0.34 on one serving path) where this run wrote it
    (`written`: no earlier run's)."""
    if not engine_format(engine).reads_down_file:
        down = main.with_name(vllm.down_file_name(main.name))
        return [main, down] if engine == "vllm" and down in written else [main]
    down = main.with_name(sglang.down_name(main.name))
    return [main, down] if down.is_file() else [main]
