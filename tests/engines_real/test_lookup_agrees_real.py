"""moetune's port of each engine's lookup gives the engine's own answer.

The engines' lookup modules import torch, triton and half the engine, so they are
not imported: the released functions (`get_config_file_name`, `get_moe_configs`,
`get_default_config`, `try_get_optimal_moe_config`, ...) are compiled from the
released source file alone, with the names they use from elsewhere stubbed (the
GPU's name, the Triton version, the env, the logger). They then run against the
real shipped config folders, and each answer (file name, the file opened, the
config used at M, SGLang's down config) is compared with moetune's: file names
from `moetune.engines.names`, folders and order from `moetune.engines`, the
row from `nearest_row`, the fallback from `default_config`.

Where the engine imports fully (a real install with its dependencies), the last
test calls its own `get_config_file_name` too.
"""

import __future__

import ast
import json
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moetune.dtypes import engine_file_n
from moetune.engines import sglang, vllm
from moetune.engines.lookup import ENGINE_BATCH_SIZES, load_table, nearest_row
from moetune.engines.names import sglang_config_filename, vllm_config_filename

pytestmark = pytest.mark.engines

DEVICES = ("NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA H100 80GB HBM3", "AMD Instinct MI300X")
# The engines' dtype strings for the file name; vLLM passes None for int8_w8a8.
DTYPES = (None, "fp8_w8a8", "int8_w8a8", "int8_w8a16", "int4_w4a16")
K, TOP_K = 2048, 8
# The tuners' batch sizes, the engines' thresholds around them, and anything else.
BATCH = st.one_of(
    st.sampled_from((*ENGINE_BATCH_SIZES, 3, 5, 20, 21, 40, 41, 65, 97, 513)),
    st.integers(1, 5000),
)
# Made-up shapes no engine ships a file for: every answer is the fallback.
FALLBACK_CASES = [
    (E, dtype, block, M)
    for E in (8, 64, 256)
    for dtype, block in (
        (None, None),
        ("fp8_w8a8", None),
        ("fp8_w8a8", (128, 128)),
        ("fp8_w8a8", (32, 128)),
        ("int8_w8a8", None),
        ("int8_w8a16", None),
        ("int8_w8a16", (0, 128)),
        ("int4_w4a16", (0, 128)),
        ("int4_w4a16", (0, 64)),
    )
    for M in (*ENGINE_BATCH_SIZES, 3, 5, 20, 21, 40, 41, 65, 97, 513)
]


def row(block_m: int) -> dict[str, int]:
    """A table entry both engines read; only its BLOCK_SIZE_M tells the files apart."""
    return {"BLOCK_SIZE_M": block_m, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}


SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


class Log:
    """The engines' logger: remembers what it was told."""

    def __init__(self):
        self.lines = []

    def __getattr__(self, level):
        return lambda message, *args, **kwargs: self.lines.append(
            message % args if args else message
        )


def module_functions(path: Path) -> set[str]:
    """The names of `path`'s module-level functions."""
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}


def compile_functions(path: Path, names: set[str], namespace: dict) -> dict:
    """The module-level functions `names` of `path`, defined in `namespace`, decorators dropped."""
    tree = ast.parse(path.read_text())
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in nodes} == names, f"{path} lacks {names - {n.name for n in nodes}}"
    for node in nodes:
        node.decorator_list = []  # lru_cache / cache: every call must read the disk afresh
    module = ast.Module(body=nodes, type_ignores=[])
    flags = __future__.annotations.compiler_flag  # annotations stay unevaluated
    exec(compile(module, str(path), "exec", flags=flags, dont_inherit=True), namespace)
    return namespace


def stub_modules(monkeypatch, dotted: str, **attributes) -> None:
    """`dotted` and its parents in sys.modules, so an in-function import finds them."""
    parts = dotted.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        module = types.ModuleType(name)
        if depth == len(parts):
            module.__dict__.update(attributes)
        monkeypatch.setitem(sys.modules, name, module)


def w_shapes(E: int, N_file: int):
    """w1 and w2 shapes as the engines' callers pass them (w2's last dim is the file's N)."""
    return (E, 2 * N_file, K), (E, K, N_file)


@dataclass(frozen=True)
class Shape:
    """What an engine keys a file on: N is w2's unpacked last dim, `device` torch's name."""

    E: int
    N: int
    dtype: str | None
    block: tuple[int, int] | None
    per_channel: bool
    device: str


def shipped_shapes(engine: str, folder: Path, pattern: str) -> list[Shape]:
    """The shapes of the shipped files matching `pattern` in `folder` (no _down twins)."""
    shapes = []
    for path in sorted(folder.glob(pattern)):
        stem = path.stem
        if stem.endswith("_down"):
            continue
        block = None
        if ",block_shape=[" in stem:
            stem, rest = stem.split(",block_shape=[")
            inside, stem_tail = rest.split("]", 1)
            block = tuple(int(x) for x in inside.split(","))
            stem += stem_tail
        fields = dict(part.split("=", 1) for part in stem.split(","))
        dtype = fields.get("dtype")
        if dtype not in DTYPES or not fields["device_name"]:
            continue  # SGLang ships "device_name=," files: moetune refuses an empty name
        N = int(fields["N"])
        if engine == "sglang" and dtype == "int4_w4a16":
            N *= 2  # SGLang's int4 file holds the packed N / 2
        shapes.append(
            Shape(
                int(fields["E"]),
                N,
                dtype,
                block,
                fields.get("per_channel_quant") == "True",
                fields["device_name"],
            )
        )
    return sorted(set(shapes), key=repr)


def made_up_shapes(experts, intermediate):
    return st.builds(
        Shape,
        st.sampled_from(experts),
        st.sampled_from(intermediate),
        st.sampled_from(DTYPES),
        st.sampled_from([None, (128, 128), (0, 128)]),
        st.booleans(),
        st.sampled_from(DEVICES),
    )


# vLLM ---------------------------------------------------------------------------------


@pytest.fixture
def vllm_engine(monkeypatch, vllm_installed):
    """vLLM's lookup functions, compiled from the site's fused_moe.py with stubs."""
    root = vllm_installed.root
    device = {"name": DEVICES[0]}
    platform = types.SimpleNamespace(
        get_device_name=lambda device_id=0: device["name"],
        is_cuda=lambda: True,
        is_rocm=lambda: False,
    )
    stub_modules(monkeypatch, "vllm.platforms", current_platform=platform)
    stub_modules(monkeypatch, "vllm.model_executor.layers.fused_moe", get_config=lambda: None)
    helpers = compile_functions(
        root / "utils/platform_utils.py", {"get_device_name_as_file_name"}, {"re": __import__("re")}
    )
    compile_functions(root / "utils/math_utils.py", {"next_power_of_2"}, helpers)
    envs = types.SimpleNamespace(VLLM_TUNED_CONFIG_FOLDER=None, VLLM_BATCH_INVARIANT=False)
    log = Log()
    namespace = {
        "__file__": str(vllm_installed.lookup_source),
        "os": os,
        "json": json,
        "envs": envs,
        "logger": log,
        "current_platform": platform,
        "get_device_name_as_file_name": helpers["get_device_name_as_file_name"],
        "next_power_of_2": helpers["next_power_of_2"],
    }
    names = {
        "get_config_file_name",
        "get_moe_configs",
        "get_default_config",
        "should_moe_wna16_use_cuda",
        "try_get_optimal_moe_config",
    }
    # 0.34.0 split try_get_optimal_moe_config into these helpers.
    names |= {"_get_configured_moe_config", "_moe_config_shape"} & module_functions(
        vllm_installed.lookup_source
    )
    compile_functions(vllm_installed.lookup_source, names, namespace)
    return types.SimpleNamespace(device=device, **namespace)


def moetune_vllm(E, N, dtype, block, M, device, env, configs_dir):
    """(file name, file found, config at M) as moetune's port answers."""
    name = vllm_config_filename(E, engine_file_n("vllm", N, dtype), device, dtype, block)
    found = vllm.lookup(name, env=env, package_configs=configs_dir).found
    if found is not None:
        return name, found, nearest_row(load_table(found), M)
    return name, None, vllm.default_config(M, E, N, K, TOP_K, dtype, block)


def engine_vllm(engine, E, N, dtype, block, M, device):
    engine.device["name"] = device
    engine.logger.lines.clear()
    vllm_dtype = None if dtype == "int8_w8a8" else dtype  # vLLM has no int8_w8a8 string
    block_list = None if block is None else list(block)
    name = engine.get_config_file_name(
        E, N, vllm_dtype, block_list if block and all(block) else None
    )
    # int4 w2 is packed two values a byte: its last dim is N / 2, and vLLM doubles it back.
    w1, w2 = w_shapes(E, N // 2 if dtype == "int4_w4a16" else N)
    config = engine.try_get_optimal_moe_config(w1, w2, TOP_K, vllm_dtype, M, block_list)
    opened = [
        line.split(" ")[3]
        for line in engine.logger.lines
        if line.startswith("Using configuration from")
    ]
    return name, (Path(opened[0]) if opened else None), config


def test_vllm_port_gives_vllms_own_answer(vllm_engine, vllm_installed, tmp_path, monkeypatch):
    user = tmp_path / "user"
    user.mkdir()
    # A user file that shadows a shipped one, with other rows.
    shadow = "E=8,N=14336,device_name=NVIDIA_H200.json"
    (user / shadow).write_text(json.dumps({"3": row(32), "999": row(64)}))
    monkeypatch.chdir(tmp_path)
    shipped = shipped_shapes("vllm", vllm_installed.configs_dir, "*.json")

    @SETTINGS
    @given(
        shape=st.one_of(
            st.sampled_from(shipped), made_up_shapes([8, 16, 64, 128, 256], [128, 768, 2048])
        ),
        M=BATCH,
        folder=st.sampled_from([None, str(user), ""]),
    )
    def agree(shape, M, folder):
        E, N, dtype, block, device = shape.E, shape.N, shape.dtype, shape.block, shape.device
        if dtype == "int4_w4a16" and block is not None and block[0]:
            return  # int4 with an fp8-style block shape: not a configuration either engine runs
        vllm_engine.envs.VLLM_TUNED_CONFIG_FOLDER = folder
        env = {} if folder is None else {"VLLM_TUNED_CONFIG_FOLDER": folder}
        theirs = engine_vllm(vllm_engine, E, N, dtype, block, M, device)
        ours = moetune_vllm(E, N, dtype, block, M, device, env, vllm_installed.configs_dir)
        assert ours[0] == theirs[0]
        assert (ours[1] and ours[1].resolve()) == (theirs[1] and theirs[1].resolve())
        assert ours[2] == theirs[2]

    agree()


def test_vllm_env_folder_as_vllm_reads_it(vllm_engine, vllm_installed, tmp_path, monkeypatch):
    # Unset, a folder, and set but empty (vLLM then opens the bare name, in its cwd).
    name = "E=8,N=14336,device_name=NVIDIA_H200.json"
    user = tmp_path / "user"
    user.mkdir()
    for folder, rows in (
        (user, {"3": row(32)}),
        (tmp_path, {"5": row(64)}),
    ):
        (folder / name).write_text(json.dumps(rows))
    monkeypatch.chdir(tmp_path)
    for folder in (None, str(user), ""):
        vllm_engine.envs.VLLM_TUNED_CONFIG_FOLDER = folder
        env = {} if folder is None else {"VLLM_TUNED_CONFIG_FOLDER": folder}
        theirs = engine_vllm(vllm_engine, 8, 14336, None, None, 4, "NVIDIA H200")
        ours = moetune_vllm(8, 14336, None, None, 4, "NVIDIA H200", env, vllm_installed.configs_dir)
        assert ours[1].resolve() == theirs[1].resolve() and ours[2] == theirs[2], folder


def test_vllm_port_on_every_shipped_h200_file(vllm_engine, vllm_installed):
    shapes = shipped_shapes("vllm", vllm_installed.configs_dir, "*device_name=NVIDIA_H200*.json")
    assert len(shapes) >= 50
    for shape in shapes:
        E, N, dtype, block = shape.E, shape.N, shape.dtype, shape.block
        for M in (1, 3, 100, 4096):
            theirs = engine_vllm(vllm_engine, E, N, dtype, block, M, "NVIDIA H200 NVL")
            ours = moetune_vllm(
                E, N, dtype, block, M, "NVIDIA H200 NVL", {}, vllm_installed.configs_dir
            )
            assert ours[1] is not None and ours == theirs


def test_vllm_fallback_is_vllms_at_every_batch_size(vllm_engine, vllm_installed):
    for E, dtype, block, M in FALLBACK_CASES:
        theirs = engine_vllm(vllm_engine, E, 333, dtype, block, M, "NVIDIA H200")
        ours = moetune_vllm(E, 333, dtype, block, M, "NVIDIA H200", {}, vllm_installed.configs_dir)
        assert theirs[1] is None and ours == theirs, (E, dtype, block, M)


# SGLang -------------------------------------------------------------------------------


@pytest.fixture
def sglang_engine(monkeypatch, sglang_installed):
    """SGLang 0.5.23's lookup functions, compiled from fused_moe_triton_config.py with stubs."""
    device = {"name": DEVICES[0]}
    triton = types.SimpleNamespace(__version__="3.6.0")
    log = Log()
    stub_modules(
        monkeypatch, "sglang.srt.layers.moe.moe_runner.triton_utils", get_config=lambda: None
    )
    deterministic = types.SimpleNamespace(enable_deterministic_inference=False)
    namespace = {
        "__file__": str(sglang_installed.lookup_source),
        "os": os,
        "json": json,
        "triton": triton,
        "logger": log,
        "get_device_name": lambda: device["name"],
        "get_exec": lambda: types.SimpleNamespace(deterministic=deterministic),
        "_is_hip": False,
        "_use_low_smem_fp8_default": lambda: False,
    }
    names = {
        "get_config_file_name",
        "get_moe_configs",
        "get_default_config",
        "try_get_optimal_moe_config",
    }
    compile_functions(sglang_installed.lookup_source, names, namespace)
    return types.SimpleNamespace(device=device, **namespace)


def engine_sglang(engine, E, N, dtype, block, per_channel, M, device, triton_version):
    engine.device["name"] = device
    engine.logger.lines.clear()
    engine.triton.__version__ = triton_version
    N_file = engine_file_n("sglang", N, dtype)
    block_list = None if block is None else list(block)
    name = engine.get_config_file_name(
        E, N_file, dtype, [block[0], block[1]] if block else [0, 0], per_channel
    )
    w1, w2 = w_shapes(E, N_file)
    config, (down, _) = engine.try_get_optimal_moe_config(
        w1, w2, TOP_K, dtype, M, False, block_list, per_channel, return_down_config=True
    )
    return name, config, down


def moetune_sglang(E, N, dtype, block, per_channel, M, device, triton_version, env, installed):
    """(file name, up config at M, down config at M) as moetune's port answers."""
    name = sglang_config_filename(
        E, engine_file_n("sglang", N, dtype), device, dtype, block, per_channel_quant=per_channel
    )
    up, down = sglang.lookup_pair(
        name,
        triton_version,
        env=env,
        package=installed.config_root,
        triton_fallback=installed.triton_fallback,
    )
    if not up.present:
        config = sglang.default_config(M, E, N, K, TOP_K, dtype, block)
        return name, config, None  # no _down file either: the down GEMM runs the up config
    config = nearest_row(load_table(up.found), M)
    # A missing _down file: SGLang reuses the up table for the down GEMM.
    table = load_table(down.found) if down.present else load_table(up.found)
    down_config = dict(nearest_row(table, M))
    down_config["BLOCK_SIZE_M"] = config["BLOCK_SIZE_M"]  # one sort feeds both GEMMs
    return name, config, down_config


@pytest.mark.reads_only("sglang")
def test_sglang_port_gives_sglangs_own_answer(sglang_engine, sglang_installed, tmp_path):
    own_root = tmp_path / "mine"
    (own_root / "configs" / "triton_3_6_0").mkdir(parents=True)
    name = "E=128,N=768,device_name=NVIDIA_H200.json"
    (own_root / "configs" / "triton_3_6_0" / name).write_text(json.dumps({"7": row(16)}))
    shipped = shipped_shapes("sglang", sglang_installed.configs_dir, "triton_*/*.json")

    @SETTINGS
    @given(
        shape=st.one_of(
            st.sampled_from(shipped), made_up_shapes([8, 64, 128, 256, 257], [256, 512, 768])
        ),
        M=BATCH,
        triton_version=st.sampled_from(["3.6.0", "3.9.0", "3.4.0", "3.5.1", "3.1.0"]),
        root=st.sampled_from([None, str(own_root)]),
    )
    def agree(shape, M, triton_version, root):
        args = (shape.E, shape.N, shape.dtype, shape.block, shape.per_channel, M, shape.device)
        env = {} if root is None else {"SGLANG_MOE_CONFIG_DIR": root}
        if root is None:
            os.environ.pop("SGLANG_MOE_CONFIG_DIR", None)
        else:
            os.environ["SGLANG_MOE_CONFIG_DIR"] = root
        try:
            theirs = engine_sglang(sglang_engine, *args, triton_version)
        finally:
            os.environ.pop("SGLANG_MOE_CONFIG_DIR", None)
        assert moetune_sglang(*args, triton_version, env, sglang_installed) == theirs

    agree()


@pytest.mark.reads_only("sglang")
def test_sglang_env_folder_as_sglang_reads_it(
    sglang_engine, sglang_installed, tmp_path, monkeypatch
):
    # Unset, a folder, and set but empty (SGLang then reads configs/ in its cwd).
    name = "E=128,N=768,device_name=NVIDIA_H200.json"
    mine = tmp_path / "mine"
    for root, rows in (
        (mine, {"3": row(32)}),
        (tmp_path, {"5": row(64)}),
    ):
        (root / "configs" / "triton_3_6_0").mkdir(parents=True)
        (root / "configs" / "triton_3_6_0" / name).write_text(json.dumps(rows))
    monkeypatch.chdir(tmp_path)
    for root in (None, str(mine), ""):
        env = {} if root is None else {"SGLANG_MOE_CONFIG_DIR": root}
        if root is None:
            monkeypatch.delenv("SGLANG_MOE_CONFIG_DIR", raising=False)
        else:
            monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", root)
        args = (128, 768, None, None, False, 4, "NVIDIA H200", "3.6.0")
        theirs = engine_sglang(sglang_engine, *args)
        assert moetune_sglang(*args, env, sglang_installed) == theirs, root


@pytest.mark.reads_only("sglang")
def test_sglang_port_on_every_shipped_h200_file(sglang_engine, sglang_installed):
    pattern = "triton_*/*device_name=NVIDIA_H200*.json"
    shapes = shipped_shapes("sglang", sglang_installed.configs_dir, pattern)
    assert len(shapes) >= 20
    for shape in shapes:
        for M, triton_version in ((1, "3.6.0"), (100, "3.9.0"), (4096, "3.2.0")):
            args = (shape.E, shape.N, shape.dtype, shape.block, shape.per_channel, M, shape.device)
            theirs = engine_sglang(sglang_engine, *args, triton_version)
            ours = moetune_sglang(*args, triton_version, {}, sglang_installed)
            assert ours == theirs, (shape, M, triton_version)
            # a file was used, not SGLang's default
            assert not any("default MoE" in line for line in sglang_engine.logger.lines), shape


@pytest.mark.reads_only("sglang")
def test_sglang_fallback_is_sglangs_at_every_batch_size(sglang_engine, sglang_installed):
    for E, dtype, block, M in FALLBACK_CASES:
        args = (E, 334, dtype, block, False, M, "NVIDIA H200", "3.6.0")
        assert moetune_sglang(*args, {}, sglang_installed) == engine_sglang(sglang_engine, *args)


# The engine's own import, where it works -------------------------------------------------


def test_vllms_own_get_config_file_name_where_vllm_imports(monkeypatch):
    """Only on a full vLLM install (torch, its compiled ops): skipped on the fetched files."""
    try:
        from vllm.model_executor.layers.fused_moe import fused_moe
    except Exception as exc:  # noqa: BLE001 - anything that stops the import means "not here"
        pytest.skip(f"vllm does not import here ({type(exc).__name__})")
    monkeypatch.setattr(fused_moe, "get_device_name_as_file_name", lambda: "NVIDIA_H200_NVL")
    for E, N, dtype, block in ((128, 768, None, None), (256, 256, "fp8_w8a8", [128, 128])):
        assert fused_moe.get_config_file_name(E, N, dtype, block) == vllm_config_filename(
            E, N, "NVIDIA H200 NVL", dtype, block
        )
