import json
import os

import pytest

from moetune.engines.tuned_file import file_payload, validate_tuned_config
from moetune.errors import TuneError
from moetune.kernel.config import Candidate
from moetune.tune.output import engine_tables, write_engine_files
from moetune.tune.problem import TuneProblem

SMALL = Candidate(16, 64, 128, 1, 4, 3)
MEDIUM = Candidate(64, 128, 64, 16, 4, 3)
LARGE = Candidate(128, 256, 64, 16, 8, 4)
RESULTS = {1024: LARGE, 1: SMALL, 64: MEDIUM, 8: SMALL}


def engine_lookup(path, batch_size):
    """What vLLM's get_moe_configs + try_get_optimal_moe_config do: nearest batch-size key."""
    with open(path) as handle:
        configs = json.load(handle)
    configs.pop("triton_version", None)
    configs = {int(key): value for key, value in configs.items()}
    return configs[min(configs, key=lambda m: abs(m - batch_size))]


def test_vllm_payload_has_the_version_first_and_numeric_key_order():
    (table,) = engine_tables("vllm", RESULTS)
    payload = file_payload("vllm", table, "3.6.0")
    assert list(payload) == ["triton_version", "1", "8", "64", "1024"]
    assert payload["64"] == {
        "BLOCK_SIZE_M": 64,
        "BLOCK_SIZE_N": 128,
        "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 16,
        "num_warps": 4,
        "num_stages": 3,
    }


def test_sglang_payload_has_no_version_key():
    up, down = engine_tables("sglang", RESULTS)
    assert list(file_payload("sglang", up, "3.6.0")) == ["1", "8", "64", "1024"]
    assert list(file_payload("sglang", down, "3.6.0", down=True)) == ["1", "8", "64", "1024"]


def test_write_engine_files_uses_each_engines_name_and_folder(tmp_path):
    problem = TuneProblem(256, 256, 7168, 8, "fp8_w8a8", (128, 128))
    vllm, sglang, sglang_down = write_engine_files(
        RESULTS, problem, "NVIDIA H200 NVL", "3.6.0", tmp_path
    )
    assert sglang_down == sglang.with_name(sglang.name.replace(".json", "_down.json"))
    assert (
        vllm
        == tmp_path
        / "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    )
    assert sglang == (
        tmp_path
        / "configs"
        / "triton_3_6_0"
        / "E=256,N=256,device_name=NVIDIA_H200_NVL,dtype=fp8_w8a8,block_shape=[128, 128].json"
    )
    assert json.loads(vllm.read_text())["triton_version"] == "3.6.0"
    assert "triton_version" not in json.loads(sglang.read_text())
    # indent=4 and a trailing newline, like the engines' own tuners write.
    assert vllm.read_text().startswith('{\n    "triton_version": "3.6.0",\n    "1": {\n')
    assert vllm.read_text().endswith("}\n")


def test_unquantized_files_carry_no_dtype(tmp_path):
    paths = write_engine_files(
        RESULTS, TuneProblem(128, 768, 2048, 8, "bf16"), "NVIDIA H200", "3.6.0", tmp_path, ("vllm",)
    )
    assert [p.name for p in paths] == ["E=128,N=768,device_name=NVIDIA_H200.json"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_written_files_round_trip_through_an_engine_style_lookup(tmp_path, engine):
    problem = TuneProblem(8, 7168, 4096, 2, "bf16")
    path, *_ = write_engine_files(RESULTS, problem, "NVIDIA H200", "3.6.0", tmp_path, (engine,))
    validate_tuned_config(path, engine)
    assert engine_lookup(path, 1) == SMALL.as_config()
    assert engine_lookup(path, 5) == SMALL.as_config()  # nearest is 8
    assert engine_lookup(path, 40) == MEDIUM.as_config()  # |40-64| < |40-8|
    assert engine_lookup(path, 600) == LARGE.as_config()  # |600-1024| < |600-64|
    assert engine_lookup(path, 100_000) == LARGE.as_config()


def test_writes_leave_no_temporary_files(tmp_path):
    problem = TuneProblem(8, 7168, 4096, 2, "bf16")
    write_engine_files(RESULTS, problem, "NVIDIA H200", "3.6.0", tmp_path)
    write_engine_files(RESULTS, problem, "NVIDIA H200", "3.6.0", tmp_path)  # overwrite
    names = [name for _, _, files in os.walk(tmp_path) for name in files]
    assert sorted(names) == [
        "E=8,N=7168,device_name=NVIDIA_H200.json",
        "E=8,N=7168,device_name=NVIDIA_H200.json",
        "E=8,N=7168,device_name=NVIDIA_H200_down.json",
    ]
    assert not [n for n in names if n.startswith(".") or n.endswith(".tmp")]


def test_an_invalid_payload_is_never_written(tmp_path):
    with pytest.raises(TuneError, match="no tuned batch sizes"):
        write_engine_files(
            {}, TuneProblem(8, 7168, 4096, 2, "bf16"), "NVIDIA H200", "3.6.0", tmp_path
        )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "payload, engine, message",
    [
        (
            {"1": {**SMALL.as_config(), "num_stages": "3"}},
            "vllm",
            "batch size 1: config \"num_stages\": '3' is not of type 'integer'",
        ),
        (
            {"1": {k: v for k, v in SMALL.as_config().items() if k != "num_warps"}},
            "vllm",
            "batch size 1: config: 'num_warps' is a required property",
        ),
        (
            {"1": {**SMALL.as_config(), "BLOCK_SIZE_M": 48}},
            "sglang",
            'batch size 1: config "BLOCK_SIZE_M": 48 is not one of',
        ),
        (
            {"triton_version": "3.6.0", "1": SMALL.as_config()},
            "sglang",
            'key "triton_version" is not allowed',
        ),
        ({"one": SMALL.as_config()}, "vllm", 'key "one" is not a batch size'),
        ({"triton_version": "3.6.0"}, "vllm", "it holds no batch sizes"),
        ({}, "sglang", "it holds no batch sizes"),
        ([1, 2], "vllm", "expected a JSON object keyed by batch size, got an array"),
    ],
)
def test_schema_rejects_malformed_files(tmp_path, payload, engine, message):
    path = tmp_path / "E=8,N=7168,device_name=NVIDIA_H200.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(TuneError) as info:
        validate_tuned_config(path, engine)
    text = str(info.value)
    assert text.startswith(f"{path}: ")
    assert message in text
    assert "\n" not in text


def test_validate_reports_unreadable_files(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"1": ')
    with pytest.raises(TuneError, match="broken.json: cannot read a tuned config: not valid JSON"):
        validate_tuned_config(path, "vllm")
    with pytest.raises(TuneError, match="cannot read"):
        validate_tuned_config(tmp_path / "missing.json", "vllm")


def test_vllms_published_h200_files_validate():
    # A real vLLM file (bench/vllm_configs, copied from vLLM): no triton_version key.
    path = os.path.join(
        os.path.dirname(__file__),
        "..",
        "..",
        "bench",
        "vllm_configs",
        "E=128,N=768,device_name=NVIDIA_H200.json",
    )
    validate_tuned_config(path, "vllm")
    validate_tuned_config(path, "sglang")


def test_check_space_takes_the_default_grid_and_refuses_what_no_file_holds():
    from moetune.tune.output import check_space
    from moetune.tune.search.space import default_space

    assert check_space(default_space(), "default") == default_space()
    with pytest.raises(TuneError, match=r'space.json: M16 N64 K128 G5000 w4 s3: "GROUP_SIZE_M"'):
        check_space([SMALL, Candidate(16, 64, 128, 5000, 4, 3)], "space.json")
