"""Property tests of every reader of tuned-config files and their ``_down`` tables.

`read_table` (what `check` and the baselines read), `load_tuned_file` (what
`benchmark --config` reads) and the two commands in-process: a valid table
round-trips with the numbers in the file; anything else (mutated tables, junk
JSON, bytes that are not UTF-8 or not JSON) is one `MoetuneError` line naming the
file, exit 1 (`benchmark`) or INVALID with exit 4 (`check`); never exit 3, never a
traceback.
"""

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from moetune.cli import main
from moetune.engines import names, sglang, vllm
from moetune.engines.tables import TunedConfigError, check_table, definition_for, read_table
from moetune.engines.tuned_file import load_tuned_file
from moetune.errors import MoetuneError
from moetune.kernel.config import Candidate
from moetune.kernel.probe import Probe

MODEL = str(Path(__file__).parent / "tune" / "data" / "tiny-moe")  # E=4, N=32, K=64, top-k 2
VLLM_NAME = "E=4,N=32,device_name=NVIDIA_H200.json"


SIX = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
KNOWN = {*SIX, "USE_TMA", "waves_per_eu", "matrix_instr_nonkdim", "kpack", "SPLIT_K", "num_ctas"}
# An engine reads an entry without num_warps/num_stages (Triton's launch defaults apply).
REQUIRED = SIX[:4]
TILES = (16, 32, 64, 128, 256, 512, 1024)
VALID = {
    "BLOCK_SIZE_M": st.sampled_from(TILES),
    "BLOCK_SIZE_N": st.sampled_from(TILES),
    "BLOCK_SIZE_K": st.sampled_from(TILES),
    "GROUP_SIZE_M": st.integers(1, 4096),
    "num_warps": st.sampled_from((1, 2, 4, 8, 16, 32)),
    "num_stages": st.integers(1, 16),
}
# Values no field takes: wrong types, floats that equal integers, out of range, huge.
NEVER = [-1, 0, 1.5, 64.0, 10**30, -(10**30), 2**63, True, False, None, "64", [], {}, [[[]]]]
OUT_OF_RANGE = {
    "BLOCK_SIZE_M": [4, 48, 2048],  # 8 is legal: the engines' swapped fp8 tiles
    "BLOCK_SIZE_N": [8, 48, 2048],
    "BLOCK_SIZE_K": [8, 48, 2048],
    "GROUP_SIZE_M": [4097],
    "num_warps": [3, 64],
    "num_stages": [17],
}
BAD_KEYS = [
    "²", "١", "٣٢", "0", "-1", "01", " 1", "1 ", "+1", "1.0", "1e3", "", "1\n", "\n1", "x",
    "1_000", "1000000000", "9" * 5000, "TRITON_VERSION",
]  # fmt: skip
BATCH_KEY = re.compile(r"[1-9][0-9]{0,8}")

json_junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def tables(draw, versioned=None):
    """A valid table: a vLLM one (``triton_version``, no USE_TMA) or an SGLang one."""
    versioned = draw(st.booleans()) if versioned is None else versioned
    optional = {} if versioned else {"USE_TMA": st.booleans()}
    entry = st.fixed_dictionaries(VALID, optional=optional)
    rows = draw(
        st.dictionaries(st.integers(1, 999_999_999).map(str), entry, min_size=1, max_size=4)
    )
    return {"triton_version": "3.6.0", **rows} if versioned else rows


@st.composite
def broken_tables(draw):
    """A valid table with one change no engine reads."""
    table = draw(tables())
    rows = [key for key in table if key != "triton_version"]
    key = draw(st.sampled_from(rows))
    entry = dict(table[key])
    kind = draw(
        st.sampled_from(
            [
                "key",
                "value",
                "range",
                "missing",
                "extra",
                "tma",
                "entry",
                "root",
                "empty",
                "version",
            ]
        )
    )
    if kind == "key":
        bad = draw(
            st.sampled_from(BAD_KEYS)
            | st.text(min_size=1, max_size=6).filter(
                lambda k: not BATCH_KEY.fullmatch(k) and k != "triton_version"
            )
        )
        return {bad if k == key else k: v for k, v in table.items()}
    if kind == "value":
        field = draw(st.sampled_from(SIX))
        never = [v for v in NEVER if not (field == "num_stages" and v == 0)]  # 0: ROCm files
        entry[field] = draw(st.sampled_from(never) | json_junk.filter(_not_int))
    elif kind == "range":
        field = draw(st.sampled_from(SIX))
        entry[field] = draw(st.sampled_from(OUT_OF_RANGE[field]))
    elif kind == "missing":
        del entry[draw(st.sampled_from(REQUIRED))]
    elif kind == "extra":
        entry[draw(st.text(max_size=8).filter(lambda k: k not in KNOWN))] = 1
    elif kind == "tma":
        entry["USE_TMA"] = draw(st.sampled_from([0, 1, "true", None, [], {}]))
    elif kind == "entry":
        entry = draw(json_junk.filter(lambda v: not isinstance(v, dict)) | st.just({}))
    elif kind == "root":
        return draw(st.sampled_from([[], "x", 1, None, [table]]) | st.lists(json_junk, max_size=3))
    elif kind == "empty":
        return {"triton_version": "3.6.0"} if draw(st.booleans()) else {}
    elif kind == "version":  # vLLM's version key with a USE_TMA entry, or in a _down table
        return {"triton_version": "3.6.0", **table, key: {**entry, "USE_TMA": False}}
    return {**table, key: entry}


def _not_int(value):
    return isinstance(value, bool) or not isinstance(value, int)


def raw(payload):
    return json.dumps(payload).encode()


@st.composite
def broken_bytes(draw):
    """Bytes that are no tuned table: not UTF-8, cut short, or numbers JSON cannot hold."""
    data = raw(draw(tables()))
    kind = draw(st.sampled_from(["not utf-8", "cut", "digits", "deep"]))
    if kind == "not utf-8":
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + data[at:]
    if kind == "cut":
        return data[: draw(st.integers(0, len(data) - 1))]
    if kind == "digits":
        return b'{"1": {"BLOCK_SIZE_M": ' + b"9" * 5000 + b"}}"
    return b"[" * 100_000 + b"]" * 100_000


def expected(table):
    return {int(k): v for k, v in table.items() if k != "triton_version"}


def assert_one_line(exc, path):
    text = str(exc)
    assert text.startswith(str(path)) and "\n" not in text and "\r" not in text, text


SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(table=tables())
def test_a_valid_table_round_trips_with_its_numbers(tmp_path, table):
    path = tmp_path / VLLM_NAME
    path.write_bytes(raw(table))
    assert read_table(path) == expected(table)
    tuned = load_tuned_file(path)
    for m, entry in expected(table).items():
        six = Candidate(**{k: entry[k] for k in SIX})
        tma = entry.get("USE_TMA", False)
        assert tuned.up[m] == (six, tma)
        # No _down table: SGLang runs the down GEMM with the up row, its USE_TMA included.
        assert tuned.pick(m) == (Probe("pair", six, True, six, True) if tma else six)


@SETTINGS
@given(table=tables(versioned=False), down=tables(versioned=False))
def test_a_valid_down_table_round_trips_beside_its_main_file(tmp_path, table, down):
    path = tmp_path / VLLM_NAME
    path.write_bytes(raw(table))
    down_path = tmp_path / VLLM_NAME.replace(".json", "_down.json")
    down_path.write_bytes(raw(down))
    assert read_table(down_path) == expected(down)
    tuned = load_tuned_file(path)
    assert {m: (c.as_config(), tma) for m, (c, tma) in tuned.down.items()} == {
        m: ({k: entry[k] for k in SIX}, entry.get("USE_TMA", False))
        for m, entry in expected(down).items()
    }


@SETTINGS
@given(payload=broken_tables() | json_junk, down=st.booleans())
@example(payload={"²": dict.fromkeys(SIX, 16)}, down=False)
@example(payload={"1": {**dict.fromkeys(SIX, 16), "num_stages": 10**30}}, down=True)
def test_anything_else_is_one_line_naming_the_file(tmp_path, payload, down):
    # json_junk never makes a table: its keys are too short for the six field names.
    name = VLLM_NAME.replace(".json", "_down.json") if down else VLLM_NAME
    path = tmp_path / name
    path.write_bytes(raw(payload))
    with pytest.raises(TunedConfigError) as info:
        read_table(path)
    assert_one_line(info.value, path)
    if down:  # benchmark reads a _down table beside its main file
        main_file = tmp_path / VLLM_NAME
        main_file.write_bytes(raw({"1": dict.fromkeys(SIX, 16)}))
        path = main_file
    with pytest.raises(MoetuneError) as info:
        # vLLM 0.33 reads no USE_TMA (a vLLM file with it, "version", is legal for 0.34).
        load_tuned_file(path, vllm_release="0.33.0")
    assert "\n" not in str(info.value) and name in str(info.value)


@SETTINGS
@given(data=broken_bytes() | st.binary(max_size=64))
def test_bytes_that_are_not_a_table_are_one_line(tmp_path, data):
    path = tmp_path / VLLM_NAME
    path.write_bytes(data)
    try:
        table = read_table(path)
    except TunedConfigError as exc:
        assert_one_line(exc, path)
    else:  # random bytes that happen to be a table: it is one
        assert table and all(isinstance(m, int) and m >= 1 for m in table)


# The commands, in-process (`moetune.cli.main`: its exit codes, its one-line errors).


@pytest.fixture
def hermetic(monkeypatch):
    for variable in ("VLLM_TUNED_CONFIG_FOLDER", "SGLANG_MOE_CONFIG_DIR", "MOETUNE_MAPPINGS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(names, "detect_device_name", lambda: None)
    monkeypatch.setattr(vllm, "package_config_dir", lambda: None)
    monkeypatch.setattr(sglang, "package_root", lambda: None)


def moetune(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            return exc.code, out.getvalue(), err.getvalue()
    raise AssertionError("main() did not exit")


CLI_SETTINGS = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def files(valid_tables):
    """(bytes, whether they are a valid table)."""
    return st.one_of(
        valid_tables.map(lambda table: (raw(table), True)),
        broken_tables().map(lambda table: (raw(table), False)),
        broken_bytes().map(lambda data: (data, False)),
    )


@CLI_SETTINGS
@given(file=files(tables(versioned=True)))
def test_benchmark_dry_run_exits_0_or_1_with_one_line(hermetic, tmp_path, file):
    data, valid = file
    path = tmp_path / VLLM_NAME
    path.write_bytes(data)
    code, out, err = moetune(
        "benchmark", "-m", MODEL, "--device-name", "NVIDIA_H200", "--engine", "vllm",
        "--batch-size", "1", "--batch-size", "64", "--config", str(path), "--dry-run",
    )  # fmt: skip
    if not valid:
        assert code == 1, (code, err)
        assert err.startswith(f"Error: {path}") and err.count("\n") == 1, err
        return
    assert code == 0, (code, err)
    table = expected(json.loads(data))
    file_lines = [line for line in out.splitlines() if VLLM_NAME in line]
    for line, m in zip(file_lines, (1, 64), strict=True):
        entry = table[min(table, key=lambda key: abs(key - m))]
        assert line.split()[-7:] == f"{VLLM_NAME} {Candidate(**entry).short()}".split()


@CLI_SETTINGS
@given(file=files(tables(versioned=False)))
def test_check_says_found_or_invalid_never_crashes(hermetic, tmp_path, file):
    data, valid = file
    folder = tmp_path / "compare"
    folder.mkdir(exist_ok=True)
    path = folder / VLLM_NAME
    path.write_bytes(data)
    args = ("check", "-m", MODEL, "--device-name", "NVIDIA_H200", "--engine", "sglang")
    code, out, err = moetune(*args, "--compare-dir", str(folder), "--compare-only")
    if not valid:
        assert code == 4, (code, err)
        assert f"  INVALID: {path}: " in out and "FOUND:" not in out
        assert sum("INVALID" in line for line in out.splitlines()) == 1
        return
    assert code == 0, (code, err)
    assert f"  FOUND: {path}\n" in out


def test_an_entry_without_warps_or_stages_reads_as_the_engine_launches_it(tmp_path):
    # SGLang 0.5.23 ships triton_3_7_1 files like this; Triton's launch defaults fill the gap.
    row = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1}
    path = tmp_path / VLLM_NAME
    wide = {**row, "num_warps": 8, "num_ctas": 1, "SPLIT_K": 1}  # keys shipped files carry
    path.write_bytes(raw({"1": row, "64": wide}))
    assert read_table(path) == {1: row, 64: wide}
    tuned = load_tuned_file(path)
    assert [c.short() for c, _ in tuned.up.values()] == [
        "M16 N64 K128 G1 w4 s3",
        "M16 N64 K128 G1 w8 s3",
    ]
    # What moetune writes holds all six keys.
    payload = {"1": row}
    for engine in ("vllm", "sglang"):
        with pytest.raises(TunedConfigError, match="'num_warps' is a required property"):
            check_table(payload, definition_for(payload, engine, down=False, writing=True), "f")
