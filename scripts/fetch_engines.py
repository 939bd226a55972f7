"""Fetch released vLLM and SGLang files moetune reads, one site folder per release mix.

    python scripts/fetch_engines.py [--dest .engines] [--wheels DIR]... [--optional] [SITE]...

A SITE is a comma-separated list of releases, one per engine, such as
``vllm==0.34.0,sglang==0.5.23``; without one, a single site holds each engine's
current release in `moetune.engines.installed.RELEASES`. A release need not be
one moetune has read: the tests say what it makes of a new one. Each site lands
in ``<dest>/<name>`` (`site_name`: ``vllm-0.34.0+sglang-0.5.23``), which
tests/engines_real reads through ``$MOETUNE_ENGINES_SITE`` (several sites
``:``-separated; every test there runs once per site).

Each wheel is the first found in the ``--wheels`` folders (also
``$MOETUNE_ENGINE_WHEELS``, ``:``-separated), then in ``<dest>/wheels/``, else
downloaded there with ``pip download --no-deps``. From it only the ``.py`` and
``.json`` members under `MEMBERS` (and the dist-info METADATA) are extracted, in
the package layout: with the site on ``sys.path``, ``find_spec`` finds the engine
(which cannot be imported: no dependencies, no compiled extension). The vLLM
wheel is over 300 MB; what is extracted is a few MB.

``<site>/.moetune-<engine>`` records the wheel extracted; a rerun with the same
wheel does nothing, another release replaces the old tree. Prints one line per
engine and site. A wheel that cannot be had or read is one ``error:`` line
(offline: it says how to point at wheels already downloaded) and exit status 1;
with ``--optional`` (what `make test` passes outside CI) the other releases are
still fetched, the failures are one ``warning:`` line, and the exit status is 0:
the tests of a site left incomplete are skipped, and say why.
"""

from __future__ import annotations

import argparse
import os
import re
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
        "vllm/models/deepseek_v41/quant_config.py",  # the backend table's fp4 experts
    ),
    "sglang": (
        "sglang/__init__.py",
        "sglang/_version.py",
        "sglang/version.py",
        "sglang/kernels/ops/moe/",
        "sglang/srt/layers/moe/moe_runner/triton_utils/",
        "sglang/srt/layers/moe/fused_moe_triton/",
        "sglang/srt/arg_groups/model_overrides/",  # the backend table's sm100 overrides
        "sglang/srt/layers/quantization/",  # ... and its quant methods' MoE runners
    ),
}
SUFFIXES = (".py", ".json")
OFFLINE_HINT = (
    "offline? point at wheels already downloaded with --wheels DIR "
    "(make: ENGINE_WHEELS=DIR; pip download --no-deps vllm==X sglang==Y fetches them)"
)


class FetchError(Exception):
    """A release that cannot be named, found, downloaded or read."""


def parse_site(spec: str) -> tuple[tuple[str, str], ...]:
    """``vllm==0.34.0,sglang==0.5.23`` -> (("vllm", "0.34.0"), ("sglang", "0.5.23"))."""
    releases: list[tuple[str, str]] = []
    for part in spec.split(","):
        engine, sep, version = part.strip().partition("==")
        if not sep or engine not in ENGINES or not re.fullmatch(r"[0-9][0-9A-Za-z.+]*", version):
            raise FetchError(
                f"{part.strip()!r} is not a release: write ENGINE==VERSION, ENGINE one of "
                f"{', '.join(ENGINES)} (a site is several, comma-separated)"
            )
        if any(engine == seen for seen, _ in releases):
            raise FetchError(f"{spec!r} names {engine} twice: a site holds one release of each")
        releases.append((engine, version))
    return tuple(releases)


def current_site() -> tuple[tuple[str, str], ...]:
    """Each engine's current release (the newest moetune has read), as one site."""
    return tuple((engine, current_release(engine)[0]) for engine in ENGINES)


def site_name(releases: tuple[tuple[str, str], ...]) -> str:
    """The site folder's name: ``vllm-0.34.0+sglang-0.5.23``."""
    return "+".join(f"{engine}-{version}" for engine, version in releases)


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
        raise FetchError(f"pip download {engine}=={version} failed: {last.strip()}")
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


def fetch_release(engine: str, version: str, site: Path, wheel_dirs: list[Path]) -> str:
    """Make `site` hold `engine` `version`'s files; one line saying what was done."""
    marker = site / f".moetune-{engine}"
    wheel = find_wheel(engine, version, wheel_dirs)
    if marker.is_file() and (site / engine).is_dir():
        done = marker.read_text().strip()
        if done.startswith(f"{engine}-{version}-") and (wheel is None or wheel.name == done):
            return f"{engine} {version}: {site / engine} (already extracted)"
    if wheel is None:
        wheel = download(engine, version, wheel_dirs[-1])
    count = extract(engine, wheel, site)
    return f"{engine} {version}: {count} files from {wheel} into {site / engine}"


def fetch(
    dest: Path,
    wheel_dirs: list[Path],
    sites: list[tuple[tuple[str, str], ...]] | None = None,
    optional: bool = False,
) -> tuple[list[str], list[str]]:
    """Make ``<dest>/<site_name>`` hold each site's releases: (lines, errors).

    Without `optional`, the first error raises `FetchError`; with it, each error
    is returned and the remaining releases are still fetched.
    """
    lines: list[str] = []
    failed: dict[tuple[str, str], str] = {}  # tried once: offline, each try can take a while
    folders = [*wheel_dirs, dest / "wheels"]
    for releases in sites or [current_site()]:
        site = dest / site_name(releases)
        site.mkdir(parents=True, exist_ok=True)
        for release in releases:
            if release in failed:
                continue
            try:
                lines.append(fetch_release(*release, site, folders))
            except FetchError as exc:
                if not optional:
                    raise
                failed[release] = str(exc)
    return lines, list(failed.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "sites",
        nargs="*",
        metavar="SITE",
        help="releases for one site, comma-separated: vllm==0.34.0,sglang==0.5.23 "
        "(default: each engine's current release)",
    )
    parser.add_argument("--dest", type=Path, default=ROOT / ".engines", help="cache folder")
    parser.add_argument(
        "--wheels",
        type=Path,
        action="append",
        default=[],
        help="a folder of already downloaded wheels (repeatable)",
    )
    parser.add_argument(
        "--optional",
        action="store_true",
        help="a release that cannot be had is a warning (its site's tests skip), not a failure",
    )
    args = parser.parse_args(argv)
    from_env = [Path(p) for p in os.environ.get("MOETUNE_ENGINE_WHEELS", "").split(":") if p]
    try:
        sites = [parse_site(spec) for spec in args.sites]
        lines, errors = fetch(args.dest, [*args.wheels, *from_env], sites, args.optional)
    except FetchError as exc:
        print(f"error: {exc}; {OFFLINE_HINT}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    if errors:
        print(
            f"warning: {'; '.join(errors)}: tests/engines_real skips the sites without them; "
            f"{OFFLINE_HINT}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
