"""The dtype registry: one `DtypeSpec` per kernel dtype, its engine files from quant_rules.yaml."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from moetune.dtypes import (
    DTYPES,
    DtypeSpec,
    accepted_summary,
    engine_file_dtype,
    engine_file_n,
    engine_write_refusal,
    kernel_variants,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_dtypes_in_their_dtype_option_order():
    assert DTYPES.names() == (
        "bf16",
        "fp16",
        "fp8_w8a8",
        "int8_w8a8",
        "int8_w8a16",
        "int4_w4a16",
    )
    assert DTYPES.quantized() == ("fp8_w8a8", "int8_w8a8", "int8_w8a16", "int4_w4a16")


def test_what_each_dtype_runs_with():
    assert DTYPES.names("block_quant") == ("fp8_w8a8",)
    assert DTYPES.names("group_quant") == ("int4_w4a16",)
    assert DTYPES.names("per_channel") == ("fp8_w8a8", "int8_w8a8")
    assert DTYPES.names("always_per_channel") == ("int8_w8a8",)
    assert DTYPES.names("weight_only") == ("int8_w8a16", "int4_w4a16")
    assert DTYPES.names("quantizes_activations") == ("fp8_w8a8", "int8_w8a8")
    assert DTYPES.names("gptq_awq") == ("int4_w4a16",)
    assert DTYPES.names("static_activations") == ()
    assert DTYPES["int4_w4a16"].default_group_size == 128
    assert DTYPES["int4_w4a16"].pack_factor == 2 and DTYPES["int8_w8a16"].pack_factor == 1
    assert {s.name: s.kernel_revision for s in DTYPES if s.kernel_revision} == {"int4_w4a16": 2}


def test_bytes_and_peaks_per_dtype():
    assert {s.name: s.weight_bytes for s in DTYPES} == {
        "bf16": 2,
        "fp16": 2,
        "fp8_w8a8": 1,
        "int8_w8a8": 1,
        "int8_w8a16": 1,
        "int4_w4a16": 0.5,
    }
    assert {s.name: s.activation_bytes for s in DTYPES} == {
        "bf16": 2,
        "fp16": 2,
        "fp8_w8a8": 1,
        "int8_w8a8": 1,
        "int8_w8a16": 2,
        "int4_w4a16": 2,
    }
    assert {s.name: s.peak_kind for s in DTYPES} == {
        "bf16": "bf16",
        "fp16": "bf16",
        "fp8_w8a8": "fp8",
        "int8_w8a8": "int8",
        "int8_w8a16": "bf16",
        "int4_w4a16": "bf16",
    }


def test_unquantized_follows_the_checkpoint_dtype():
    assert DTYPES.unquantized("float16").name == "fp16"
    assert DTYPES.unquantized("bfloat16").name == "bf16"
    assert DTYPES.unquantized(None).name == "bf16"
    assert DTYPES.unquantized("float32").name == "bf16"
    assert DTYPES["fp8_w8a8"].quant_dtype == "fp8_w8a8" and DTYPES["fp16"].quant_dtype is None


def test_unknown_names_are_not_in_the_registry():
    assert "nvfp4" not in DTYPES and DTYPES.get("nvfp4") is None
    assert ["bf16"] not in DTYPES and DTYPES.get(None) is None
    with pytest.raises(ValueError, match="unknown scale layouts"):
        DtypeSpec("int3_w3a16", 3, 16, scales=("row",))


def test_every_quantized_dtype_is_named_by_the_rules():
    rules = yaml.safe_load((ROOT / "quant_rules.yaml").read_text())
    rows = {name: row for name, row in rules["kernels"].items() if row.get("files")}
    assert {v.name for v in kernel_variants()} == set(rows)
    for name in DTYPES.quantized():
        assert DTYPES[name].variants, f"quant_rules.yaml names no file for {name}"
    for name in DTYPES.names():
        if not DTYPES[name].quantized:
            assert DTYPES[name].variants == ()


def test_engine_files_come_from_the_rules():
    assert engine_file_n("sglang", 768, "int4_w4a16") == 384
    assert engine_file_n("vllm", 768, "int4_w4a16") == 768
    assert engine_file_n("sglang", 768, "bf16") == 768
    assert engine_file_dtype("vllm", "int8_w8a8") is None  # vLLM names it as unquantized
    assert engine_file_dtype("sglang", "int8_w8a8") == "int8_w8a8"
    assert engine_file_dtype("vllm", "fp8_w8a8") == "fp8_w8a8"
    assert "unquantized file name" in engine_write_refusal("vllm", "int8_w8a8", per_channel=True)
    assert engine_write_refusal("sglang", "int8_w8a8", per_channel=True) is None
    # Checkpoints of int8 w8a16 may carry group scales; the kernel runs it per channel only.
    int8_w8a16 = DTYPES["int8_w8a16"]
    assert [v.block for v in int8_w8a16.variants] == ["group"] and not int8_w8a16.group_quant
    assert "group" not in [v.block for v in DTYPES["fp8_w8a8"].variants]


def test_accepted_summary():
    assert accepted_summary() == (
        "bf16, fp16, fp8_w8a8, int8_w8a8, int8_w8a16, int4_w4a16; fp8_w8a8 also "
        "block-quantized; int4_w4a16 also with group scales; fp8_w8a8, int8_w8a8 also "
        "per-channel"
    )


def test_importing_the_registry_reads_no_rules_and_no_torch():
    code = (
        "import sys, moetune.dtypes; "
        "print(sorted(m for m in ('yaml', 'torch', 'triton', 'jsonschema') if m in sys.modules)); "
        "print(sorted(m for m in sys.modules if m.startswith('moetune.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.splitlines()
    assert out == ["[]", "['moetune.dtypes', 'moetune.errors']"]
