"""Writing files so that a crash never leaves a half-written one behind."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


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
