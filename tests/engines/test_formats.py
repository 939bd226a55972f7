"""The engine-format table: every row names schema definitions that exist, and each
engine's file goes where, and by the name, that engine looks it up."""

from pathlib import Path

import pytest

from moetune.engines import sglang, vllm
from moetune.engines.formats import (
    ENGINE_FORMATS,
    ENGINES,
    engine_format,
    engine_label,
    engines_named,
)
from moetune.engines.tables import definition_for, schema
from moetune.engines.tuned_file import tuned_file_paths
from moetune.errors import TuneError


@pytest.mark.parametrize("engine", ENGINES)
def test_every_schema_definition_a_row_names_exists(engine):
    row = ENGINE_FORMATS[engine]
    defined = schema()["$defs"]
    for down in (False, True):
        for writing in (False, True):
            name = row.schema(down=down, writing=writing)
            assert name in defined  # vLLM 0.34 reads a down table on one serving path


def test_a_file_given_by_name_is_checked_by_its_keys():
    assert definition_for({"triton_version": "3.6.0"}, None, down=False) == "vllm"
    assert definition_for({"1": {}}, None, down=False) == "sglang"
    assert definition_for({"triton_version": "3.6.0"}, None, down=True) == "sglang"
    assert definition_for({}, "sglang", down=True, writing=True) == "sglang_down"
    assert definition_for({}, "vllm", down=True) == "vllm_down"  # vLLM 0.34's sorted path
    assert definition_for({}, "vllm", down=True, writing=True) == "vllm_down_written"


def test_each_engine_finds_the_files_written_for_it(tmp_path):
    args = (8, 7168, "NVIDIA H200 NVL", "fp8_w8a8", (128, 128))
    (vllm_file,) = tuned_file_paths("vllm", tmp_path, *args, triton_version="3.6.0")
    assert vllm_file == tmp_path / vllm.file_name(*args)
    up, down = tuned_file_paths("sglang", tmp_path, *args, triton_version="3.6.0")
    folder = tmp_path / "configs" / sglang.triton_folder("3.6.0")
    assert up == folder / sglang.file_name(*args)
    assert down == folder / sglang.down_name(up.name)


def test_per_channel_is_in_sglangs_name_only(tmp_path):
    args = (8, 512, "NVIDIA H200", "int8_w8a8", None)
    names = {
        engine: tuned_file_paths(
            engine, Path("."), *args, per_channel=True, triton_version="3.6.0"
        )[0].name
        for engine in ENGINES
    }
    assert names == {
        "vllm": "E=8,N=512,device_name=NVIDIA_H200.json",
        "sglang": "E=8,N=512,device_name=NVIDIA_H200,dtype=int8_w8a8,per_channel_quant=True.json",
    }


def test_choices_and_labels():
    assert engines_named("both") == ("vllm", "sglang")
    assert engines_named("sglang") == ("sglang",)
    assert [engine_label(e) for e in ENGINES] == ["vLLM", "SGLang"]
    assert engine_label(None, "all engines") == "all engines"
    assert engine_label("trtllm") == "trtllm"
    with pytest.raises(TuneError, match="unknown engine 'trtllm'; expected one of vllm, sglang"):
        engine_format("trtllm", TuneError)
