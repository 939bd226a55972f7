"""A tuned-config table read and checked against ``schemas/tuned_config.schema.json``.

Every tuned file moetune reads (`benchmark --config` and its ``_down`` table, the
files `check` finds, the engines' files the baselines time) goes through
`read_table`, and every file `tune` writes through `check_table`. The rules are
the schema's: which keys are batch sizes, which keys an entry holds, each value's
type and range. This module reads the bytes, applies the rules, and turns the
first violation into one line naming the file, the key and what is wrong.

Readers take what the engine itself reads: an entry may leave out ``num_warps`` and
``num_stages`` (Triton's launch defaults apply, as in SGLang's ``triton_3_7_1`` files),
and a ``_down`` table is checked by the ``sglang`` rules (SGLang pops ``USE_TMA`` with
a default of false). What moetune writes is held to the ``*_written`` rules and
``sglang_down``: all six kernel keys, and ``USE_TMA`` on every down entry.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import best_match

from moetune.engines.formats import (
    DOWN_SUFFIX,
    ENGINE_FORMATS,
    VERSION_KEY,
    engine_format,
    format_of_table,
)
from moetune.errors import MoetuneError
from moetune.fileio import read_input_bytes

# The schema definitions of tables that open with the version key.
_VERSIONED = {
    definition
    for row in ENGINE_FORMATS.values()
    if row.version_key
    for definition in (row.read_schema, row.written_schema, row.tma_b_written_schema)
    if definition is not None
}
MAX_SHOWN = 160  # characters of an odd key or of a schema message an error line shows


class TunedConfigError(MoetuneError):
    """A tuned-config file that cannot be read, or is not a table the engine reads."""


@cache
def schema() -> dict[str, Any]:
    """The packaged ``tuned_config.schema.json`` (``moetune/data/schemas`` links to ``schemas/``)."""
    source = resources.files("moetune") / "data" / "schemas" / "tuned_config.schema.json"
    return json.loads(source.read_text())


def _is_integer(checker: Any, instance: Any) -> bool:
    # JSON Schema counts 64.0 as an integer; the engines splat values into a Triton launch,
    # where 64.0 is no tile size.
    return isinstance(instance, int) and not isinstance(instance, bool)


_StrictValidator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


@cache
def _validator(definition: str) -> Any:
    return _StrictValidator({"$defs": schema()["$defs"], "$ref": f"#/$defs/{definition}"})


@cache
def _batch_key() -> re.Pattern[str]:
    """The schema's batch-size key pattern, matched against the whole key."""
    (pattern,) = schema()["$defs"]["sglang"]["patternProperties"]
    return re.compile(pattern.removeprefix("^").removesuffix("$"), re.ASCII)


def _shown(text: str) -> str:
    """`text` fit for one line: control characters escaped, long text cut."""
    shown = json.dumps(text, ensure_ascii=False)
    if not shown.isprintable():
        shown = json.dumps(text)
    return shown if len(shown) <= MAX_SHOWN else shown[: MAX_SHOWN - 4] + '..."'


def _one_line(message: str) -> str:
    message = " ".join(message.split())
    return message if len(message) <= MAX_SHOWN else message[: MAX_SHOWN - 3] + "..."


def parse_json(data: bytes, label: str) -> Any:
    """The JSON in `data`, or `TunedConfigError` saying why it is not JSON."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TunedConfigError(
            f"{label}: cannot read a tuned config: not UTF-8 text "
            f"(byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TunedConfigError(
            f"{label}: cannot read a tuned config: not valid JSON ({exc})"
        ) from None
    except (ValueError, RecursionError) as exc:  # a number of over 4300 digits; deep nesting
        raise TunedConfigError(
            f"{label}: cannot read a tuned config: not JSON moetune can read ({_one_line(str(exc))})"
        ) from None


def definition_for(
    payload: Any, engine: str | None, *, down: bool, writing: bool = False, tma_b: bool = False
) -> str:
    """The schema definition a table is checked by (`moetune.engines.formats`); `tma_b`: one
    moetune writes for a release that reads the engine's own TMA-B switch (vLLM 0.34).

    `engine` None (a file given by name): vLLM's rules when it has a ``triton_version``
    key, else SGLang's (they accept every vLLM table without that key).
    """
    if engine is None:
        has_version = isinstance(payload, dict) and VERSION_KEY in payload
        row = format_of_table(version_key=has_version, down=down)
    else:
        row = engine_format(engine, TunedConfigError)
    definition = row.schema(down=down, writing=writing, tma_b=tma_b)
    if definition is None:
        raise TunedConfigError(f"{engine} reads no separate down-GEMM table")
    return definition


def check_table(payload: Any, definition: str, label: str) -> dict[int, dict[str, Any]]:
    """`payload` checked by the schema's `definition`: {batch size: entry}, in file order.

    Raises `TunedConfigError`, one line: ``<label>: batch size 64: config "num_stages":
    0 is less than the minimum of 1``, ``<label>: key "²" is not a batch size: ...``.
    """
    if not isinstance(payload, dict):
        raise TunedConfigError(
            f"{label}: not a tuned config: expected a JSON object keyed by batch size, "
            f"got {_json_type(payload)}"
        )
    batch_keys = []
    for key in payload:
        if key == VERSION_KEY:
            if definition not in _VERSIONED:
                raise TunedConfigError(
                    f'{label}: key "{VERSION_KEY}" is not allowed in an SGLang table '
                    "(SGLang reads every key as a batch size; its triton_X_Y_Z folder carries "
                    "the version)"
                )
            continue
        if not _batch_key().fullmatch(key):
            raise TunedConfigError(
                f"{label}: key {_shown(key)} is not a batch size: expected a positive whole "
                'number in ASCII digits, no leading zero, at most 9 digits (e.g. "64")'
            )
        batch_keys.append(key)
    if not batch_keys:
        raise TunedConfigError(f"{label}: not a tuned config: it holds no batch sizes")
    error = best_match(_validator(definition).iter_errors(payload))
    if error is not None:
        raise TunedConfigError(f"{label}: {_where(error.absolute_path)}{_one_line(error.message)}")
    return {int(key): payload[key] for key in batch_keys}


def check_entry(entry: dict[str, Any], label: str) -> None:
    """One entry checked by the schema's ``config`` rules; `TunedConfigError` naming `label`."""
    error = best_match(_validator("config").iter_errors(entry))
    if error is not None:
        fields = ".".join(_shown(str(part)) for part in error.absolute_path)
        raise TunedConfigError(
            f"{label}: {fields + ': ' if fields else ''}{_one_line(error.message)}"
        )


def _where(path: Any) -> str:
    """``batch size 64: config "num_stages": `` for an error at ``["64", "num_stages"]``."""
    parts = list(path)
    if not parts:
        return ""
    if parts[0] == VERSION_KEY:
        return f'key "{VERSION_KEY}": '
    where = f"batch size {parts[0]}: config"
    if len(parts) > 1:
        where += " " + ".".join(_shown(str(part)) for part in parts[1:])
    return where + ": "


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return "a number"


def read_table(
    path: str | Path, engine: str | None = None, *, down: bool | None = None
) -> dict[int, dict[str, Any]]:
    """The tuned file at `path` as {batch size: entry}, checked as `engine` reads it.

    `engine` None: by the file's own keys (`definition_for`); `down` None: from the
    file name (``_down.json``). Any problem is one `TunedConfigError` line naming `path`.
    """
    path = Path(path)
    try:
        data = read_input_bytes(path)
    except OSError as exc:
        raise TunedConfigError(
            f"{path}: cannot read a tuned config: {exc.strerror or exc}"
        ) from None
    payload = parse_json(data, str(path))
    down = path.name.endswith(DOWN_SUFFIX) if down is None else down
    return check_table(payload, definition_for(payload, engine, down=down), str(path))
