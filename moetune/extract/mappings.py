"""The registry of MoE architectures: moe_mappings.yaml, loaded, validated and matched.

Each entry of the YAML names the architectures (`architectures[0]`) and/or
`model_type` values it covers and, for each MoE parameter, one dotted path or
an ordered list of alternatives (see `moetune.extract.paths`). Every load is
validated against `schemas/moe_mappings.schema.json`; a problem is reported in
one line naming the file, the line, the entry and the field.

A user's file (`--mappings FILE` or `$MOETUNE_MAPPINGS`) is merged over the
built-in one (its entries come first; an entry with the same name replaces the
built-in one) or, with `replace=True`, used alone. The value rules (`parameters`,
see `moetune.extract.rules`) always come from the built-in file: a user's file
may repeat them but not change them.

A mappings file is a regular file of at most `MAPPINGS_FILE_LIMIT` bytes, plain
YAML without anchors or aliases (an alias can expand a small file into billions
of nodes), UTF-8 encoded.
"""

from __future__ import annotations

import dataclasses
import difflib
import gc
import json
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from moetune.errors import InvalidMappingsError, UnknownArchitectureError
from moetune.extract.paths import parse_path
from moetune.extract.rules import Rule, show, value_problem
from moetune.fileio import read_input_bytes

logger = logging.getLogger(__name__)

ENV_VAR = "MOETUNE_MAPPINGS"
REQUIRED_PARAMS = ("num_experts", "top_k", "intermediate_size", "hidden_size")
# The largest mappings file read: 400 times the built-in one (about 30,000 entries, validated
# in a few seconds); a larger one is refused at once.
MAPPINGS_FILE_LIMIT = 8 << 20
_DATA_DIR = Path(__file__).resolve().parent.parent / "data"


@dataclass(frozen=True)
class Default:
    """A literal value in a parameter's list of alternatives (`{default: 1}`)."""

    value: Any

    def __str__(self) -> str:
        return f"{{default: {self.value!r}}}"


Alternative = str | Default


@dataclass(frozen=True)
class MappingEntry:
    """One architecture family: what it matches and where its parameters live.

    `text_config` holds candidate paths of the object the text model's fields
    live in (the first that exists in the config wins; none: the top level);
    every path in `params` is read below it unless it starts with "/".
    """

    name: str
    params: dict[str, tuple[Alternative, ...]]
    architectures: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()
    text_config: tuple[str, ...] = ()
    description: str = ""
    notes: str = ""
    fallback: bool = False
    source_file: str = ""

    def to_yaml_dict(self) -> dict[str, Any]:
        """The entry as it would be written in moe_mappings.yaml."""
        data: dict[str, Any] = {"name": self.name}
        if self.description:
            data["description"] = self.description
        if self.architectures:
            data["architectures"] = list(self.architectures)
        if self.model_types:
            data["model_types"] = list(self.model_types)
        if self.text_config:
            data["text_config"] = list(self.text_config)
        if self.fallback:
            data["fallback"] = True
        data["params"] = {
            name: [{"default": alt.value} if isinstance(alt, Default) else alt for alt in alts]
            for name, alts in self.params.items()
        }
        if self.notes:
            data["notes"] = self.notes
        return data


@dataclass(frozen=True)
class Registry:
    """All entries in priority order (user entries first, the fallback last), and the value rules."""

    entries: tuple[MappingEntry, ...]
    source_files: tuple[str, ...] = ()
    rules: dict[str, Rule] = field(default_factory=lambda: builtin_rules())

    def names(self) -> list[str]:
        return [entry.name for entry in self.entries]

    @property
    def fallback(self) -> MappingEntry | None:
        return next((entry for entry in self.entries if entry.fallback), None)

    def match(self, config: dict[str, Any]) -> tuple[MappingEntry, bool]:
        """The entry for `config` and whether it is the generic guess.

        `architectures[0]` is tried against every entry first, then
        `model_type`; when neither matches, the fallback entry (guessed=True).
        """
        architecture, model_type = config_identity(config)
        specific = [entry for entry in self.entries if not entry.fallback]
        if architecture is not None:
            for entry in specific:
                if architecture in entry.architectures:
                    return entry, False
        if model_type is not None:
            for entry in specific:
                if model_type in entry.model_types:
                    return entry, False
        if self.fallback is not None:
            return self.fallback, True
        raise UnknownArchitectureError(unknown_architecture_message(self, config))


def config_identity(config: dict[str, Any]) -> tuple[str | None, str | None]:
    """(`architectures[0]`, `model_type`) of a config.json, None where absent."""
    architectures = config.get("architectures")
    architecture = None
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        architecture = architectures[0]
    elif isinstance(architectures, str):
        architecture = architectures
    model_type = config.get("model_type")
    return architecture, model_type if isinstance(model_type, str) and model_type else None


def unknown_architecture_message(
    registry: Registry,
    config: dict[str, Any],
    found: dict[str, str] | None = None,
    missing: list[str] | None = None,
) -> str:
    """One line: what is unknown, the close matches, and the entry to add.

    `found` maps the parameters the generic guess did resolve to their paths;
    they are filled into the suggested entry, the rest are left as <path>.
    """
    architecture, model_type = config_identity(config)
    what = " ".join(
        part
        for part in (
            f"architecture {architecture!r}" if architecture else "",
            f"model_type {model_type!r}" if model_type else "",
        )
        if part
    )
    message = f"unknown {what or 'architecture (config has no architectures or model_type)'}"
    named = bool(architecture or model_type)
    if named and missing and "num_experts" in missing and not _names_experts(config):
        # A dense model (a Llama) has no experts to tune: say so before suggesting an entry.
        entry = _suggested_entry(architecture, model_type, found)
        return (
            f"{message}: this config has no MoE fields (none of {', '.join(missing)}, nor "
            "any key with 'expert' or 'moe' in its name): it may be a dense model, which has no fused-MoE "
            "kernel to tune; if it is an MoE model, add a mapping (docs/mappings.md), an "
            f"entry in moe_mappings.yaml (or a --mappings file): {entry}"
        )
    if missing:
        message += f": the generic guess found no {', '.join(missing)}"
    known = sorted(
        {name for entry in registry.entries for name in entry.architectures + entry.model_types}
    )
    close = []
    for name in (architecture, model_type):
        if name:
            close += [c for c in difflib.get_close_matches(name, known, n=3) if c not in close]
    if close:
        message += f"; close matches: {', '.join(close)}"
    name = _entry_name(architecture, model_type)
    add = "add an entry to moe_mappings.yaml (or a --mappings file)"
    if not named:  # nothing an entry could match on
        add = f'add "model_type": "{name}" to the config, and an entry ' + add.removeprefix(
            "add an entry "
        )
    return f"{message}; {add}: {_suggested_entry(architecture, model_type, found)}"


def _entry_name(architecture: str | None, model_type: str | None) -> str:
    return re.sub(r"[^a-z0-9_.]", "_", (model_type or architecture or "").lower()) or "my_moe"


def _suggested_entry(
    architecture: str | None, model_type: str | None, found: dict[str, str] | None
) -> str:
    """The registry entry to add, as one line of YAML: the parameters the generic guess
    resolved (`found`) filled in, the others as <path>."""
    name = _entry_name(architecture, model_type)
    keys = [f"name: {name}"]
    if architecture:
        keys.append(f"architectures: [{_flow_scalar(architecture)}]")
    if model_type:
        keys.append(f"model_types: [{_flow_scalar(model_type)}]")
    if not (architecture or model_type):
        keys.append(f"model_types: [{name}]")
    params = ", ".join(f"{p}: {(found or {}).get(p, '<path>')}" for p in REQUIRED_PARAMS)
    return f"{{{', '.join(keys)}, params: {{{params}}}}}"


def _names_experts(config: Any) -> bool:
    """Whether any key of `config`, at any depth, is named like an MoE field (*expert*,
    *moe*): a config without one is likely a dense model's."""
    if isinstance(config, dict):
        return any(
            "expert" in str(key).lower() or "moe" in str(key).lower() or _names_experts(value)
            for key, value in config.items()
        )
    if isinstance(config, list):
        return any(_names_experts(item) for item in config)
    return False


def _flow_scalar(text: str) -> str:
    """`text` as a YAML flow scalar: plain when it is a simple name, else a quoted JSON string."""
    return text if re.fullmatch(r"[A-Za-z0-9_.-]+", text) else json.dumps(text)


def builtin_mappings_path() -> Path:
    """The moe_mappings.yaml shipped with moetune."""
    return _DATA_DIR / "moe_mappings.yaml"


def schema_path() -> Path:
    return _DATA_DIR / "schemas" / "moe_mappings.schema.json"


@lru_cache(maxsize=1)
def _validator() -> Any:
    from jsonschema import Draft202012Validator

    with open(schema_path()) as handle:
        return Draft202012Validator(json.load(handle))


def _schema_properties(definition: str | None = None) -> tuple[str, ...]:
    """The keys the schema knows at the top level or in one of its $defs."""
    schema = _validator().schema
    if definition is not None:
        schema = schema["$defs"][definition]
    return tuple(schema["properties"])


# ---------------------------------------------------------------------------
# Reading one file: YAML, schema, semantic checks. Each step returns problems
# as one-line strings; `load_mappings_file` raises the first, `validate_file`
# returns them all.


@dataclass(frozen=True)
class MappingsFile:
    path: str
    entries: tuple[MappingEntry, ...]
    common_params: dict[str, tuple[Alternative, ...]] = field(default_factory=dict)
    rules: dict[str, Rule] = field(default_factory=dict)


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _anchor_mark(text: str) -> Any:
    """The parser's mark (0-based line and column) of the first YAML anchor or alias in
    `text`, or None."""
    if "&" not in text and "*" not in text:  # an anchor needs a '&', an alias a '*'
        return None
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            return event.start_mark
    return None


class PlainYamlError(ValueError):
    """Why a text is not one plain YAML document: the `problem`, its 1-based `line` and
    `column` (or None), and whether it is an anchor or alias (`alias`)."""

    def __init__(
        self,
        problem: str,
        line: int | None = None,
        *,
        column: int | None = None,
        alias: bool = False,
    ) -> None:
        super().__init__(problem)
        self.problem = problem
        self.line = line
        self.column = column
        self.alias = alias

    @classmethod
    def at(cls, problem: str, mark: Any, *, alias: bool = False) -> PlainYamlError:
        """The error at a YAML parser's `mark` (0-based line and column), if there is one."""
        if mark is None:
            return cls(problem, alias=alias)
        return cls(problem, mark.line + 1, column=mark.column + 1, alias=alias)

    def place(self, path: Any) -> str:
        """Where in file `path` the problem is, as compilers and editors write it:
        ``path:line:column``, else ``path, line N``, else the path alone."""
        if self.line is None:
            return str(path)
        if self.column is None:
            return f"{path}, line {self.line}"
        return f"{path}:{self.line}:{self.column}"


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a document's many small objects are built: the
    collector's passes over them made a 200,000-entry file several times slower to read."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def parse_plain_yaml(text: str) -> tuple[Any, Any]:
    """(node tree, data) of a YAML document without anchors or aliases (an alias can expand
    a small file into billions of nodes); the node tree gives line numbers.

    libyaml (when PyYAML has it) bounds the nesting depth; any problem, a deep nesting
    included, is one `PlainYamlError`. Used for mappings files and --space files alike.
    """
    with _gc_paused():
        try:
            mark = _anchor_mark(text)
            if mark is not None:
                raise PlainYamlError.at(
                    "YAML anchors and aliases are not allowed", mark, alias=True
                )
            loader = _LOADER(text)
            try:
                node = loader.get_single_node()
                data = loader.construct_document(node) if node is not None else None
            finally:
                loader.dispose()
        except PlainYamlError:
            raise
        except yaml.MarkedYAMLError as exc:
            problem = " ".join(str(part) for part in (exc.context, exc.problem) if part)
            mark = exc.problem_mark or exc.context_mark
            raise PlainYamlError.at(f"malformed YAML ({problem})", mark) from None
        except yaml.YAMLError as exc:
            raise PlainYamlError(f"malformed YAML ({_first_line(str(exc))})") from None
        except RecursionError:
            raise PlainYamlError("malformed YAML (nested too deeply)") from None
        except ValueError as exc:  # a constructor's: an over-long integer, a bad date
            reason = _first_line(str(exc)).split(";")[0]
            raise PlainYamlError(f"malformed YAML (a value cannot be read: {reason})") from None
    return node, data


def _read(path: str) -> tuple[Any, Any, list[str]]:
    """(YAML node tree, data, problems) of a mappings file; the node tree gives line numbers."""

    def failed(problem: str) -> tuple[Any, Any, list[str]]:
        return None, None, [problem]

    try:
        raw = read_input_bytes(path, MAPPINGS_FILE_LIMIT)
    except OSError as exc:
        return failed(f"{path}: cannot read mappings file ({exc.strerror or exc})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return failed(
            f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
            "save the mappings file as UTF-8"
        )
    try:
        node, data = parse_plain_yaml(text)
    except PlainYamlError as exc:
        where = exc.place(path)
        if exc.alias:
            return failed(
                f"{where}: YAML anchors and aliases are not allowed in a mappings "
                "file (an alias can expand without bound); write the values out"
            )
        return failed(f"{where}: {exc.problem}")
    try:
        duplicates = _duplicate_keys(node)
    except RecursionError:
        return failed(f"{path}: malformed YAML (nested too deeply)")
    return node, data, [f"{path}, {problem}" for problem in duplicates]


def _duplicate_keys(node: Any) -> list[str]:
    """YAML silently keeps the last of two equal keys; a mappings file must not have any."""
    problems = []
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value in seen:
                problems.append(f"line {key.start_mark.line + 1}: duplicate key {key.value!r}")
            if isinstance(key, yaml.ScalarNode):
                seen.add(key.value)
            problems += _duplicate_keys(value)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            problems += _duplicate_keys(item)
    return problems


def _line_of(node: Any, location: list[Any]) -> int | None:
    """The 1-based line of the YAML node at `location` (keys and indices)."""
    for step in location:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == step), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int):
            node = node.value[step] if step < len(node.value) else None
        else:
            break
        if node is None:
            return None
    return node.start_mark.line + 1 if node is not None else None


def _where(path: str, line: int | None, data: Any, location: list[Any]) -> str:
    """'FILE, line N: entry NAME, field a.b' for a location in the document."""
    head = f"{path}, line {line}" if line else path
    details = []
    rest = list(location)
    if len(rest) >= 2 and rest[0] == "entries" and isinstance(rest[1], int):
        raw = data["entries"][rest[1]]
        name = raw.get("name") if isinstance(raw, dict) else None
        details.append(f"entry {name!r}" if isinstance(name, str) else f"entry #{rest[1] + 1}")
        rest = rest[2:]
    if rest:
        dotted = "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in rest)
        details.append(f"field {dotted.lstrip('.')!r}")
    return f"{head}: {', '.join(details)}" if details else head


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return f"an object with keys {', '.join(map(str, value)) or '(none)'}"
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _most_specific(error: Any) -> Any:
    """Descend from an anyOf failure into the list item that caused it, when there is one."""
    from jsonschema.exceptions import best_match

    while error.validator in ("anyOf", "oneOf"):
        deeper = [sub for sub in error.context or () if len(sub.path) > 0]
        if not deeper:
            break
        error = best_match(deeper)
    return error


@lru_cache(maxsize=1)
def _entry_validator() -> Any:
    """The schema's `entry` definition on its own, to validate one entry at a time."""
    from jsonschema import Draft202012Validator

    schema = _validator().schema
    return Draft202012Validator({"$defs": schema["$defs"], "$ref": "#/$defs/entry"})


@lru_cache(maxsize=1)
def _patterns() -> tuple[Any, Any]:
    """The schema's patterns of an entry name and of a path, as jsonschema applies them."""
    definitions = _validator().schema["$defs"]
    name = definitions["entry"]["properties"]["name"]["pattern"]
    return re.compile(name).search, re.compile(definitions["path"]["pattern"]).search


def _abstract(value: Any, kind: Any) -> Any:
    """`value` with each string replaced by `kind(string)`; keys and structure kept."""
    if isinstance(value, str):
        return kind(value)
    if isinstance(value, list):
        return [_abstract(item, kind) for item in value]
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise TypeError("a key that is not a string")
        return {key: _abstract(item, kind) for key, item in value.items()}
    return value


def _entry_shape(entry: Any) -> str | None:
    """What the schema can tell apart in an entry, as a string (None: not worked out).

    Two entries of the same shape are both valid or both not: a name that fits the name
    pattern, a non-empty architecture or model type, free text and a path that fits the
    path pattern each stand for their kind, and keys the schema leaves free are dropped.
    So a file of 200,000 entries of a few shapes is validated in a few schema calls.
    """
    if not isinstance(entry, dict):
        return None
    name_ok, path_ok = _patterns()
    shape: dict[str, Any] = {}
    try:
        for key, value in entry.items():
            if key == "name":
                shape[key] = "name" if isinstance(value, str) and name_ok(value) else value
            elif key in ("description", "notes"):
                shape[key] = "text" if isinstance(value, str) else value
            elif key in ("architectures", "model_types"):
                shape[key] = _abstract(value, lambda text: "name" if text else text)
            elif key in ("text_config", "params"):
                shape[key] = _abstract(value, lambda text: "path" if path_ok(text) else text)
            elif key == "fallback":
                shape[key] = value
            elif not isinstance(key, str):
                return None
        return json.dumps(shape, sort_keys=True, default=repr)
    except (TypeError, ValueError, RecursionError):
        return None


def _schema_errors(data: Any) -> Iterator[tuple[list[Any], Any]]:
    """Each schema error with the location its paths are relative to: the document's top
    level, then each entry, one entry of each shape only (`_entry_shape`)."""
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        yield from (([], error) for error in _validator().iter_errors(data))
        return
    yield from (([], error) for error in _validator().iter_errors({**data, "entries": []}))
    valid: set[str] = set()
    for index, entry in enumerate(entries):
        shape = _entry_shape(entry)
        if shape is not None and shape in valid:
            continue
        errors = list(_entry_validator().iter_errors(entry))
        if not errors and shape is not None:
            valid.add(shape)
        yield from ((["entries", index], error) for error in errors)


def _schema_problems(path: str, node: Any, data: Any) -> list[str]:
    """Schema violations as 'FILE, line N: entry X, field Y: expected ..., got ...', by line."""
    problems = []
    reported: set[tuple[Any, ...]] = set()  # missing fields already named
    for prefix, found in _schema_errors(data):
        error = _most_specific(found)
        location = [*prefix, *error.absolute_path]
        line = _line_of(node, location)
        if error.validator == "required":
            # jsonschema reports a `required` list once per missing name: name each once.
            absent = [name for name in error.validator_value if name not in error.instance]
            for name in absent:
                if (*location, name) not in reported:
                    reported.add((*location, name))
                    where = _where(path, line, data, [*location, name])
                    problems.append((line or 0, f"{where}: missing (required)"))
            continue
        else:
            expected = error.schema.get("description") if isinstance(error.schema, dict) else None
            if not location:
                expected = "a mapping with a list of 'entries'"
            elif error.validator == "const":
                expected = repr(error.validator_value)
            elif error.validator == "additionalProperties":
                expected = "only the key 'default'"
            message = (
                f"{_where(path, line, data, location)}: expected {expected or error.message}, "
                f"got {_short(error.instance)}"
            )
        problems.append((line or 0, message))
    return [message for _, message in sorted(problems, key=lambda problem: problem[0])]


def _as_tuple(value: Any) -> tuple[Any, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (value,)


def _alternatives(value: Any) -> tuple[Alternative, ...]:
    return tuple(
        Default(item["default"]) if isinstance(item, dict) else parse_path(item).text
        for item in _as_tuple(value)
    )


def _params(raw: dict[str, Any]) -> dict[str, tuple[Alternative, ...]]:
    return {name: _alternatives(paths) for name, paths in raw.items()}


def _warn_unknown(path: str, where: str, keys: Any, known: tuple[str, ...], what: str) -> None:
    for key in keys:
        if key not in known:
            logger.warning(
                "%s: %s: unknown %s %r ignored (known: %s)",
                path,
                where,
                what,
                key,
                ", ".join(known),
            )


def _is_builtin(path: str) -> bool:
    try:
        return Path(path).resolve() == builtin_mappings_path().resolve()
    except OSError:
        return False


def _rules(path: str, node: Any, data: dict[str, Any]) -> tuple[dict[str, Rule], list[str]]:
    """The value rules: the built-in file's own, else the built-in ones (a user's file may only
    repeat them)."""
    declared = data.get("parameters")
    if _is_builtin(path):
        rules = dict(declared or {})
        absent = [name for name in _schema_properties("params") if name not in rules]
        if absent:
            where = _where(path, _line_of(node, ["parameters"]), data, ["parameters"])
            return rules, [f"{where}: no value rule for {', '.join(absent)}"]
        return rules, []
    rules = builtin_rules()
    changed = [name for name, rule in (declared or {}).items() if rules.get(name) != rule]
    if not changed:
        return rules, []
    where = _where(
        path, _line_of(node, ["parameters", changed[0]]), data, ["parameters", changed[0]]
    )
    return rules, [
        f"{where}: the value rules are moetune's own and a mappings file cannot change them "
        "(a shape above a size bound takes --allow-huge-shape); remove 'parameters'"
    ]


def _literal_problems(
    path: str, node: Any, data: dict[str, Any], rules: dict[str, Rule]
) -> list[tuple[int, str]]:
    """Each `{default: ...}` literal that breaks its parameter's value rule (what extract refuses)."""
    blocks = [(["common_params"], data.get("common_params") or {})]
    blocks += [(["entries", i, "params"], raw["params"]) for i, raw in enumerate(data["entries"])]
    problems = []
    for prefix, params in blocks:
        for name, value in params.items():
            if name not in rules:
                continue
            listed = isinstance(value, list)
            for index, alternative in enumerate(value if listed else [value]):
                if not isinstance(alternative, dict):
                    continue
                problem = value_problem(rules[name], alternative["default"])
                if problem is None:
                    continue
                location = [*prefix, name, *([index] if listed else []), "default"]
                line = _line_of(node, location)
                where = _where(path, line, data, location)
                got = show(alternative["default"])
                problems.append((line or 0, f"{where}: expected {problem.expected}, got {got}"))
    return problems


def _parse(path: str, node: Any, data: dict[str, Any]) -> tuple[MappingsFile, list[str]]:
    """Entries from a schema-valid document, plus semantic problems."""
    entry_keys = _schema_properties("entry")
    param_names = _schema_properties("params")
    _warn_unknown(path, "top level", data, _schema_properties(), "key")
    _warn_unknown(path, "common_params", data.get("common_params") or {}, param_names, "parameter")
    rules, problems = _rules(path, node, data)
    problems += [message for _, message in sorted(_literal_problems(path, node, data, rules))]
    entries = []
    seen: set[str] = set()
    for raw in data["entries"]:
        name = raw["name"]
        _warn_unknown(path, f"entry {name!r}", raw, entry_keys, "key")
        _warn_unknown(path, f"entry {name!r}", raw["params"], param_names, "parameter")
        if name in seen:
            problems.append(f"{path}: entry {name!r}: duplicate entry name")
        seen.add(name)
        params = _params(raw["params"])
        entries.append(
            MappingEntry(
                name=name,
                params={key: params[key] for key in params if key in param_names},
                architectures=_as_tuple(raw.get("architectures")),
                model_types=_as_tuple(raw.get("model_types")),
                text_config=_as_tuple(raw.get("text_config")),
                description=raw.get("description", ""),
                notes=raw.get("notes", ""),
                fallback=bool(raw.get("fallback", False)),
                source_file=path,
            )
        )
    fallbacks = [entry.name for entry in entries if entry.fallback]
    if len(fallbacks) > 1:
        problems.append(f"{path}: more than one fallback entry ({', '.join(fallbacks)})")
    common = {
        key: paths
        for key, paths in _params(data.get("common_params") or {}).items()
        if key in param_names
    }
    mappings = MappingsFile(path=path, entries=tuple(entries), common_params=common, rules=rules)
    return mappings, problems


def _check(path: str) -> tuple[MappingsFile | None, list[str]]:
    with _gc_paused():
        return _check_file(path)


def _check_file(path: str) -> tuple[MappingsFile | None, list[str]]:
    node, data, problems = _read(path)
    if problems:
        return None, problems
    try:
        problems = _schema_problems(path, node, data)
        if problems:
            return None, problems
        return _parse(path, node, data)
    except RecursionError:
        return None, [f"{path}: nested too deeply to be a mappings file"]


@lru_cache(maxsize=1)
def _builtin_file() -> MappingsFile:
    """The built-in moe_mappings.yaml, read and validated once per process."""
    return load_mappings_file(builtin_mappings_path())


def builtin_rules() -> dict[str, Rule]:
    """The value rule of each parameter, from the built-in moe_mappings.yaml."""
    return _builtin_file().rules


def validate_file(path: str | os.PathLike[str]) -> list[str]:
    """Every problem in a mappings file, one line each; [] when it is valid."""
    return _check(str(path))[1]


def load_mappings_file(path: str | os.PathLike[str]) -> MappingsFile:
    """Read and validate one mappings file; raises InvalidMappingsError on the first problem."""
    mappings, problems = _check(str(path))
    if problems or mappings is None:
        raise InvalidMappingsError(problems[0])
    return mappings


def _with_common(entry: MappingEntry, common: dict[str, tuple[Alternative, ...]]) -> MappingEntry:
    return dataclasses.replace(entry, params={**common, **entry.params})


def load_registry(
    user_path: str | os.PathLike[str] | None = None, *, replace: bool = False
) -> Registry:
    """The built-in registry, with a user's mappings file merged over it or replacing it.

    `user_path` None means `$MOETUNE_MAPPINGS` when set. User entries take
    priority; a user entry named like a built-in one replaces it; user
    `common_params` override the built-in ones parameter by parameter.
    """
    if user_path is None:
        user_path = os.environ.get(ENV_VAR) or None
    files = []
    if not (replace and user_path is not None):
        files.append(_builtin_file())
    if user_path is not None:
        files.append(load_mappings_file(user_path))
    common: dict[str, tuple[Alternative, ...]] = {}
    entries: list[MappingEntry] = []
    for mappings in files:
        common.update(mappings.common_params)
        names = {entry.name for entry in mappings.entries}
        has_fallback = any(entry.fallback for entry in mappings.entries)
        kept = [e for e in entries if e.name not in names and not (has_fallback and e.fallback)]
        entries = list(mappings.entries) + kept
    entries.sort(key=lambda entry: entry.fallback)
    return Registry(
        entries=tuple(_with_common(entry, common) for entry in entries),
        source_files=tuple(mappings.path for mappings in files),
        rules=builtin_rules(),
    )
