"""Files in and out: inputs read only from regular files of a bounded size, and outputs
written so that a crash never leaves a half-written one behind, never through a symlink.
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


class InputFileError(MoetuneError, OSError):
    """A path given as an input file that is no regular file, or too large to be one.

    An `OSError` too (errno, strerror, filename), so that every reader's own
    ``except OSError`` turns it into its usual one-line ``cannot read ...`` error.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str, code: int = errno.EINVAL):
        super().__init__(code, reason, str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


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


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` atomically: a temp file in the same folder, fsync, rename.

    Readers see either the old file or the complete new one, never a torn write.
    """
    return _atomic_write(path, text, "w")


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """`atomic_write_text` for binary content (an image)."""
    return _atomic_write(path, data, "wb")


def _atomic_write(path: str | os.PathLike[str], content: str | bytes, mode: str) -> Path:
    target = Path(path)
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


def atomic_write_json(path: str | os.PathLike[str], data: Any, indent: int = 4) -> Path:
    """`atomic_write_text` of `json.dumps(data)` with a trailing newline."""
    return atomic_write_text(path, json.dumps(data, indent=indent) + "\n")
