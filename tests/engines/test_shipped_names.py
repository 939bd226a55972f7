"""moetune's file names are the engines' own: every H200 file vLLM 0.33.0 and SGLang 0.5.23 ship.

tests/fixtures/engines/h200-config-names.txt lists those files (read from the wheels'
configs folders). Each name is taken apart and rebuilt with moetune's name functions;
`make test-engines` also runs the engines' own `get_config_file_name` against them.
"""

from pathlib import Path

import pytest

from moetune.engines.names import sglang_config_filename, vllm_config_filename

NAMES = Path(__file__).resolve().parent.parent / "fixtures" / "engines" / "h200-config-names.txt"


def shipped():
    lines = [line for line in NAMES.read_text().splitlines() if not line.startswith("#")]
    return [tuple(line.split(" ", 2)) for line in lines]


def fields(name: str):
    """(E, N, device, dtype, block, per_channel, down) of a tuned file name."""
    stem = name.removesuffix(".json")
    down = stem.endswith("_down")
    stem = stem.removesuffix("_down")
    block = None
    if ",block_shape=[" in stem:
        stem, rest = stem.split(",block_shape=[")
        inside, tail = rest.split("]", 1)
        block = [int(x) for x in inside.split(",")]
        stem += tail
    parts = dict(part.split("=", 1) for part in stem.split(","))
    per_channel = parts.get("per_channel_quant") == "True"
    return (
        int(parts["E"]),
        int(parts["N"]),
        parts["device_name"],
        parts.get("dtype"),
        block,
        per_channel,
        down,
    )


def test_the_list_covers_both_engines():
    engines = [engine for engine, _, _ in shipped()]
    assert engines.count("vllm") == 52 and engines.count("sglang") >= 70


@pytest.mark.parametrize("engine, folder, name", shipped())
def test_moetune_rebuilds_the_shipped_name(engine, folder, name):
    E, N, device, dtype, block, per_channel, down = fields(name)
    if engine == "vllm":
        assert not per_channel and not down
        # vLLM writes every H200 variant as NVIDIA_H200; torch calls the NVL one this:
        assert vllm_config_filename(E, N, "NVIDIA H200 NVL", dtype, block) == name
        assert vllm_config_filename(E, N, device.replace("_", " "), dtype, block) == name
    else:
        assert folder.startswith("triton_")
        rebuilt = sglang_config_filename(
            E, N, device.replace("_", " "), dtype, block, per_channel_quant=per_channel, down=down
        )
        assert rebuilt == name
