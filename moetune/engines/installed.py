"""Find an installed vLLM or SGLang without importing it: its version and where its files are.

Importing either engine pulls in torch and the engine's import graph (and fails
outright where only its Python files are present, as with ``pip install
--no-deps``), so nothing here imports it. The package folder comes from
`importlib.util.find_spec` on the top-level name only (finding a submodule
would import its parents), the version from the package's dist-info or its
``_version.py`` read as text.

Where each release keeps its files is data, read from the released wheels:
`RELEASES` maps every release moetune has read to a `Layout`. An installed
version moetune has not read follows the nearest release it has (the newest
one not newer than it), and the files on disk have the last word: when the
nearest layout's lookup module is missing but another known layout's is there,
that layout is used.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ENGINES = ("vllm", "sglang")


@dataclass(frozen=True)
class Layout:
    """Where one engine release keeps its fused-MoE files, relative to the package folder.

    `kernel_source` holds the Triton ``fused_moe_kernel``; `lookup_source` the
    config lookup (vLLM's ``get_moe_configs``, SGLang's); `configs` the shipped
    tuned files (SGLang: the folder holding ``triton_X_Y_Z/``). SGLang only:
    `triton_fallback` lists the Triton versions its lookup tries after the
    installed one's folder misses, in order; None means every ``triton_*``
    folder on disk, newest first.
    """

    kernel_source: str
    lookup_source: str
    configs: str
    triton_fallback: tuple[str, ...] | None = None


VLLM_FUSED_MOE = Layout(
    kernel_source="model_executor/layers/fused_moe/fused_moe.py",
    lookup_source="model_executor/layers/fused_moe/fused_moe.py",
    configs="model_executor/layers/fused_moe/configs",
)
# SGLang up to 0.5.10.post1: everything in srt/layers/moe/fused_moe_triton/, and a fixed
# list of other Triton folders to try.
SGLANG_FUSED_MOE_TRITON = Layout(
    kernel_source="srt/layers/moe/fused_moe_triton/fused_moe_triton_kernels.py",
    lookup_source="srt/layers/moe/fused_moe_triton/fused_moe_triton_config.py",
    configs="srt/layers/moe/fused_moe_triton/configs",
    triton_fallback=("3.4.0", "3.3.1", "3.2.0", "3.1.0"),
)
# 0.5.11: moved to srt/layers/moe/moe_runner/triton_utils/, same fixed list.
SGLANG_MOE_RUNNER_FIXED = Layout(
    kernel_source="srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_kernels.py",
    lookup_source="srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py",
    configs="srt/layers/moe/moe_runner/triton_utils/configs",
    triton_fallback=("3.4.0", "3.3.1", "3.2.0", "3.1.0"),
)
# 0.5.12 to 0.5.15.post1: every triton_* folder on disk, newest first.
SGLANG_MOE_RUNNER = Layout(
    kernel_source="srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_kernels.py",
    lookup_source="srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py",
    configs="srt/layers/moe/moe_runner/triton_utils/configs",
)
# 0.5.16 on: the kernels moved to sglang/kernels/ops/moe/; the lookup and configs stayed.
SGLANG_KERNELS_OPS = Layout(
    kernel_source="kernels/ops/moe/fused_moe_triton_kernels.py",
    lookup_source="srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py",
    configs="srt/layers/moe/moe_runner/triton_utils/configs",
)

# Every release moetune has read (from its wheel), and its layout. The last one of each
# engine is the current release: what moetune describes when the engine is not installed.
RELEASES: dict[str, dict[str, Layout]] = {
    "vllm": {
        "0.33.0": VLLM_FUSED_MOE,
        "0.34.0": VLLM_FUSED_MOE,
    },
    "sglang": {
        "0.5.10": SGLANG_FUSED_MOE_TRITON,
        "0.5.10.post1": SGLANG_FUSED_MOE_TRITON,
        "0.5.11": SGLANG_MOE_RUNNER_FIXED,
        "0.5.12": SGLANG_MOE_RUNNER,
        "0.5.13": SGLANG_MOE_RUNNER,
        "0.5.14": SGLANG_MOE_RUNNER,
        "0.5.15": SGLANG_MOE_RUNNER,
        "0.5.15.post1": SGLANG_MOE_RUNNER,
        "0.5.16": SGLANG_KERNELS_OPS,
        "0.5.20": SGLANG_KERNELS_OPS,
        "0.5.23": SGLANG_KERNELS_OPS,
    },
}


def current_release(engine: str) -> tuple[str, Layout]:
    """The newest release moetune has read, and its layout."""
    version = max(RELEASES[engine], key=version_key)
    return version, RELEASES[engine][version]


@dataclass(frozen=True)
class InstalledEngine:
    """An engine package found on ``sys.path``, and where its fused-MoE files are.

    `root` is the package folder, resolved as the engine resolves its own
    ``__file__``. `configs_dir` is the folder of shipped tuned files the
    engine reads (SGLang: the one holding ``triton_X_Y_Z/``; `config_root`,
    its parent, is what ``$SGLANG_MOE_CONFIG_DIR`` replaces). `kernel_source`
    and `lookup_source` are None when the file is not where the layout
    puts it. `release` is the known release whose layout is used; `note` says,
    in one line, why it is not simply the installed version.
    """

    engine: str
    version: str | None
    root: Path
    kernel_source: Path | None
    configs_dir: Path
    lookup_source: Path | None
    release: str
    triton_fallback: tuple[str, ...] | None = None
    note: str | None = None

    @property
    def config_root(self) -> Path:
        return self.configs_dir.parent

    @property
    def label(self) -> str:
        return f"{self.engine} {self.version or '(version unknown)'}"


def version_key(version: str) -> tuple[tuple[int, ...], int]:
    """A sortable key for ``0.33.0``, ``0.5.10.post1``, ``0.34.0rc1``, ``0.33.0+cu130``.

    The release numbers (padded to three) and the post-release number; pre-release,
    dev and local parts are ignored. An unparsable version sorts first.
    """
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)(?:[.-]?post(\d+))?", version)
    if match is None:
        return (), 0
    release = tuple(int(part) for part in match[1].split("."))
    release += (0,) * (3 - len(release))
    return release, int(match[2] or 0)


def nearest_release(engine: str, version: str | None) -> tuple[list[str], str | None]:
    """Known releases of `engine` in the order to try them for `version`, and a note.

    An exact match (local build tags aside) comes alone first with no note; otherwise
    the newest known release not newer than `version`, then the older ones newest
    first, then the newer ones oldest first. The note says which one stands in.
    """
    known = RELEASES[engine]
    current, _ = current_release(engine)
    if version is None:
        ordered = sorted(known, key=version_key, reverse=True)
        return ordered, f"{engine}: no version found; following {current}, the newest it knows"
    key = version_key(version)
    exact = [v for v in known if version_key(v) == key and key != ((), 0)]
    older = sorted((v for v in known if version_key(v) < key), key=version_key, reverse=True)
    newer = sorted((v for v in known if version_key(v) > key), key=version_key)
    ordered = exact + [v for v in older + newer if v not in exact]
    if exact:
        return ordered, None
    return ordered, (
        f"{engine} {version} is not a release moetune has read; "
        f"following {ordered[0]}, the nearest it knows"
    )


def package_root(name: str) -> Path | None:
    """The folder of top-level package `name` on ``sys.path``, found without importing it.

    A namespace package (a folder without ``__init__.py``, e.g. a source checkout
    named like the engine) can span several folders: the first one holding a
    lookup module of a known release wins, else the first.
    """
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    locations = [Path(location).resolve() for location in spec.submodule_search_locations]
    if not locations:
        return None
    sources = {layout.lookup_source for layout in RELEASES.get(name, {}).values()}
    return next(
        (path for path in locations if any((path / source).is_file() for source in sources)),
        locations[0],
    )


def _version_from_dist_info(name: str, root: Path) -> str | None:
    # The distribution installed next to the package (the one that owns it).
    try:
        for dist in metadata.distributions(name=name, path=[str(root.parent)]):
            return dist.version
    except (OSError, ValueError):
        pass
    return None


VERSION_LINE = re.compile(
    r"^__version__\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", re.M
)


def _version_from_file(root: Path) -> str | None:
    # vLLM and SGLang both write ``__version__ = version = '0.33.0'`` to _version.py.
    for name in ("_version.py", "version.py"):
        try:
            match = VERSION_LINE.search((root / name).read_text(errors="replace"))
        except OSError:
            continue
        if match:
            return match[1]
    return None


def installed_version(name: str, root: Path) -> str | None:
    """The version of the package at `root`: its dist-info, its version file, then metadata."""
    version = _version_from_dist_info(name, root) or _version_from_file(root)
    if version:
        return version
    try:
        return metadata.version(name)
    except (metadata.PackageNotFoundError, ValueError):
        return None


def find_installed(engine: str) -> InstalledEngine | None:
    """`engine` ("vllm" or "sglang") as installed on ``sys.path``, or None; never imported."""
    if engine not in RELEASES:
        raise ValueError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    root = package_root(engine)
    if root is None:
        return None
    version = installed_version(engine, root)
    ordered, note = nearest_release(engine, version)

    # The files on disk have the last word: the first layout (in `ordered`) whose lookup
    # module and kernel file are both there, else whose lookup module is; none: the
    # nearest release's, with a note.
    def holds(version: str, *files: str) -> bool:
        layout = RELEASES[engine][version]
        return all((root / getattr(layout, attr)).is_file() for attr in files)

    release = next((v for v in ordered if holds(v, "lookup_source", "kernel_source")), None)
    release = release or next((v for v in ordered if holds(v, "lookup_source")), None)
    if release is None:
        release = ordered[0]
        note = (
            f"{engine} at {root} holds no fused-MoE lookup where any release moetune has "
            f"read keeps it; assuming {release}'s layout"
        )
    elif release != ordered[0]:
        note = (
            f"{engine} {version or '(version unknown)'}: its files are laid out like "
            f"{release}'s, which moetune follows"
        )
    layout = RELEASES[engine][release]
    kernel, lookup = root / layout.kernel_source, root / layout.lookup_source
    return InstalledEngine(
        engine=engine,
        version=version,
        root=root,
        kernel_source=kernel if kernel.is_file() else None,
        configs_dir=root / layout.configs,
        lookup_source=lookup if lookup.is_file() else None,
        release=release,
        triton_fallback=layout.triton_fallback,
        note=note,
    )
