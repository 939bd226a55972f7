"""Fetch the vLLM and SGLang releases moetune follows; extract only the files it reads.

    python scripts/fetch_engines.py [--dest .engines] [--wheels DIR]...

For each engine, the current release in `moetune.engines.installed.RELEASES`
(vLLM 0.33.0, SGLang 0.5.23) is taken from the first wheel found in the
``--wheels`` folders (also ``$MOETUNE_ENGINE_WHEELS``, ``:``-separated), then in
``<dest>/wheels/``, else downloaded there with ``pip download --no-deps``.
From each wheel only the ``.py`` and ``.json`` members under `MEMBERS` (and the
dist-info METADATA) are extracted into ``<dest>/site/``, in the package layout:
with that folder on ``sys.path``, ``find_spec`` finds the engine (which cannot be
imported: no dependencies, no compiled extension). The vLLM wheel is 336 MB; what
is extracted is a few MB.

``<dest>/site/.moetune-<engine>`` records the wheel extracted; a rerun with the
same wheel does nothing, a new release replaces the old tree. `make test-engines`
runs this, then the tests under tests/engines_real/ against ``<dest>/site``.
Prints one line per engine; a failure is one ``error:`` line and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from moetune.engines.installed import ENGINES, current_release  # noqa: E402

# What moetune (and its tests) read of each wheel: folders end in "/", files are exact.
# The kernel tests load the engines' Triton kernels from these files; add what they need.
MEMBERS = {
    "vllm": (
        "vllm/__init__.py",
        "vllm/_version.py",
        "vllm/envs.py",
        "vllm/model_executor/layers/fused_moe/",
        "vllm/triton_utils/",
        "vllm/utils/math_utils.py",
        "vllm/utils/platform_utils.py",
    ),
    "sglang": (
        "sglang/__init__.py",
        "sglang/_version.py",
        "sglang/version.py",
        "sglang/kernels/ops/moe/",
        "sglang/srt/layers/moe/moe_runner/triton_utils/",
        "sglang/srt/layers/moe/fused_moe_triton/",
    ),
}
SUFFIXES = (".py", ".json")


class FetchError(Exception):
    """A wheel that cannot be found, downloaded or read."""


def wanted(member: str, engine: str) -> bool:
    """True for the members of `engine`'s wheel that moetune reads."""
    path = PurePosixPath(member)
    if path.is_absolute() or ".." in path.parts:
        return False
    if len(path.parts) == 2 and path.parts[0].endswith(".dist-info"):
        return path.name == "METADATA"
    if not member.endswith(SUFFIXES):
        return False
    return any(
        member.startswith(prefix) if prefix.endswith("/") else member == prefix
        for prefix in MEMBERS[engine]
    )


def find_wheel(engine: str, version: str, folders: list[Path]) -> Path | None:
    for folder in folders:
        hits = sorted(folder.glob(f"{engine}-{version}-*.whl"))
        if hits:
            return hits[0]
    return None


def download(engine: str, version: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
        str(folder),
        f"{engine}=={version}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheel = find_wheel(engine, version, [folder])
    if result.returncode != 0 or wheel is None:
        last = (result.stderr.strip().splitlines() or ["no wheel written"])[-1]
        raise FetchError(f"pip download {engine}=={version} failed: {last}")
    return wheel


def extract(engine: str, wheel: Path, site: Path) -> int:
    """`engine`'s files from `wheel` into `site` (its old tree removed first); count."""
    for old in [site / engine, *site.glob(f"{engine}-*.dist-info")]:
        shutil.rmtree(old, ignore_errors=True)
    marker = site / f".moetune-{engine}"
    marker.unlink(missing_ok=True)
    count = 0
    try:
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                name = info.filename
                top = PurePosixPath(name).parts[0] if name else ""
                if info.is_dir() or not (top == engine or top.startswith(f"{engine}-")):
                    continue
                if not wanted(name, engine):
                    continue
                target = site / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(info))
                count += 1
    except (OSError, zipfile.BadZipFile) as exc:
        raise FetchError(f"{wheel}: cannot read the wheel ({exc})") from None
    marker.write_text(f"{wheel.name}\n")
    return count


def fetch(dest: Path, wheel_dirs: list[Path]) -> list[str]:
    """Make ``<dest>/site`` hold every engine's current release; one line per engine."""
    site, lines = dest / "site", []
    site.mkdir(parents=True, exist_ok=True)
    for engine in ENGINES:
        version, _ = current_release(engine)
        marker = site / f".moetune-{engine}"
        wheel = find_wheel(engine, version, [*wheel_dirs, dest / "wheels"])
        if marker.is_file() and (site / engine).is_dir():
            done = marker.read_text().strip()
            if done.startswith(f"{engine}-{version}-") and (wheel is None or wheel.name == done):
                lines.append(f"{engine} {version}: {site / engine} (already extracted)")
                continue
        if wheel is None:
            wheel = download(engine, version, dest / "wheels")
        count = extract(engine, wheel, site)
        lines.append(f"{engine} {version}: {count} files from {wheel} into {site / engine}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=ROOT / ".engines", help="cache folder")
    parser.add_argument(
        "--wheels",
        type=Path,
        action="append",
        default=[],
        help="a folder of already downloaded wheels (repeatable)",
    )
    args = parser.parse_args(argv)
    from_env = [Path(p) for p in os.environ.get("MOETUNE_ENGINE_WHEELS", "").split(":") if p]
    try:
        for line in fetch(args.dest, [*args.wheels, *from_env]):
            print(line)
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
