"""The exact tuned-config file names vLLM and SGLang look up, and where.

Both engines key a tuned fused-MoE config on E (experts on this rank), N
(intermediate size per rank), the GPU name, the kernel dtype string and the
fp8 block shape. They spell two of those differently, which is why both names
are computed here rather than one derived from the other:

    vLLM    E=112,N=3072,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json
    SGLang  E=112,N=3072,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json

- vLLM renames every H200 variant (``NVIDIA H200 NVL``, ``NVIDIA H200 141GB
  HBM3e``) to ``NVIDIA_H200``; SGLang only replaces spaces.
- vLLM strips the space from the block shape; SGLang keeps Python's list repr.
- Neither writes a dtype for bf16/fp16 activations; vLLM has no ``int8_w8a8``
  string (its file carries no dtype then), SGLang does.
- SGLang reads ``configs/triton_X_Y_Z/`` under ``$SGLANG_MOE_CONFIG_DIR`` (or
  its package folder) and may add ``,per_channel_quant=True`` and a ``_down``
  twin for the second GEMM.

This module never imports torch: the device name is passed in as a string.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from moetune.dtypes import DTYPES, engine_file_dtype
from moetune.errors import MoetuneError

# `--dtype` choices (extract and tune): auto and every kernel dtype, from moetune.dtypes.
DTYPE_CHOICES = ("auto", *DTYPES.names())

# Used when no GPU is visible; the CLI says so and `--device-name` overrides it.
FALLBACK_DEVICE_NAME = "NVIDIA H200"

VLLM_SEARCH_PATH = "$VLLM_TUNED_CONFIG_FOLDER/, then vllm/model_executor/layers/fused_moe/configs/"
# The current SGLang release's config root (0.5.11 on); an installed SGLang's own wins.
SGLANG_PACKAGE_DIR = "sglang/srt/layers/moe/moe_runner/triton_utils"


# Longer than any GPU's name, short enough that a tuned file's name stays under 255 bytes.
MAX_DEVICE_NAME_LENGTH = 128


def device_name_problem(device_name: str) -> str | None:
    """Why `device_name` cannot go into a file name, or None when it can.

    A device name becomes part of a file name in --save-dir and the engines'
    folders, so it must be one plain name: not empty, no path separator, no
    "..", no control characters, at most `MAX_DEVICE_NAME_LENGTH` characters. And it must
    be a name the engines look up: not a nickname like ``H100`` (`unknown_device_alias`).
    """
    if not device_name.strip():
        return "is empty"
    if "/" in device_name or "\\" in device_name:
        return "contains a path separator"
    if ".." in device_name:
        return "contains '..'"
    if any(ord(char) < 32 or ord(char) == 127 for char in device_name):
        return "contains a control character"
    if len(device_name) > MAX_DEVICE_NAME_LENGTH:
        return f"is longer than {MAX_DEVICE_NAME_LENGTH} characters"
    return unknown_device_alias(device_name)


# GPU names the engines' tuned files are keyed on (torch.cuda.get_device_name(), spaces
# to "_"): every device name of the files vLLM 0.33.0/0.34.0 and SGLang 0.5.23 ship in
# their configs/ folders, plus the torch names of GPUs they ship none for yet.
KNOWN_DEVICE_NAMES = (
    "AMD_Instinct_MI300X",
    "AMD_Instinct_MI308X",
    "AMD_Instinct_MI325X",
    "AMD_Instinct_MI325_OAM",
    "AMD_Instinct_MI350X",
    "AMD_Instinct_MI350_OAM",
    "AMD_Instinct_MI355X",
    "AMD_Instinct_MI355_OAM",
    "AMD_Radeon_Graphics",
    "AMD_Radeon_R9700",
    "Intel(R)_Arc(TM)_Pro_B60_Graphics",
    "Intel(R)_Arc(TM)_Pro_B70_Graphics",
    "NVIDIA_A100-SXM4-40GB",
    "NVIDIA_A100-SXM4-80GB",
    "NVIDIA_A100_80GB_PCIe",
    "NVIDIA_A800-SXM4-80GB",
    "NVIDIA_B200",
    "NVIDIA_B300_SXM6_AC",
    "NVIDIA_GB10",
    "NVIDIA_GB200",
    "NVIDIA_GB300",
    "NVIDIA_GH200_480GB",
    "NVIDIA_GeForce_RTX_4090",
    "NVIDIA_H100",
    "NVIDIA_H100_80GB_HBM3",
    "NVIDIA_H100_NVL",
    "NVIDIA_H100_PCIe",
    "NVIDIA_H20",
    "NVIDIA_H20-3e",
    "NVIDIA_H200",
    "NVIDIA_H200_NVL",
    "NVIDIA_H800",
    "NVIDIA_L20",
    "NVIDIA_L20Y",
    "NVIDIA_L40S",
    "NVIDIA_RTX_5880_Ada_Generation",
    "NVIDIA_RTX_6000_Ada_Generation",
    "NVIDIA_RTX_PRO_6000_Blackwell_Max-Q_Workstation_Edition",
    "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition",
    "NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition",
    "Radeon_8060S_Graphics",
)
# The first word of every GPU name torch reports on the engines' platforms.
_VENDOR_WORDS = ("NVIDIA", "AMD", "INTEL(R)", "RADEON")
_SUGGESTION = "did you mean"
_MODEL_WORD = re.compile(r"[A-Z]+\d+[A-Z]*")


def _words(name: str) -> list[str]:
    return [word for word in re.split(r"[\s_/-]+", name.strip().upper()) if word]


def unknown_device_alias(device_name: str) -> str | None:
    """Why `device_name` is a GPU's nickname no engine looks a file up under, or None.

    ``H100`` or ``h200`` name a GPU but are not what torch reports (``NVIDIA H100 80GB
    HBM3``, ``NVIDIA H200``): a file written under them is never read. A name that starts
    with a vendor word, or matches no known GPU, is left alone (a GPU newer than this list).
    """
    file_form = re.sub(r"[\s/]+", "_", device_name.strip())
    if file_form in KNOWN_DEVICE_NAMES:
        return None
    same_but_case = [n for n in KNOWN_DEVICE_NAMES if n.upper() == file_form.upper()]
    if same_but_case:
        proper = same_but_case[0].replace("_", " ")
        return (
            f"differs from torch's name in letter case, and the engines compare file "
            f"names exactly: {_SUGGESTION} {proper!r}?"
        )
    words = _words(device_name)
    if not words or words[0] in _VENDOR_WORDS:
        return None
    # The model words (H100, MI300X, B200...) of the name: a known GPU having them all is
    # the one meant ("H100 SXM" is an H100).
    models = {word for word in words if _MODEL_WORD.fullmatch(word)}
    matches = [n for n in KNOWN_DEVICE_NAMES if models and models <= set(_words(n))]
    if not matches:
        return None
    shown = ", ".join(repr(n.replace("_", " ")) for n in matches[:4])
    which = "one of " if len(matches) > 1 else ""
    return (
        "is no name vLLM or SGLang looks a tuned file up under (both use "
        f"torch.cuda.get_device_name(), spaces to '_'): {_SUGGESTION} {which}{shown}?"
    )


def device_name_error(device_name: str, problem: str, source: str = "--device-name") -> str:
    """One line: the name, why it cannot be used, and what to pass instead."""
    if _SUGGESTION in problem:
        return f"{source} {device_name!r} {problem}"
    return (
        f"{source} {device_name!r} {problem}: a GPU name becomes part of a file name; pass "
        "the name torch.cuda.get_device_name() prints, like 'NVIDIA H200'"
    )


def checked_device_name(device_name: str) -> str:
    """`device_name` itself when it can go into a file name; raises `MoetuneError` otherwise."""
    problem = device_name_problem(device_name)
    if problem is not None:
        raise MoetuneError(device_name_error(device_name, problem, "device name"))
    return device_name


def vllm_device_name(device_name: str) -> str:
    """The device name as vLLM writes it: each run of whitespace or ``/`` to one ``_``
    (then checked: `checked_device_name`), every H200 ``NVIDIA_H200``."""
    name = checked_device_name(re.sub(r"[\s/]+", "_", device_name.strip()))
    if "H200" in name.split("_"):
        return "NVIDIA_H200"
    return name


def sglang_device_name(device_name: str) -> str:
    """torch's device name as SGLang writes it: spaces to ``_``, nothing else."""
    return checked_device_name(device_name).strip().replace(" ", "_")


def _block_suffix(block_shape: tuple[int, int] | list[int] | None) -> str:
    # Both engines drop the block shape when it is missing or has a zero entry
    # (vLLM's WNA16 path passes [0, group_size]).
    if not block_shape or not all(block_shape):
        return ""
    return f",block_shape={list(block_shape)}"


def vllm_config_filename(
    E: int,
    N: int,
    device_name: str,
    dtype: str | None = None,
    block_shape: tuple[int, int] | list[int] | None = None,
) -> str:
    """vLLM's `get_config_file_name`: ``E=..,N=..,device_name=..[,dtype=..][,block_shape=[bn,bk]].json``."""
    # vLLM's `_get_config_dtype_str` has no int8_w8a8: such a file carries no dtype
    # (quant_rules.yaml's `kernels:` table says which).
    file_dtype = engine_file_dtype("vllm", dtype) if dtype else None
    dtype_part = f",dtype={file_dtype}" if file_dtype else ""
    block = _block_suffix(block_shape).replace(" ", "")
    return f"E={E},N={N},device_name={vllm_device_name(device_name)}{dtype_part}{block}.json"


def sglang_config_filename(
    E: int,
    N: int,
    device_name: str,
    dtype: str | None = None,
    block_shape: tuple[int, int] | list[int] | None = None,
    *,
    per_channel_quant: bool = False,
    down: bool = False,
) -> str:
    """SGLang's `get_config_file_name`: block shape with a space, optional per-channel and ``_down``.

    E is the caller's: SGLang adds the fused shared experts to it for models
    where it fuses them (DeepSeek-V3 and others), which moetune does not guess.
    """
    dtype_part = f",dtype={dtype}" if dtype else ""
    per_channel = ",per_channel_quant=True" if per_channel_quant else ""
    down_part = "_down" if down else ""
    return (
        f"E={E},N={N},device_name={sglang_device_name(device_name)}"
        f"{dtype_part}{_block_suffix(block_shape)}{per_channel}{down_part}.json"
    )


def sglang_down_config_filename(
    E: int,
    N: int,
    device_name: str,
    dtype: str | None = None,
    block_shape: tuple[int, int] | list[int] | None = None,
    *,
    per_channel_quant: bool = False,
) -> str:
    """SGLang's down-GEMM table next to `sglang_config_filename`: ``_down`` last, before ``.json``.

    ``E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json``
    """
    return sglang_config_filename(
        E, N, device_name, dtype, block_shape, per_channel_quant=per_channel_quant, down=True
    )


# An engine's tuned-file name read back (both engines' spellings, SGLang's _down table too).
_CONFIG_FILE_NAME = re.compile(
    r"E=(?P<E>\d+),N=(?P<N>\d+),device_name=(?P<device_name>[^,]+?)"
    r"(?:,dtype=(?P<dtype>\w+))?(?:,block_shape=\[(?P<block_n>\d+), ?(?P<block_k>\d+)\])?"
    r"(?P<per_channel>,per_channel_quant=True)?(?:_down)?\.json"
)


def config_file_fields(name: str) -> dict[str, str] | None:
    """What an engine's tuned-file name says: E, N, device_name, dtype and block_shape
    (dtype ``-`` for the unquantized kernels), or None for a name no engine writes."""
    match = _CONFIG_FILE_NAME.fullmatch(name)
    if match is None:
        return None
    block = f"[{match['block_n']},{match['block_k']}]" if match["block_n"] else "-"
    return {
        "E": match["E"],
        "N": match["N"],
        "device_name": match["device_name"],
        "dtype": match["dtype"] or "-",
        "block_shape": block,
    }


def sglang_config_folder(triton_version: str) -> str:
    """The folder SGLang reads for a Triton version: ``configs/triton_3_4_0/``."""
    return f"configs/triton_{triton_version.replace('.', '_')}/"


def installed_triton_version() -> str | None:
    """The installed Triton's version from package metadata, without importing triton."""
    from importlib import metadata

    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return None


def detect_device_name() -> str | None:
    """The first GPU's name from ``nvidia-smi`` (same string as torch's), or None.

    Asking torch would import it, which `moetune extract` must not do.
    """
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        result = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0 or not names:
        return None
    return names[0]


def sglang_config_dir_hint(triton_version: str | None) -> str:
    """Where SGLang looks, as one line for humans: the folder `moetune check` searches first.

    The default root is the installed SGLang's (found without importing it), else
    the current release's `SGLANG_PACKAGE_DIR`.
    """
    from moetune.engines.installed import find_installed

    folder = sglang_config_folder(triton_version) if triton_version else "configs/triton_X_Y_Z/"
    root = os.environ.get("SGLANG_MOE_CONFIG_DIR")
    if root:
        return f"{os.path.join(root, folder)} ($SGLANG_MOE_CONFIG_DIR)"
    if root == "":
        return f"{folder} in SGLang's cwd ($SGLANG_MOE_CONFIG_DIR is set but empty)"
    installed = find_installed("sglang")
    default = SGLANG_PACKAGE_DIR if installed is None else str(installed.config_root)
    return f"$SGLANG_MOE_CONFIG_DIR/{folder}, default {default}/{folder}"
