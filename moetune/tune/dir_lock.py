"""One tune at a time per save dir: a lock held for the whole run.

Two tunes writing one results store would each time every candidate while the
other loads the machine, and later resumes would reuse those timings. So a tune
takes ``<save-dir>/.moetune.lock`` before any work and holds it to the end; a
second one stops at once with a line naming the holder (host, pid, start time).

The lock is an ``flock`` on that file, which the kernel releases when its
holder dies, however it dies: a lock left by a killed run is simply taken
over. The file also records who holds it, for the message; it is removed when
the run ends. Where ``flock`` is unavailable (some network file systems), the
recorded holder decides: a live process on this host keeps the folder, a dead
one's lock is taken over. Taking the lock is also the check that the save dir
can be written, before the first measurement.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from moetune.errors import TuneError

LOCK_FILENAME = ".moetune.lock"
_BUSY = (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES)


class SaveDirBusy(TuneError):
    """Another run holds the save dir."""


class _Held(Exception):
    """The lock file is locked by someone else."""


@dataclass(frozen=True)
class Holder:
    """Who holds a save dir: read back from the lock file."""

    host: str
    pid: int
    started: float
    command: str = ""

    @classmethod
    def here(cls) -> Holder:
        return cls(socket.gethostname(), os.getpid(), time.time(), " ".join(sys.argv[1:3]))

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        try:
            data = json.loads(text)
            holder = cls(str(data["host"]), int(data["pid"]), float(data["started"]))
        except (ValueError, KeyError, TypeError):
            return None
        return holder if holder.pid > 0 else None

    def to_json(self) -> str:
        return json.dumps(
            {"host": self.host, "pid": self.pid, "started": self.started, "command": self.command}
        )

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"host {self.host}, pid {self.pid}, started {started}"

    def alive(self) -> bool:
        """Whether this holder may still run: another host's always may; here, its pid must."""
        if self.host != socket.gethostname():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


@contextlib.contextmanager
def save_dir_lock(save_dir: Path) -> Iterator[Path]:
    """Hold `save_dir` for the block (created if missing); `SaveDirBusy` if another run has it."""
    path = Path(save_dir) / LOCK_FILENAME
    fd = _acquire(Path(save_dir), path)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # still holding the lock: no one can have it meanwhile
        os.close(fd)


def _acquire(save_dir: Path, path: Path) -> int:
    try:
        save_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(save_dir, exc) from None
    while True:
        fd = _open(save_dir, path)
        try:
            locked = _flock(fd)
        except _Held:
            holder = Holder.parse(_read(fd))
            os.close(fd)
            raise _busy(save_dir, holder) from None
        if not locked:  # no flock here: the recorded holder decides
            holder = Holder.parse(_read(fd))
            if holder is not None and holder.pid != os.getpid() and holder.alive():
                os.close(fd)
                raise _busy(save_dir, holder, f" (if that run is gone, delete {path})")
        if _same_file(fd, path):
            break
        os.close(fd)  # its holder removed it between our open and our lock: try again
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, Holder.here().to_json().encode() + b"\n", 0)
    except OSError as exc:
        os.close(fd)
        raise _unwritable(save_dir, exc) from None
    return fd


def _open(save_dir: Path, path: Path) -> int:
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TuneError(f"{path} is a symlink; remove it and rerun") from None
        raise _unwritable(save_dir, exc) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TuneError(f"{path} is not a regular file; remove it and rerun")
    return fd


def _flock(fd: int) -> bool:
    """Lock `fd` without waiting: True if locked, False if the file system cannot flock."""
    try:
        import fcntl
    except ImportError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in _BUSY:
            raise _Held from None
        return False
    return True


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 4096, 0).decode("utf-8", "replace")
    except OSError:
        return ""


def _same_file(fd: int, path: Path) -> bool:
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _busy(save_dir: Path, holder: Holder | None, hint: str = "") -> SaveDirBusy:
    who = holder.describe() if holder is not None else "a process that is just starting"
    return SaveDirBusy(
        f"{save_dir} is in use by another moetune run ({who}); wait for it to finish, "
        f"or use another --save-dir{hint}"
    )


def _unwritable(save_dir: Path, exc: OSError) -> TuneError:
    reason = exc.strerror or str(exc)
    return TuneError(
        f"cannot write to the save dir {save_dir} ({reason}); pass a --save-dir you can write to"
    )
