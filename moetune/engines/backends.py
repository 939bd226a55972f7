"""Which MoE backend an engine release runs for a checkpoint, and whether it reads tuned files.

The answers are data (`moetune/data/backends.yaml`, validated against
`schemas/backends.schema.json`), one table per engine release, each row read from
the release's own selection code and citing it. This module only evaluates them:

1. the GPU family of a device name (`gpu_family`: Hopper, Blackwell, or None);
2. the release to follow (`release_to_follow`: the installed one, else the newest in
   the table; a version the table lacks follows the newest one not newer than it);
3. the first row of that release's table that fits the `Deployment` (`choose`).

A `Deployment` is plain values: what moetune.extract reads from the checkpoint and the
layout. No torch, no engine imports: `moetune extract` and `check` use it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from moetune.engines.formats import engine_label
from moetune.errors import InvalidMappingsError

_DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def table_path() -> Path:
    return _DATA_DIR / "backends.yaml"


def schema_path() -> Path:
    return _DATA_DIR / "schemas" / "backends.schema.json"


@dataclass(frozen=True)
class Deployment:
    """A checkpoint's experts on one layout and GPU family, as the backend rows test it.

    `case` is one of the table's cases (unquantized, fp8_block, wna16...: the header of
    backends.yaml lists them); `num_experts` is the model's (global) count.
    """

    case: str
    family: str
    ep: bool = False
    architecture: str | None = None
    quant_method: str | None = None
    num_experts: int = 0
    bits: int | None = None
    group_size: int | None = None
    zero_point: bool | None = None
    desc_act: bool | None = None  # act-order (GPTQ desc_act, compressed-tensors actorder)


@dataclass(frozen=True)
class BackendChoice:
    """The backend one engine release runs for a `Deployment`, and where that was read."""

    engine: str
    release: str
    release_source: str  # "installed", "installed X.Y.Z follows ..." or "not installed: ..."
    family: str
    family_label: str
    case: str
    backend: str
    label: str
    reads_files: bool
    source: str  # file::function in the engine's package the row was read from
    reason: str | None = None  # what in `source` decides it
    note: str | None = None

    @property
    def citation(self) -> str:
        """``oracle/fp8.py::_get_priority_backends: TRITON first for block fp8 under TP``"""
        return f"{self.source}: {self.reason}" if self.reason else self.source

    def summary(self) -> str:
        """``vLLM 0.34.0 on Blackwell (sm100 family): FlashInfer TRT-LLM, reads no tuned file``"""
        reads = "reads the tuned Triton files" if self.reads_files else "reads no tuned file"
        return (
            f"{engine_label(self.engine)} {self.release} on {self.family_label}: "
            f"{self.label}, {reads}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "release": self.release,
            "release_source": self.release_source,
            "gpu_family": self.family,
            "case": self.case,
            "backend": self.backend,
            "backend_label": self.label,
            "reads_tuned_files": self.reads_files,
            "source": self.source,
            "reason": self.reason,
            "note": self.note,
        }


@dataclass(frozen=True)
class BackendTable:
    data: dict[str, Any]

    @property
    def families(self) -> dict[str, Any]:
        return self.data["families"]

    @property
    def backends(self) -> dict[str, Any]:
        return self.data["backends"]

    def releases(self, engine: str) -> dict[str, str]:
        return self.data["releases"][engine]

    def rows(self, engine: str, release: str) -> list[dict[str, Any]]:
        return self.data["tables"][self.releases(engine)[release]]


def _names(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


@lru_cache(maxsize=4)
def load_table(path: str | None = None) -> BackendTable:
    """The backend table, schema-checked and its names cross-checked; one line per problem."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    source = Path(path) if path else table_path()
    try:
        data = yaml.safe_load(source.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidMappingsError(f"{source}: cannot read the backend table: {exc}") from exc
    with open(schema_path()) as handle:
        validator = Draft202012Validator(json.load(handle))
    error = best_match(validator.iter_errors(data))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "top level"
        raise InvalidMappingsError(f"{source}: {where}: {error.message}")
    for engine, releases in data["releases"].items():
        for release, table in releases.items():
            if table not in data["tables"]:
                raise InvalidMappingsError(
                    f"{source}: {engine} {release}: no table named {table!r}"
                )
    for name, rows in data["tables"].items():
        for number, row in enumerate(rows):
            where = f"{source}: table {name} row {number + 1}"
            if row["backend"] not in data["backends"]:
                raise InvalidMappingsError(f"{where}: unknown backend {row['backend']!r}")
            for family in _names(row["family"]):
                if family not in data["families"]:
                    raise InvalidMappingsError(f"{where}: unknown family {family!r}")
    return BackendTable(data)


def gpu_family(device_name: str, table: BackendTable | None = None) -> str | None:
    """The table's family of a torch device name (``NVIDIA B200`` -> ``blackwell``), or None.

    A family's device must be a whole word of the name (spaces, ``_`` and ``-`` split it),
    so ``GB200`` is not read as ``B200`` nor ``GH200`` as ``H200``; where two families
    match, the longer device wins.
    """
    table = table or load_table()
    words = device_name.replace("_", " ").replace("-", " ").upper().split()
    best: tuple[int, str] | None = None
    for family, spec in table.families.items():
        for device in spec["devices"]:
            if device.upper() in words and (best is None or len(device) > best[0]):
                best = (len(device), family)
    return best[1] if best else None


def release_to_follow(
    engine: str, installed_version: str | None = None, table: BackendTable | None = None
) -> tuple[str, str]:
    """The table release to answer for, and why: the installed version, else the newest.

    A version the table lacks follows the newest release not newer than it; one older than
    every release follows the oldest, and the reason says so.
    """
    from moetune.engines.installed import version_key

    table = table or load_table()
    known = sorted(table.releases(engine), key=version_key)
    if installed_version is None:
        return known[-1], "not installed: the newest release moetune has read"
    if installed_version in known:
        return installed_version, "installed"
    key = version_key(installed_version)
    older = [v for v in known if version_key(v) <= key]
    if older:
        return older[-1], f"installed {installed_version} follows {older[-1]}"
    return known[0], f"installed {installed_version} is older than the table; follows {known[0]}"


def installed_version(engine: str) -> str | None:
    """The installed engine's version (found without importing it), or None."""
    from moetune.engines.installed import find_installed

    found = find_installed(engine)
    return None if found is None else found.version


def _fits(when: dict[str, Any], deployment: Deployment) -> bool:
    if "ep" in when and when["ep"] != deployment.ep:
        return False
    if "architectures" in when and deployment.architecture not in when["architectures"]:
        return False
    if "quant_methods" in when and deployment.quant_method not in when["quant_methods"]:
        return False
    if "experts_over" in when and not deployment.num_experts > when["experts_over"]:
        return False
    for key in ("bits", "group_size", "zero_point"):
        if key in when and getattr(deployment, key) != when[key]:
            return False
    if "group_sizes" in when and deployment.group_size not in when["group_sizes"]:
        return False
    if "desc_act" in when and bool(deployment.desc_act) != when["desc_act"]:
        return False
    return True


def choose(
    engine: str,
    deployment: Deployment,
    release: str | None = None,
    release_source: str | None = None,
    table: BackendTable | None = None,
) -> BackendChoice | None:
    """The backend `engine` runs for `deployment`, or None where the table has no row
    (a GPU family or case it does not cover)."""
    table = table or load_table()
    if release is None:
        release, release_source = release_to_follow(engine, installed_version(engine), table)
    for row in table.rows(engine, release):
        if deployment.case not in _names(row["case"]):
            continue
        if deployment.family not in _names(row["family"]):
            continue
        if not _fits(row.get("when", {}), deployment):
            continue
        backend = table.backends[row["backend"]]
        return BackendChoice(
            engine=engine,
            release=release,
            release_source=release_source or "",
            family=deployment.family,
            family_label=table.families[deployment.family]["label"],
            case=deployment.case,
            backend=row["backend"],
            label=backend["label"],
            reads_files=backend["reads_files"],
            source=row["source"],
            reason=row.get("reason"),
            note=row.get("note"),
        )
    return None
