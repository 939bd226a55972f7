"""Where `moetune tune` keeps its results by default: ``./moetune-results/<model-slug>/``.

The slug names the model in a file-system-safe way: a Hugging Face id
``org/name`` becomes ``org__name`` (as the bundled catalog names its files), a
local model folder its folder name, a ``config.json`` path its folder's name.
Anything outside ``[A-Za-z0-9._-]`` becomes ``_``. Pure: no file is touched.
"""

from __future__ import annotations

import re
from pathlib import Path

RESULTS_ROOT = "moetune-results"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def model_slug(model: str) -> str:
    """A file-system-safe name for `model` (a Hub id or a local path)."""
    text = model.strip().rstrip("/\\")
    path = Path(text).expanduser()
    if path.exists() or text.startswith((".", "/", "~")) or text.endswith(".json"):
        if path.suffix == ".json":
            path = path.resolve().parent
        name = path.resolve().name
    else:
        name = "__".join(part for part in text.split("/") if part)
    slug = _UNSAFE.sub("_", name).strip("._") or "model"
    return slug[:120]


def default_save_dir(model: str, cwd: Path | None = None) -> Path:
    """``<cwd>/moetune-results/<model-slug>``, absolute."""
    return ((cwd or Path.cwd()) / RESULTS_ROOT / model_slug(model)).absolute()
