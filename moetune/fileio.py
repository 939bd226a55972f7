"""Files in and out: inputs read only from regular files of a bounded size, and outputs
written so that a crash never leaves a half-written one behind, never through a symlink.

The symlink rule (`refuse_links_under`): below the folder a user named (a save dir, a
report folder), no folder or file moetune writes may be a symlink, since a write through
it would land wherever it points. The folder named may itself be a link: the user chose it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

from moetune.errors import MoetuneError

# The most a text input (config.json, a mappings file, a search space, a tuned config,
# summary.json) may hold: far above any real one, far below what would exhaust memory.
TEXT_INPUT_LIMIT = 64 << 20
# The folder a write must stay inside, symlinks refused (`refuse_links_under`); None: no check.
Within = str | os.PathLike[str] | None


class InputFileError(MoetuneError, OSError):
    """A path given as an input file that is no regular file, or too large to be one.

    An `OSError` too (errno, strerror, filename), so that every reader's own
    ``except OSError`` turns it into its usual one-line ``cannot read ...`` error.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str, code: int = errno.EINVAL):
        super().__init__(code, reason, str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


class LinkedPathError(MoetuneError, OSError):
    """A folder or file to be written, below the folder the user named, that is a symlink.

    An `OSError` too (errno ELOOP, as ``O_NOFOLLOW`` gives), so that a writer's own
    ``except OSError`` turns it into its usual one-line ``cannot write ...`` error.
    """

    def __init__(self, link: str | os.PathLike[str], *, folder: bool):
        try:
            points_to = os.readlink(link)
        except OSError:  # gone again since: say what it was
            points_to = "elsewhere"
        reason = (
            f"{link} is a symlink; moetune does not write through it (it would write to "
            f"{points_to}): remove it, or put a real {'folder' if folder else 'file'} in its "
            "place, and rerun"
        )
        super().__init__(errno.ELOOP, reason, str(link))

    def __str__(self) -> str:
        return str(self.strerror)


def refuse_links_under(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Refuse (`LinkedPathError`) to write `path` when it, or a folder between `root` and
    it, is a symlink; `root` itself (and what lies above it) may be one.

    What does not exist yet is fine: it will be created as a real folder or file. The
    check reads each component with ``lstat``, so call it just before the write (and once
    before a long run, so that it stops before the work rather than after).
    """
    base = Path(os.path.abspath(root))
    target = Path(os.path.abspath(path))
    try:
        parts = target.relative_to(base).parts
    except ValueError:
        raise ValueError(f"{path} is not under {root}") from None
    current = base
    for index, part in enumerate(parts):
        current = current / part
        try:
            info = os.lstat(current)
        except OSError:  # missing (nothing below it exists either) or unreadable: the write says
            return
        if stat.S_ISLNK(info.st_mode):
            raise LinkedPathError(current, folder=index < len(parts) - 1)


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _size(count: int) -> str:
    if count >= 1 << 20:
        return f"{count / (1 << 20):.1f} MiB".replace(".0 MiB", " MiB")
    return f"{count:,} bytes"


def open_input(path: str | os.PathLike[str], limit: int | None = TEXT_INPUT_LIMIT) -> BinaryIO:
    """Open an input file for binary reading, refusing all but a regular file of at most
    `limit` bytes (None: no bound) with `InputFileError`.

    A symlink to a regular file is followed. The file is opened without blocking, so a
    FIFO with no writer is refused at once instead of hanging; /dev/zero, a directory or
    a socket are refused before a byte is read.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputFileError(path, f"{_kind(info.st_mode)}, not a regular file")
        if limit is not None and info.st_size > limit:
            raise InputFileError(
                path,
                f"{_size(info.st_size)}, more than the {_size(limit)} such a file can be",
                errno.EFBIG,
            )
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input_bytes(path: str | os.PathLike[str], limit: int = TEXT_INPUT_LIMIT) -> bytes:
    """The bytes of the regular file at `path` (`open_input`), at most `limit` of them:
    a file that grows past the bound while read is refused too."""
    with open_input(path, limit) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise InputFileError(path, f"more than the {_size(limit)} such a file can be", errno.EFBIG)
    return data


def read_input_text(path: str | os.PathLike[str], limit: int = TEXT_INPUT_LIMIT) -> str:
    """`read_input_bytes` decoded as UTF-8 (`UnicodeDecodeError` when it is not)."""
    return read_input_bytes(path, limit).decode("utf-8")


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike[str], text: str, *, within: Within = None) -> Path:
    """Write `text` to `path` atomically: a temp file in the same folder, fsync, rename.

    Readers see either the old file or the complete new one, never a torn write. The
    rename replaces a symlink at `path` rather than writing through it; with `within`
    (the folder the user named), a symlink at `path` or at a folder between `within` and
    it is refused instead (`refuse_links_under`), before any folder is made.
    """
    return _atomic_write(path, text, "w", within)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, within: Within = None) -> Path:
    """`atomic_write_text` for binary content (an image)."""
    return _atomic_write(path, data, "wb", within)


def _atomic_write(
    path: str | os.PathLike[str], content: str | bytes, mode: str, within: Within
) -> Path:
    target = Path(path)
    if within is not None:
        refuse_links_under(within, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates 0600; give the file the mode a plain open() would (0666 - umask),
        # so a config written into an engine's shared config folder stays readable.
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


def atomic_write_json(
    path: str | os.PathLike[str], data: Any, indent: int = 4, *, within: Within = None
) -> Path:
    """`atomic_write_text` of `json.dumps(data)` with a trailing newline."""
    return atomic_write_text(path, json.dumps(data, indent=indent) + "\n", within=within)
