"""Where a model's config.json comes from: a path, the Hugging Face cache, the bundled catalog, the Hub.

`load_config(model)` reads raw JSON only, never executes a repository's code,
and tries, in order:

1. an existing path: a model directory holding ``config.json``, or a JSON file;
2. for a repo id (``org/name``), the local Hugging Face cache
   (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``),
   at ``--revision`` or ``main``: what the user has downloaded is what they serve;
3. the bundled catalog (``moetune/catalog/org__name.json``, repo id matched
   case-insensitively), unless ``--revision`` is given;
4. the Hugging Face Hub, unless ``HF_HUB_OFFLINE`` is set (``HF_TOKEN`` is honoured).
   One quick request first checks that the Hub answers: an unreachable Hub fails
   in seconds, with the close matches among the bundled and cached models.

The bundled snapshot wins over the Hub: it answers in milliseconds, offline and
the same way every time, and its provenance is printed. A user who wants the
Hub's current file passes ``--revision main`` (or any revision), which skips the
catalog. huggingface_hub is imported only when the cache holds the repo or the
Hub is asked, because importing it costs about 0.1 s.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetune.errors import ConfigSourceError
from moetune.fileio import read_input_text

CATALOG_DIR = Path(__file__).resolve().parent.parent / "catalog"
CONFIG_NAME = "config.json"
_REPO_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class LoadedConfig:
    """A parsed config.json, a human description of its source and its file path."""

    config: dict[str, Any]
    description: str
    path: str | None


def load_config(model: str, *, revision: str | None = None) -> LoadedConfig:
    """Find and parse `model`'s config.json (see the module docstring for the order)."""
    local = Path(model).expanduser()
    if local.exists():
        return _load_local(local)
    if _looks_like_path(model):
        raise ConfigSourceError(f"{model}: no such file or directory")
    if not _REPO_ID.fullmatch(model):
        raise ConfigSourceError(
            f"{model!r} is neither an existing path nor a Hugging Face repo id (org/name)"
        )
    cached = _from_hf_cache(model, revision)
    if cached is not None:
        return cached
    if revision is None:
        bundled = _from_catalog(model)
        if bundled is not None:
            return bundled
    if hf_offline():
        hint = " or drop --revision to use the bundled snapshot" if _catalog_file(model) else ""
        raise ConfigSourceError(
            f"{model}{_at(revision)} is not in the Hugging Face cache ({hf_cache_dir()}) "
            f"and HF_HUB_OFFLINE is set: run `hf download {model} {CONFIG_NAME}` "
            f"on a connected machine, pass --model /path/to/config.json{hint}"
        )
    return _from_hub(model, revision)


def hf_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` forbids network calls (read at call time, not import time)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in _TRUE


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, resolved from the environment as huggingface_hub does."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.environ[variable]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "huggingface" / "hub"


def catalog_models() -> list[str]:
    """Repo ids of the bundled config snapshots, sorted."""
    return sorted(path.stem.replace("__", "/", 1) for path in CATALOG_DIR.glob("*.json"))


def read_json_file(path: Path) -> dict[str, Any]:
    """Parse a JSON object from `path`; any problem is a one-line `ConfigSourceError`."""
    try:
        text = read_input_text(path)
    except UnicodeDecodeError:
        raise ConfigSourceError(f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigSourceError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigSourceError(
            f"malformed JSON in {path} at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise ConfigSourceError(
            f"{path}: JSON nested too deeply to read; a config.json is a few levels deep"
        ) from None
    except ValueError as exc:  # an integer with more digits than Python converts
        reason = str(exc).split(";")[0]
        raise ConfigSourceError(f"malformed JSON in {path}: {reason}") from None
    if not isinstance(data, dict):
        raise ConfigSourceError(f"{path} holds a JSON {type(data).__name__}, not a config object")
    if "\\u" in text:  # JSON's escapes can write a lone surrogate, which no output can print
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigSourceError(
                f"{path}: a string holds {ascii(exc.object[exc.start])[1:-1]}, a lone "
                "surrogate: not valid Unicode"
            ) from None
        except RecursionError:  # as deep as json.loads reads: no string to check is lost
            pass
    return data


def _at(revision: str | None) -> str:
    return f" (revision {revision})" if revision else ""


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", ".", "~")) or model.endswith(".json") or model.count("/") > 1


def _load_local(path: Path) -> LoadedConfig:
    file = path / CONFIG_NAME if path.is_dir() else path
    if path.is_dir() and not file.exists():  # one that is there but no file is refused below
        raise ConfigSourceError(f"{path} is a directory without a {CONFIG_NAME}")
    return LoadedConfig(read_json_file(file), f"local file {file}", str(file))


def _from_hf_cache(repo_id: str, revision: str | None) -> LoadedConfig | None:
    cache = hf_cache_dir()
    if not (cache / f"models--{repo_id.replace('/', '--')}").is_dir():
        return None  # the common case, answered without importing huggingface_hub
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, CONFIG_NAME, cache_dir=cache, revision=revision)
    if not isinstance(found, str):
        return None
    file = Path(found)
    return LoadedConfig(
        read_json_file(file), f"Hugging Face cache (revision {file.parent.name})", str(file)
    )


def _catalog_file(repo_id: str) -> Path | None:
    wanted = f"{repo_id.replace('/', '__')}.json".lower()
    for path in CATALOG_DIR.glob("*.json"):
        if path.name.lower() == wanted:
            return path
    return None


def _from_catalog(repo_id: str) -> LoadedConfig | None:
    file = _catalog_file(repo_id)
    if file is None:
        return None
    provenance = catalog_provenance(file.name) or f"see {CATALOG_DIR / 'INDEX.md'}"
    return LoadedConfig(
        read_json_file(file),
        f"bundled snapshot {file.name} (provenance {provenance})",
        str(file),
    )


def catalog_provenance(file_name: str) -> str | None:
    """The provenance cell of `file_name`'s row in the catalog's INDEX.md table, if any."""
    index = CATALOG_DIR / "INDEX.md"
    if not index.is_file():
        return None
    column = None
    for line in index.read_text(encoding="utf-8").splitlines():
        # Cells may contain escaped pipes (``\|``) inside backticks.
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if not cells:
            continue
        lowered = [cell.lower() for cell in cells]
        if "provenance" in lowered:
            column = lowered.index("provenance")
        elif column is not None and cells[0].strip("`") == file_name and column < len(cells):
            return cells[column].strip("`") or None
    return None


# Seconds the one reachability request to the Hub may take before extract gives up.
HUB_PROBE_TIMEOUT_S = 3.0
DEFAULT_HF_ENDPOINT = "https://huggingface.co"


def hub_reachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """One HEAD request to the Hub's endpoint (``$HF_ENDPOINT``): (reachable, why not).

    Any HTTP answer, an error status included, means the Hub is there. Made before
    huggingface_hub is asked, because huggingface_hub retries an unreachable host
    for about 25 s and logs a line per retry.
    """
    import urllib.error
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or DEFAULT_HF_ENDPOINT
    try:
        request = urllib.request.Request(endpoint + "/", method="HEAD")
        with urllib.request.urlopen(request, timeout=timeout_s):
            return True, ""
    except urllib.error.HTTPError:
        return True, ""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"{endpoint}: {reason}"


def cached_repo_ids() -> list[str]:
    """Repo ids of the models in the local Hugging Face cache (``models--org--name`` folders)."""
    cache = hf_cache_dir()
    try:
        names = [p.name for p in cache.iterdir() if p.name.startswith("models--")]
    except OSError:
        return []
    return sorted(name[len("models--") :].replace("--", "/", 1) for name in names)


def close_matches(repo_id: str, limit: int = 3) -> list[str]:
    """Known repo ids (bundled catalog and HF cache) that look like `repo_id`, best first."""
    import difflib

    known = {name.lower(): name for name in [*catalog_models(), *cached_repo_ids()]}
    found = difflib.get_close_matches(repo_id.lower(), list(known), n=limit, cutoff=0.6)
    return [known[name] for name in found]


def _did_you_mean(repo_id: str, revision: str | None = None) -> str:
    """Other known repo ids like `repo_id` (never itself); for a bundled model asked at a
    revision, the way to its snapshot instead."""
    if revision is not None and _catalog_file(repo_id) is not None:
        return "; --revision skips the bundled snapshot of it: drop --revision to use that"
    matches = [name for name in close_matches(repo_id) if name.lower() != repo_id.lower()]
    return f"; did you mean {' or '.join(matches)}?" if matches else ""


def _from_hub(repo_id: str, revision: str | None) -> LoadedConfig:
    reachable, why = hub_reachable()
    if not reachable:
        bundled = revision is not None and _catalog_file(repo_id) is not None
        where = "the Hugging Face cache" + ("" if bundled else " or the bundled snapshots")
        raise ConfigSourceError(
            f"{repo_id}{_at(revision)} is not in {where}, and the Hub cannot be reached "
            f"({why}){_did_you_mean(repo_id, revision)}"
        )
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo_id}{_at(revision)}"
    try:
        found = hf_hub_download(repo_id, CONFIG_NAME, revision=revision, cache_dir=hf_cache_dir())
    except LocalEntryNotFoundError:
        raise ConfigSourceError(
            f"cannot reach the Hugging Face Hub for {where} and it is not cached: check the "
            f"network, or run `hf download {repo_id} {CONFIG_NAME}` where it works"
            f"{_did_you_mean(repo_id, revision)}"
        ) from None
    except GatedRepoError:
        raise ConfigSourceError(
            f"{repo_id} is gated: accept its terms on the Hub and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise ConfigSourceError(
            f"{repo_id} is not on the Hugging Face Hub (a private repo needs HF_TOKEN)"
            f"{_did_you_mean(repo_id)}"
        ) from None
    except RevisionNotFoundError:
        raise ConfigSourceError(f"revision {revision!r} does not exist in {repo_id}") from None
    except EntryNotFoundError:
        raise ConfigSourceError(f"{where} has no {CONFIG_NAME}") from None
    except (HfHubHTTPError, OSError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigSourceError(f"fetching {where} from the Hub failed: {first_line}") from None
    file = Path(found)
    return LoadedConfig(
        read_json_file(file), f"Hugging Face Hub (revision {file.parent.name})", str(file)
    )
