"""scripts/fetch_engines.py: only the files moetune reads, in the package layout, once per site."""

import importlib.util
import sys
import zipfile
from pathlib import Path

import pytest

from moetune.engines.installed import current_release, find_installed

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "fetch_engines.py"


def _script():
    spec = importlib.util.spec_from_file_location("fetch_engines", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fetch_engines = _script()
# The fixture's wheels are each engine's current release; OTHER, a known vLLM release beside it.
CURRENT = current_release("vllm")[0]
OTHER = "0.33.0" if CURRENT != "0.33.0" else "0.34.0"


def fake_wheel(folder, engine, members, version=None):
    version = version or current_release(engine)[0]
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{engine}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in members.items():
            archive.writestr(name, text)
        archive.writestr(
            f"{engine}-{version}.dist-info/METADATA", f"Name: {engine}\nVersion: {version}\n"
        )
        archive.writestr(f"{engine}-{version}.dist-info/RECORD", "")
    return wheel


@pytest.fixture
def wheels(tmp_path):
    folder = tmp_path / "wheels"
    fake_wheel(
        folder,
        "vllm",
        {
            "vllm/__init__.py": "import torch\n",
            "vllm/_C.abi3.so": "binary",
            "vllm/entrypoints/api_server.py": "",
            "vllm/model_executor/layers/fused_moe/fused_moe.py": "# kernel and lookup\n",
            "vllm/model_executor/layers/fused_moe/configs/E=8,N=14336,device_name=NVIDIA_H200.json": "{}",
            "vllm/model_executor/layers/fused_moe/configs/README": "",
        },
    )
    fake_wheel(
        folder,
        "sglang",
        {
            "sglang/__init__.py": "",
            "sglang/kernels/ops/moe/fused_moe_triton_kernels.py": "",
            "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py": "",
            "sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_6_0/x.json": "{}",
            "sglang/srt/server.py": "",
        },
    )
    return folder


def site_files(site):
    return sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())


def test_extracts_only_what_moetune_reads_in_the_package_layout(tmp_path, wheels, monkeypatch):
    dest = tmp_path / "cache"
    lines, errors = fetch_engines.fetch(dest, [wheels])
    assert errors == []
    assert [line.split(":")[0] for line in lines] == [f"vllm {CURRENT}", "sglang 0.5.23"]
    assert [p.name for p in dest.iterdir()] == [f"vllm-{CURRENT}+sglang-0.5.23"]
    site = dest / f"vllm-{CURRENT}+sglang-0.5.23"
    assert site_files(site) == [
        ".moetune-sglang",
        ".moetune-vllm",
        "sglang-0.5.23.dist-info/METADATA",
        "sglang/__init__.py",
        "sglang/kernels/ops/moe/fused_moe_triton_kernels.py",
        "sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_6_0/x.json",
        "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py",
        f"vllm-{CURRENT}.dist-info/METADATA",
        "vllm/__init__.py",
        "vllm/model_executor/layers/fused_moe/configs/E=8,N=14336,device_name=NVIDIA_H200.json",
        "vllm/model_executor/layers/fused_moe/fused_moe.py",
    ]
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    found = find_installed("vllm")
    assert (found.version, found.note) == (CURRENT, None)


def test_one_site_per_release_mix(tmp_path, wheels, monkeypatch):
    fake_wheel(wheels, "vllm", {"vllm/__init__.py": "", "vllm/envs.py": "# other\n"}, OTHER)
    sites = [f"vllm=={CURRENT},sglang==0.5.23", f"vllm=={OTHER},sglang==0.5.23"]
    dest = tmp_path / "cache"
    assert fetch_engines.main(["--dest", str(dest), "--wheels", str(wheels), *sites]) == 0
    current, other = dest / f"vllm-{CURRENT}+sglang-0.5.23", dest / f"vllm-{OTHER}+sglang-0.5.23"
    assert (current / ".moetune-vllm").read_text().startswith(f"vllm-{CURRENT}-")
    assert (other / ".moetune-vllm").read_text().startswith(f"vllm-{OTHER}-")
    assert (other / "vllm/envs.py").read_text() == "# other\n"
    assert not (current / "vllm/envs.py").exists()
    assert (current / ".moetune-sglang").read_text() == (other / ".moetune-sglang").read_text()
    monkeypatch.syspath_prepend(str(other))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    assert find_installed("vllm").version == OTHER


def test_a_second_run_reuses_the_cache_and_never_downloads(tmp_path, wheels, monkeypatch):
    dest = tmp_path / "cache"
    fetch_engines.fetch(dest, [wheels])

    def no_download(*args):
        raise AssertionError("downloaded again")

    monkeypatch.setattr(fetch_engines, "download", no_download)
    lines, _ = fetch_engines.fetch(dest, [])
    assert len(lines) == 2 and all(line.endswith("(already extracted)") for line in lines)


def test_a_wheel_that_cannot_be_read_is_one_line(tmp_path, capsys):
    folder = tmp_path / "wheels"
    folder.mkdir()
    version, _ = current_release("vllm")
    (folder / f"vllm-{version}-py3-none-any.whl").write_text("not a zip")
    assert fetch_engines.main(["--dest", str(tmp_path / "cache"), "--wheels", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "cannot read the wheel" in err and err.count("\n") == 1


@pytest.fixture
def offline(monkeypatch):
    """pip download fails, as without network; the releases tried, in order."""
    tried = []

    def download(engine, version, folder):
        tried.append(f"{engine}=={version}")
        raise fetch_engines.FetchError(f"pip download {engine}=={version} failed: no network")

    monkeypatch.setattr(fetch_engines, "download", download)
    return tried


def test_offline_is_one_line_that_says_how_to_use_local_wheels(tmp_path, offline, capsys):
    assert fetch_engines.main(["--dest", str(tmp_path), "vllm==0.34.0,sglang==0.5.23"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("error: pip download vllm==0.34.0 failed: no network; ")
    assert "--wheels DIR" in err and "ENGINE_WHEELS=DIR" in err
    assert offline == ["vllm==0.34.0"]


def test_optional_fetches_what_it_can_and_warns_once(tmp_path, wheels, offline, capsys):
    sites = [f"vllm=={CURRENT},sglang==0.5.23", f"vllm=={OTHER},sglang==0.5.23"]
    args = ["--dest", str(tmp_path / "cache"), "--wheels", str(wheels), "--optional", *sites]
    assert fetch_engines.main(args) == 0
    out, err = capsys.readouterr()
    assert offline == [f"vllm=={OTHER}"]  # the others are in `wheels`, each missing one tried once
    assert out.count("\n") == 3 and err.count("\n") == 1
    assert err.startswith(f"warning: pip download vllm=={OTHER} failed: no network: ")
    assert "skips the sites without them" in err and "ENGINE_WHEELS=DIR" in err
    assert not (tmp_path / "cache" / f"vllm-{OTHER}+sglang-0.5.23" / ".moetune-vllm").exists()


@pytest.mark.parametrize(
    "spec, message",
    [
        ("vllm=0.34.0", "'vllm=0.34.0' is not a release: write ENGINE==VERSION"),
        ("torch==2.13.0", "'torch==2.13.0' is not a release"),
        ("vllm==latest", "'vllm==latest' is not a release"),
        ("vllm==0.33.0,vllm==0.34.0", "names vllm twice"),
    ],
)
def test_a_bad_site_is_one_line(tmp_path, spec, message, capsys):
    assert fetch_engines.main(["--dest", str(tmp_path), spec]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert err.count("\n") == 1 and not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "member, kept",
    [
        ("vllm/model_executor/layers/fused_moe/utils.py", True),
        ("vllm/model_executor/layers/fused_moe/configs/README", False),
        ("vllm/_C.abi3.so", False),
        ("vllm/../evil.py", False),
        ("vllm-0.33.0.dist-info/METADATA", True),
        ("vllm-0.33.0.dist-info/RECORD", False),
    ],
)
def test_wanted(member, kept):
    assert fetch_engines.wanted(member, "vllm") is kept
