"""`moetune check`, `extract` and `tune --install` against the released vLLM 0.33.0 and SGLang 0.5.23.

The engines' files are on sys.path (conftest.py), as after ``pip install --no-deps``:
check must find the H200 files those wheels ship, and check, extract and
``--install`` must name the folder the real package reads.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from moetune.cli import main
from moetune.engines import names
from moetune.engines.install import install_target

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parent.parent.parent
H200 = ("--device-name", "NVIDIA H200")


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    monkeypatch.setattr(names, "detect_device_name", lambda: None)


def check(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main(["check", *args, *H200, "--json"])
    return exc.value.code, json.loads(capsys.readouterr().out)


def by_engine(report):
    return {item["engine"]: item for item in report["engines"]}


@pytest.mark.parametrize(
    "model, tp, name",
    [
        ("Qwen/Qwen3-30B-A3B", "1", "E=128,N=768,device_name=NVIDIA_H200.json"),
        ("mistralai/Mixtral-8x7B-v0.1", "1", "E=8,N=14336,device_name=NVIDIA_H200.json"),
        (
            "deepseek-ai/DeepSeek-V3",
            "8",
            "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
        ),
    ],
)
def test_check_finds_the_h200_files_vllm_ships(capsys, vllm_installed, model, tp, name):
    code, report = check(capsys, "--model", model, "--tp", tp, "--engine", "vllm")
    assert code == 0
    assert by_engine(report)["vllm"]["found"] == str(vllm_installed.configs_dir / name)


@pytest.mark.parametrize(
    "model, tp, name, down",
    [
        ("Qwen/Qwen3-30B-A3B", "1", "E=128,N=768,device_name=NVIDIA_H200.json", False),
        (
            "deepseek-ai/DeepSeek-V3",
            "4",
            "E=256,N=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json",
            True,
        ),
    ],
)
def test_check_finds_sglangs_triton_3_6_0_h200_files(
    capsys, sglang_installed, model, tp, name, down
):
    folder = sglang_installed.configs_dir / "triton_3_6_0"
    args = ("--model", model, "--tp", tp, "--engine", "sglang", "--triton-version", "3.6.0")
    code, report = check(capsys, *args)
    sglang = by_engine(report)["sglang"]
    assert code == 0
    assert (sglang["found"], sglang["triton_folder"]) == (str(folder / name), "triton_3_6_0")
    assert sglang["searched"][0] == str(folder / name)  # the installed Triton's folder first
    assert (
        f"config root: {folder.parent.parent} (the installed sglang 0.5.23 package)"
        in (sglang["notes"])
    )
    assert (sglang["down"]["found"] is not None) == down

    # Under Triton 3.9.0 (no folder of its own) SGLang scans newest first and lands there too.
    code, report = check(capsys, *args[:-1], "3.9.0")
    sglang = by_engine(report)["sglang"]
    assert sglang["searched"][1].split("/")[-2] == "triton_3_8_0"
    assert sglang["found"] == str(folder / name)
    assert any("falls back to triton_3_6_0" in note for note in sglang["notes"])


def test_check_extract_and_install_name_the_folder_the_package_reads(
    capsys, vllm_installed, sglang_installed
):
    vllm_folder = vllm_installed.root / "model_executor/layers/fused_moe/configs"
    sglang_folder = (
        sglang_installed.root / "srt/layers/moe/moe_runner/triton_utils/configs/triton_3_9_0"
    )
    args = ("--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--triton-version", "3.9.0")
    _, report = check(capsys, *args)
    engines = by_engine(report)
    assert Path(engines["vllm"]["searched"][-1]).parent == vllm_folder
    assert Path(engines["sglang"]["searched"][0]).parent == sglang_folder

    assert install_target("vllm", "3.9.0", env={}).folder == vllm_folder
    assert install_target("sglang", "3.9.0", env={}).folder == sglang_folder

    assert names.sglang_config_dir_hint("3.9.0").endswith(f", default {sglang_folder}/")


def test_a_missing_engine_is_one_line(capsys, monkeypatch, engines_site):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(engines_site)])
    code, report = check(capsys, "--model", "Qwen/Qwen3-30B-A3B", "--tp", "1")
    assert code == 4
    notes = {item["engine"]: item["notes"] for item in report["engines"]}
    assert "vllm is not installed here: its own configs/ folder was not searched" in notes["vllm"]
    assert "sglang is not installed here and $SGLANG_MOE_CONFIG_DIR is not set" in notes["sglang"]


def test_an_unknown_version_is_one_line_and_still_found(
    capsys, monkeypatch, tmp_path, vllm_installed
):
    # A copy of vLLM 0.33.0's lookup folder that calls itself 0.33.1.
    real = vllm_installed
    site = tmp_path / "site"
    fused_moe = "vllm/model_executor/layers/fused_moe"
    shutil.copytree(real.root / "model_executor/layers/fused_moe", site / fused_moe)
    (site / "vllm" / "__init__.py").write_text("")  # a package, not a namespace portion
    (site / "vllm" / "_version.py").write_text("__version__ = version = '0.33.1'\n")
    monkeypatch.syspath_prepend(str(site))
    name = "E=128,N=768,device_name=NVIDIA_H200.json"
    with pytest.raises(SystemExit) as exc:
        main(["check", "--model", "Qwen/Qwen3-30B-A3B", "--engine", "vllm", *H200])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    note = "vllm 0.33.1 is not a release moetune has read; following 0.33.0, the nearest it knows"
    assert f"  ({note})\n" in out
    assert f"FOUND: {site / fused_moe / 'configs' / name}" in out


PROBE = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from moetune.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(["check", "--model", "Qwen/Qwen3-30B-A3B", "--device-name", "NVIDIA H200",
                  "--triton-version", "3.6.0", "--json"])
        except SystemExit as exc:
            code = exc.code
    extract = io.StringIO()
    with contextlib.redirect_stdout(extract):
        try:
            main(["extract", "--model", "Qwen/Qwen3-30B-A3B", "--device-name", "NVIDIA H200",
                  "--json"])
        except SystemExit:
            pass
    loaded = [n for n in ("torch", "triton", "vllm", "sglang") if n in sys.modules]
    print(json.dumps({"code": code, "loaded": loaded, "report": json.loads(out.getvalue()),
                      "extract": json.loads(extract.getvalue())}))
    """
)


def test_check_and_extract_with_the_engines_installed_import_neither_them_nor_torch(
    tmp_path, engines_site
):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(engines_site)]))
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    assert probe["loaded"] == []
    assert probe["code"] == 0
    found = [item["found"] for item in probe["report"]["engines"]]
    assert all(path.startswith(str(engines_site.resolve())) for path in found), found
    sglang_root = engines_site.resolve() / "sglang/srt/layers/moe/moe_runner/triton_utils"
    assert f", default {sglang_root}/configs/triton_" in probe["extract"]["sglang_config_dir"]
