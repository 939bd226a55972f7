"""The tune's summary kept beside its results: ``<save-dir>/summary.json``.

`moetune tune` prints a summary (per batch size: the written config's time,
each engine baseline's, the roofline floor) at the end of a run. The store
keeps every timing, but not which of them were the baselines, which file each
engine would have loaded, or the ceilings behind the floor; this file keeps
them, so that `moetune report` can show the summary again later, without a GPU.

One entry per tuned shape on one device and Triton version (the keys the store
uses): the latest finished run's, in the format of `moetune tune --json`
(`TuneSummary.to_json`), with the written files relative to the
save dir. A run of another shape into the same save dir adds its entry and
keeps the others. The file is rewritten atomically under a lock, never through a
symlink (`moetune.fileio.refuse_links_under`: the file and its lock are refused if linked).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from filelock import FileLock

from moetune import __version__
from moetune.errors import MoetuneError
from moetune.fileio import atomic_write_json, read_input_text, refuse_links_under

SUMMARY_FILENAME = "summary.json"
FORMAT = "moetune-tune-summary"
FORMAT_VERSION = 1

EntryKey = tuple[str, str, str]


class SummaryFileError(MoetuneError):
    """A summary.json that cannot be read (not JSON, or not moetune's format)."""


def entry_key(entry: dict[str, Any]) -> EntryKey:
    """(problem key, device name, Triton version) of one entry: what the store keys on."""
    plan = entry["plan"]
    return (plan["problem"], plan["device_name"], plan["triton_version"])


def summary_entry(summary: Any) -> dict[str, Any]:
    """One `moetune.tune.runner.TuneSummary` as an entry of the file."""
    request = summary.plan.request
    entry = summary.to_json()
    entry["files"] = [_relative(path, request.save_dir) for path in summary.files]
    entry["engines"] = list(request.engines)
    entry["source"] = request.source
    entry["moetune_version"] = __version__
    entry["finished_at"] = round(time.time(), 3)
    return entry


def _relative(path: Path, save_dir: Path) -> str:
    try:
        return str(Path(path).relative_to(save_dir))
    except ValueError:
        return str(path)


def read_summary_file(save_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of ``<save_dir>/summary.json``; [] when there is none.

    Raises `SummaryFileError` for a file that is not moetune's summary.
    """
    path = Path(save_dir) / SUMMARY_FILENAME
    try:
        text = read_input_text(path)
    except FileNotFoundError:
        return []
    except UnicodeDecodeError:
        raise SummaryFileError(f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise SummaryFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SummaryFileError(f"{path} is not valid JSON: {exc}") from None
    except (RecursionError, ValueError):  # nested too deeply, an over-long integer
        raise SummaryFileError(
            f"{path} is not valid JSON (nested too deeply or a huge number)"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SummaryFileError(f"{path} is not a moetune tune summary (no format {FORMAT!r})")
    if data.get("version") != FORMAT_VERSION:
        raise SummaryFileError(
            f"{path} has summary format version {data.get('version')!r}; "
            f"this moetune reads version {FORMAT_VERSION}"
        )
    shapes = data.get("shapes")
    if not isinstance(shapes, list):
        raise SummaryFileError(f"{path} has no list of shapes")
    for index, entry in enumerate(shapes):
        try:
            entry_key(entry)
        except (KeyError, TypeError):
            raise SummaryFileError(
                f"{path}: shape {index + 1} has no plan (problem, device_name, triton_version)"
            ) from None
    return shapes


def summary_paths(save_dir: Path) -> tuple[Path, Path]:
    """``<save_dir>/summary.json`` and the lock its writer takes."""
    path = Path(save_dir) / SUMMARY_FILENAME
    return path, path.with_name(f"{SUMMARY_FILENAME}.lock")


def record_summary(summary: Any) -> Path:
    """Add (or replace) this run's entry in ``<save_dir>/summary.json``; return its path.

    An existing file that cannot be read is kept aside as ``summary.json.unreadable-<time>``.
    A symlinked file or lock is refused (`moetune.fileio.LinkedPathError`, an OSError).
    """
    save_dir = Path(summary.plan.request.save_dir)
    path, lock = summary_paths(save_dir)
    entry = summary_entry(summary)
    for written in (path, lock):
        refuse_links_under(save_dir, written)
    save_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock)):
        refuse_links_under(save_dir, path)  # no link swapped in while waiting for the lock
        try:
            entries = read_summary_file(save_dir)
        except SummaryFileError:
            os.replace(path, path.with_name(f"{SUMMARY_FILENAME}.unreadable-{int(time.time())}"))
            entries = []
        key = entry_key(entry)
        entries = [old for old in entries if entry_key(old) != key] + [entry]
        document = {"format": FORMAT, "version": FORMAT_VERSION, "shapes": entries}
        return atomic_write_json(path, document, indent=2, within=save_dir)
