"""Dotted paths into a config dict, the little language of moe_mappings.yaml.

A path names one value inside config.json:

    hidden_size                        a top-level field
    ffn_config.moe_top_k               a field of a nested object
    moe_topk[0]                        an element of a list; when the field is a plain
                                       scalar instead (the same value for every layer),
                                       the scalar itself
    thinker_config.text_config.x[-1]   any mix; negative indices count from the end
    /torch_dtype                       a leading "/" reads from the top of config.json
                                       even when the entry declares a text config

A path that does not resolve, or that resolves to null, yields `MISSING`;
`resolve(..., keep_null=True)` tells the two apart (None for a JSON null).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# One segment: a field name followed by any number of [index] suffixes.
_SEGMENT = r"[^.\[\]/\s]+(?:\[-?\d+\])*"
PATH_PATTERN = rf"^/?{_SEGMENT}(?:\.{_SEGMENT})*$"
_PATH_RE = re.compile(PATH_PATTERN)
_INDEX_RE = re.compile(r"\[(-?\d+)\]")


class _Missing:
    """The value of a path that does not resolve (distinct from a JSON null)."""

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()


@dataclass(frozen=True)
class Path:
    """A parsed path: `steps` are field names (str) and list indices (int)."""

    text: str
    steps: tuple[str | int, ...]
    from_root: bool = False

    def under(self, prefix: str) -> str:
        """The full dotted path when read below `prefix` (how it is shown to users)."""
        bare = self.text.lstrip("/")
        if self.from_root or not prefix:
            return bare
        return f"{prefix}.{bare}"


def is_valid_path(text: str) -> bool:
    return bool(_PATH_RE.match(text))


def parse_path(text: str) -> Path:
    """Parse `text`; raises ValueError naming the text when it is not a path."""
    if not isinstance(text, str) or not _PATH_RE.match(text):
        raise ValueError(
            f"{text!r} is not a dotted path (expected something like "
            "'text_config.num_experts' or 'moe_topk[0]')"
        )
    from_root = text.startswith("/")
    steps: list[str | int] = []
    for segment in text.lstrip("/").split("."):
        name, _, rest = segment.partition("[")
        steps.append(name)
        steps.extend(int(index) for index in _INDEX_RE.findall("[" + rest if rest else ""))
    return Path(text=text, steps=tuple(steps), from_root=from_root)


def resolve(data: Any, path: Path | str, *, keep_null: bool = False) -> Any:
    """The value `path` names in `data`, or `MISSING`.

    Indexing a scalar returns the scalar: checkpoints write per-layer fields
    (a per-layer `moe_topk`) either as a list or as one number for all layers.
    A null on the way is `MISSING` too, or None with `keep_null` (the config
    sets the field, to nothing).
    """
    parsed = parse_path(path) if isinstance(path, str) else path
    value = data
    for step in parsed.steps:
        if isinstance(step, str):
            if not isinstance(value, dict) or step not in value:
                return MISSING
            value = value[step]
        elif isinstance(value, list):
            if not -len(value) <= step < len(value):
                return MISSING
            value = value[step]
        elif isinstance(value, dict):
            return MISSING
        if value is None:
            return None if keep_null else MISSING
    return value


def resolve_object(data: Any, path: str) -> dict[str, Any] | None:
    """The object (dict) at `path` in `data`, or None when there is none."""
    value = resolve(data, path)
    return value if isinstance(value, dict) else None
