"""Engine file names, checked against the formats in vLLM's and SGLang's `get_config_file_name`."""

import pytest

from moetune.engines import names
from moetune.engines.names import (
    sglang_config_filename,
    sglang_config_folder,
    sglang_device_name,
    vllm_config_filename,
    vllm_device_name,
)
from moetune.errors import MoetuneError
from moetune.extract.kernel_dtype import KernelDtype, resolve_kernel_dtype
from moetune.extract.shape import MoEShape

DEEPSEEK_V3 = MoEShape(256, 8, 2048, 7168, 7168, 1, "bfloat16", "fp8", (128, 128))
KIMI_K3 = MoEShape(896, 16, 3072, 7168, 3584, 1, "bfloat16", "compressed-tensors", None)
MIXTRAL_FP16 = MoEShape(8, 2, 14336, 4096, 4096, None, "float16")


@pytest.mark.parametrize(
    "torch_name, vllm, sglang",
    [
        ("NVIDIA H200", "NVIDIA_H200", "NVIDIA_H200"),
        # vLLM folds every H200 variant into one name; SGLang keeps torch's.
        ("NVIDIA H200 NVL", "NVIDIA_H200", "NVIDIA_H200_NVL"),
        ("NVIDIA H200 141GB HBM3e", "NVIDIA_H200", "NVIDIA_H200_141GB_HBM3e"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3", "NVIDIA_H100_80GB_HBM3"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA_A100-SXM4-80GB", "NVIDIA_A100-SXM4-80GB"),
        # GH200 is not an H200: vLLM's test is on the whole "_"-separated word.
        ("NVIDIA GH200 480GB", "NVIDIA_GH200_480GB", "NVIDIA_GH200_480GB"),
        # Already-normalised input passes through unchanged.
        ("NVIDIA_H200", "NVIDIA_H200", "NVIDIA_H200"),
        ("NVIDIA  H100", "NVIDIA_H100", "NVIDIA__H100"),
    ],
)
def test_device_names(torch_name, vllm, sglang):
    assert vllm_device_name(torch_name) == vllm
    assert sglang_device_name(torch_name) == sglang


def test_a_slash_in_a_gpu_name_folds_for_vllm_and_is_refused_for_sglang():
    # vLLM folds each run of whitespace and "/" into one "_". SGLang replaces spaces only,
    # so its name would hold a path separator: a file no SGLang lookup can open, and one
    # moetune would write outside the folder named. It is refused in one line.
    assert vllm_device_name("AMD Instinct MI300X / MI325X") == "AMD_Instinct_MI300X_MI325X"
    with pytest.raises(MoetuneError, match="contains a path separator"):
        sglang_device_name("AMD Instinct MI300X / MI325X")


def test_unquantized_names_have_no_dtype():
    assert (
        vllm_config_filename(112, 3072, "NVIDIA H200")
        == "E=112,N=3072,device_name=NVIDIA_H200.json"
    )
    assert sglang_config_filename(112, 3072, "NVIDIA H200 NVL") == (
        "E=112,N=3072,device_name=NVIDIA_H200_NVL.json"
    )


def test_block_shape_spacing_differs_between_engines():
    assert vllm_config_filename(256, 256, "NVIDIA H200", "fp8_w8a8", (128, 128)) == (
        "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    )
    assert sglang_config_filename(256, 256, "NVIDIA H200", "fp8_w8a8", (128, 128)) == (
        "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    )


def test_zero_block_entry_is_dropped_like_the_engines_do():
    # vLLM's WNA16 path passes [0, group_size]; both engines then omit the block.
    assert vllm_config_filename(8, 7168, "NVIDIA H100", "int4_w4a16", [0, 128]) == (
        "E=8,N=7168,device_name=NVIDIA_H100,dtype=int4_w4a16.json"
    )
    assert sglang_config_filename(8, 7168, "NVIDIA H100", "int4_w4a16", [0, 128]) == (
        "E=8,N=7168,device_name=NVIDIA_H100,dtype=int4_w4a16.json"
    )


def test_int8_w8a8_is_sglang_only():
    assert vllm_config_filename(8, 7168, "NVIDIA H100", "int8_w8a8") == (
        "E=8,N=7168,device_name=NVIDIA_H100.json"
    )
    assert sglang_config_filename(8, 7168, "NVIDIA H100", "int8_w8a8", per_channel_quant=True) == (
        "E=8,N=7168,device_name=NVIDIA_H100,dtype=int8_w8a8,per_channel_quant=True.json"
    )


def test_sglang_down_twin_and_folder():
    assert sglang_config_filename(256, 256, "NVIDIA B200", "fp8_w8a8", [128, 128], down=True) == (
        "E=256,N=256,device_name=NVIDIA_B200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json"
    )
    assert sglang_config_folder("3.4.0") == "configs/triton_3_4_0/"


def test_sglang_dir_hint_follows_the_environment(monkeypatch, tmp_path):
    from moetune.engines import installed

    monkeypatch.delenv("SGLANG_MOE_CONFIG_DIR", raising=False)
    monkeypatch.setattr(installed, "find_installed", lambda engine: None)
    # Not installed: the current release's folder (0.5.11 on)
    assert names.sglang_config_dir_hint("3.6.0") == (
        "$SGLANG_MOE_CONFIG_DIR/configs/triton_3_6_0/, "
        "default sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_6_0/"
    )
    # Installed: the folder that release reads, the one `check` and `--install` use
    old = installed.InstalledEngine(
        "sglang",
        "0.5.10",
        tmp_path,
        None,
        tmp_path / "fused_moe_triton" / "configs",
        None,
        "0.5.10",
    )
    monkeypatch.setattr(installed, "find_installed", lambda engine: old)
    assert names.sglang_config_dir_hint("3.6.0").endswith(
        f", default {tmp_path}/fused_moe_triton/configs/triton_3_6_0/"
    )
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", "")
    assert "set but empty" in names.sglang_config_dir_hint("3.6.0")
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", "/opt/moe")
    assert names.sglang_config_dir_hint("3.6.0") == (
        "/opt/moe/configs/triton_3_6_0/ ($SGLANG_MOE_CONFIG_DIR)"
    )


def test_auto_dtype_from_fp8_block_checkpoint():
    dtype = resolve_kernel_dtype(DEEPSEEK_V3)
    assert (dtype.engine_dtype, dtype.activation_dtype, dtype.block_shape) == (
        "fp8_w8a8",
        "bfloat16",
        (128, 128),
    )
    assert dtype.note is None


def test_auto_dtype_unquantized_keeps_the_activation_dtype():
    dtype = resolve_kernel_dtype(MIXTRAL_FP16)
    assert (dtype.engine_dtype, dtype.activation_dtype, dtype.block_shape) == (
        None,
        "float16",
        None,
    )


def test_auto_dtype_for_a_method_these_files_do_not_serve_says_so():
    dtype = resolve_kernel_dtype(KIMI_K3)
    assert dtype.engine_dtype is None
    assert dtype.activation_dtype == "bfloat16"
    assert "compressed-tensors" in dtype.note and "--dtype" in dtype.note


@pytest.mark.parametrize(
    "requested, engine, activation, block",
    [
        ("bf16", None, "bfloat16", None),
        ("fp16", None, "float16", None),
        ("fp8_w8a8", "fp8_w8a8", "bfloat16", (128, 128)),
        ("int8_w8a16", "int8_w8a16", "bfloat16", None),
    ],
)
def test_dtype_override(requested, engine, activation, block):
    dtype = resolve_kernel_dtype(DEEPSEEK_V3, requested)
    assert (dtype.engine_dtype, dtype.activation_dtype, dtype.block_shape) == (
        engine,
        activation,
        block,
    )
    assert dtype.reason == f"--dtype {requested}"


def test_fp8_override_on_unquantized_checkpoint_is_per_tensor():
    assert resolve_kernel_dtype(MIXTRAL_FP16, "fp8_w8a8").block_shape is None


def test_unknown_dtype_lists_the_choices():
    with pytest.raises(MoetuneError) as exc:
        resolve_kernel_dtype(DEEPSEEK_V3, "fp4")
    assert str(exc.value) == (
        "unknown dtype 'fp4'; choose one of: auto, bf16, fp16, fp8_w8a8, int8_w8a8, "
        "int8_w8a16, int4_w4a16"
    )


def test_detect_device_name_without_nvidia_smi(monkeypatch):
    monkeypatch.setattr(names.shutil, "which", lambda name: None)
    assert names.detect_device_name() is None


def test_detect_device_name_reads_the_first_gpu(monkeypatch, tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200'\necho 'NVIDIA H200'\n")
    smi.chmod(0o755)
    monkeypatch.setattr(names.shutil, "which", lambda name: str(smi))
    assert names.detect_device_name() == "NVIDIA H200"


# `_down` files as they sit in SGLang's configs folders
# (sgl-project/sglang python/sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_5_1/).
SGLANG_DOWN_NAMES = [
    (
        (257, 256, "NVIDIA H200", "fp8_w8a8", [128, 128]),
        "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json",
    ),
    (
        (256, 256, "NVIDIA L40S", "fp8_w8a8", [128, 128]),
        "E=256,N=256,device_name=NVIDIA_L40S,dtype=fp8_w8a8,block_shape=[128, 128]_down.json",
    ),
    (
        (128, 1024, "NVIDIA H100 80GB HBM3", "fp8_w8a8", None),
        "E=128,N=1024,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8_down.json",
    ),
    (
        (128, 192, "K100_AI", "int4_w4a16", None),
        "E=128,N=192,device_name=K100_AI,dtype=int4_w4a16_down.json",
    ),
    ((192, 192, "NVIDIA H20", None, None), "E=192,N=192,device_name=NVIDIA_H20_down.json"),
    ((192, 192, "NVIDIA H20-3e", None, None), "E=192,N=192,device_name=NVIDIA_H20-3e_down.json"),
    ((256, 512, "NVIDIA H20", None, None), "E=256,N=512,device_name=NVIDIA_H20_down.json"),
]


@pytest.mark.parametrize("args, name", SGLANG_DOWN_NAMES, ids=[n for _, n in SGLANG_DOWN_NAMES])
def test_sglang_down_names_match_sglangs_own_files(args, name):
    from moetune.engines.names import sglang_down_config_filename

    assert sglang_down_config_filename(*args) == name
    # The up twin is the same name without the suffix.
    assert sglang_config_filename(*args) == name.replace("_down.json", ".json")


def test_sglang_down_suffix_comes_after_per_channel_quant():
    from moetune.engines.names import sglang_down_config_filename

    assert (
        sglang_down_config_filename(161, 192, "NVIDIA H200", "fp8_w8a8", per_channel_quant=True)
        == "E=161,N=192,device_name=NVIDIA_H200,dtype=fp8_w8a8,per_channel_quant=True_down.json"
    )


# What each engine looks up for each quantized kernel (quant_rules.yaml `kernels`):
# (dtype, block_shape, per_channel) -> vLLM name, SGLang name, for the N each engine keys on
# (SGLang keys int4 on N // 2: dtypes.engine_file_n; tested in test_quant_rules.py).
@pytest.mark.parametrize(
    "dtype, block, per_channel, vllm, sglang",
    [
        ("int4_w4a16", (0, 128), False, ",dtype=int4_w4a16", ",dtype=int4_w4a16"),
        ("int4_w4a16", (0, 32), False, ",dtype=int4_w4a16", ",dtype=int4_w4a16"),
        ("int8_w8a16", (0, 128), False, ",dtype=int8_w8a16", ",dtype=int8_w8a16"),
        ("int8_w8a8", None, True, "", ",dtype=int8_w8a8,per_channel_quant=True"),
        ("fp8_w8a8", None, True, ",dtype=fp8_w8a8", ",dtype=fp8_w8a8,per_channel_quant=True"),
        ("fp8_w8a8", None, False, ",dtype=fp8_w8a8", ",dtype=fp8_w8a8"),
        (
            "fp8_w8a8",
            (128, 128),
            False,
            ",dtype=fp8_w8a8,block_shape=[128,128]",
            ",dtype=fp8_w8a8,block_shape=[128, 128]",
        ),
    ],
)
def test_quantized_name_table(dtype, block, per_channel, vllm, sglang):
    head = "E=128,N=768,device_name=NVIDIA_H200"
    assert vllm_config_filename(128, 768, "NVIDIA H200", dtype, block) == f"{head}{vllm}.json"
    assert sglang_config_filename(
        128, 768, "NVIDIA H200", dtype, block, per_channel_quant=per_channel
    ) == (f"{head}{sglang}.json")


@pytest.mark.parametrize(
    "kernel, refused",
    [
        (KernelDtype(None, "bfloat16", None, "x"), None),
        (KernelDtype("fp8_w8a8", "bfloat16", (128, 128), "x"), None),
        (KernelDtype("int4_w4a16", "float16", (0, 128), "x"), None),
        # int8_w8a16 runs per-channel only: a group-quantized checkpoint is refused.
        (KernelDtype("int8_w8a16", "bfloat16", None, "x"), None),
        (KernelDtype("int8_w8a16", "bfloat16", (0, 128), "x"), "int8_w8a16 group 128"),
        (KernelDtype("fp8_w8a8", "bfloat16", None, "x", per_channel=True), None),
        (KernelDtype("int8_w8a8", "bfloat16", None, "x", per_channel=True), None),
        (
            KernelDtype("fp8_w8a8", "bfloat16", None, "x", static_activations=True),
            "fp8_w8a8 static activation scales",
        ),
    ],
)
def test_tune_refusal_names_the_variant_and_what_is_accepted(kernel, refused):
    message = kernel.tune_refusal()
    if refused is None:
        assert message is None
    else:
        assert f"cannot time {refused} " in message and "--dtype accepts bf16" in message
