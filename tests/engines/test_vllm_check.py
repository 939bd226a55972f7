"""`moetune check` by vLLM release: which entry keys each accepts, and 0.34's ``_down.json``.

DeepSeek-V3 TP8 on an H200: E=256, N=256, K=7168, fp8 block [128, 128] (the shape of
the two ``_down`` files vLLM 0.34.0 ships). vLLM is not installed here: the release is
chosen with --vllm-release, or defaults to the newest moetune knows.
"""

import json
from pathlib import Path

import pytest

from moetune.cli import main
from moetune.engines import names, sglang, vllm
from moetune.engines.tables import TunedConfigError

NAME = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
DOWN = NAME.removesuffix(".json") + "_down.json"
ARGS = ("check", "--model", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--engine", "vllm",
        "--device-name", "NVIDIA_H200")  # fmt: skip
ROW = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
       "num_warps": 4, "num_stages": 3}  # fmt: skip


@pytest.fixture(autouse=True)
def hermetic(monkeypatch, tmp_path):  # noqa: ANN001, ANN201
    for variable in ("VLLM_TUNED_CONFIG_FOLDER", "SGLANG_MOE_CONFIG_DIR", "MOETUNE_MAPPINGS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(names, "detect_device_name", lambda: None)
    monkeypatch.setattr(vllm, "installed", lambda: None)
    monkeypatch.setattr(sglang, "installed", lambda: None)


def run(capsys, *args):  # noqa: ANN001, ANN002, ANN201
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def put(folder: Path, name: str, table: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(table))
    return folder


def test_a_use_tma_file_stops_0_33_and_is_valid_under_0_34(capsys, tmp_path) -> None:  # noqa: ANN001
    folder = put(tmp_path / "cmp", NAME, {"1": dict(ROW, USE_TMA=False), "64": ROW})
    compare = ("--compare-dir", str(folder), "--compare-only")
    code, out, _ = run(capsys, *ARGS, *compare, "--vllm-release", "0.33.0")
    assert code == 4
    invalid = " ".join(line for line in out.splitlines() if "INVALID" in line)
    assert 'batch size 1: config "USE_TMA": vLLM 0.33.0 passes every key' in invalid
    assert "stops the server at start-up" in invalid and "remove USE_TMA" in invalid
    assert "Invalid file for vLLM (exit status 4)." in out
    code, out, _ = run(capsys, *ARGS, *compare, "--vllm-release", "0.34.0")
    assert code == 0, out
    assert f"FOUND: {folder / NAME}" in out and "(checked as vLLM 0.34.0 reads it)" in out


def test_without_vllm_the_file_is_checked_for_the_newest_release(capsys, tmp_path) -> None:  # noqa: ANN001
    folder = put(tmp_path / "cmp", NAME, {"1": dict(ROW, USE_TMA=True)})
    code, out, _ = run(capsys, *ARGS, "--compare-dir", str(folder), "--compare-only")
    assert code == 0
    assert "the vLLM file is for vLLM 0.34.0, the newest release moetune knows" in (
        " ".join(out.split())
    )


def test_0_34_reports_its_down_file_and_when_it_reads_it(capsys, tmp_path) -> None:  # noqa: ANN001
    folder = put(tmp_path / "cmp", NAME, {"1": ROW})
    put(folder, DOWN, {"512": {"USE_TMA": False}, "1024": dict(ROW, USE_TMA=True)})
    compare = ("--compare-dir", str(folder), "--compare-only")
    code, out, _ = run(capsys, *ARGS, *compare, "--vllm-release", "0.34.0")
    text = " ".join(out.split())
    assert code == 0
    assert f"_down file FOUND: {folder / DOWN}" in out
    assert "vLLM 0.34.0 runs the down GEMM on it only with TritonExperts" in text
    assert "compute capability 9.0, DeepGEMM's E8M0 scales in use" in text
    # 0.33 reads no down file: nothing said about it.
    code, out, _ = run(capsys, *ARGS, *compare, "--vllm-release", "0.33.0")
    assert code == 0 and "_down file" not in out and "down GEMM" not in out
    # A down file 0.34 cannot read is a gap, as SGLang's is.
    put(folder, DOWN, {"1024": dict(ROW, USE_TMA="yes")})
    code, out, _ = run(capsys, *ARGS, *compare, "--vllm-release", "0.34.0")
    assert code == 4 and "_down file INVALID" in out and "is not true or false" in out


def test_the_down_file_is_read_but_unused_below_4096_hidden(capsys, tmp_path) -> None:  # noqa: ANN001
    # A block-fp8 checkpoint of hidden size 2048.
    config = json.loads((Path(__file__).parents[1] / "tune/data/tiny-moe/config.json").read_text())
    config.update(hidden_size=2048, intermediate_size=256)
    config["quantization_config"] = {
        "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
    }  # fmt: skip
    put(tmp_path / "model", "config.json", config)
    args = ("check", "--model", str(tmp_path / "model"), "--tp", "1", "--engine", "vllm",
            "--device-name", "NVIDIA_H200", "--vllm-release", "0.34.0")  # fmt: skip
    code, out, _ = run(capsys, *args)
    text = " ".join(out.split())
    assert "block [128, 128]" in text
    assert "runs the down GEMM on the up file here: hidden size 2048 < 4096" in text


def test_an_unknown_release_is_one_line(capsys) -> None:  # noqa: ANN001
    code, out, err = run(capsys, *ARGS, "--vllm-release", "0.99.0")
    assert code == 1
    assert err.strip().splitlines() == [
        "Error: --vllm-release 0.99.0: not a vLLM release moetune knows (known: 0.33.0, 0.34.0)"
    ]


def test_a_down_table_of_guards_only_is_read(tmp_path) -> None:  # noqa: ANN001
    path = put(tmp_path, DOWN, {"1023": {"USE_TMA": False}, "1024": dict(ROW, USE_TMA=True)})
    table = vllm.read_table_for(path / DOWN, "0.34.0", down=True)
    assert table == {1023: {"USE_TMA": False}, 1024: dict(ROW, USE_TMA=True)}
    # In the up file a guard alone is no entry (the kernel needs its tiles).
    put(tmp_path, NAME, {"1": {"USE_TMA": False}})
    with pytest.raises(TunedConfigError, match="batch size 1"):
        vllm.read_table_for(tmp_path / NAME, "0.34.0")
