"""scripts/fetch_engines.py: only the files moetune reads, in the package layout, once."""

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


def fake_wheel(folder, engine, members):
    version, _ = current_release(engine)
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


def test_extracts_only_what_moetune_reads_in_the_package_layout(tmp_path, wheels, monkeypatch):
    dest = tmp_path / "cache"
    lines = fetch_engines.fetch(dest, [wheels])
    assert [line.split(":")[0] for line in lines] == ["vllm 0.33.0", "sglang 0.5.23"]
    site = dest / "site"
    files = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert files == [
        ".moetune-sglang",
        ".moetune-vllm",
        "sglang-0.5.23.dist-info/METADATA",
        "sglang/__init__.py",
        "sglang/kernels/ops/moe/fused_moe_triton_kernels.py",
        "sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_6_0/x.json",
        "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py",
        "vllm-0.33.0.dist-info/METADATA",
        "vllm/__init__.py",
        "vllm/model_executor/layers/fused_moe/configs/E=8,N=14336,device_name=NVIDIA_H200.json",
        "vllm/model_executor/layers/fused_moe/fused_moe.py",
    ]
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    found = find_installed("vllm")
    assert (found.version, found.note) == ("0.33.0", None)


def test_a_second_run_reuses_the_cache_and_never_downloads(tmp_path, wheels, monkeypatch):
    dest = tmp_path / "cache"
    fetch_engines.fetch(dest, [wheels])

    def no_download(*args):
        raise AssertionError("downloaded again")

    monkeypatch.setattr(fetch_engines, "download", no_download)
    lines = fetch_engines.fetch(dest, [])
    assert all(line.endswith("(already extracted)") for line in lines)


def test_a_wheel_that_cannot_be_read_is_one_line(tmp_path, capsys):
    folder = tmp_path / "wheels"
    folder.mkdir()
    version, _ = current_release("vllm")
    (folder / f"vllm-{version}-py3-none-any.whl").write_text("not a zip")
    assert fetch_engines.main(["--dest", str(tmp_path / "cache"), "--wheels", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "cannot read the wheel" in err and err.count("\n") == 1


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
