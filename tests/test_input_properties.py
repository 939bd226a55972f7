"""Property tests: whatever config.json or mappings file a user hands in, the answer is clean.

`moetune extract --model FILE` on real configs (moetune/catalog, tests/fixtures/configs)
with values mutated into wrong types, negatives, huge numbers, nulls, nested junk and
missing keys, and `moetune validate FILE` / `extract --mappings FILE` on mutated YAML:
exit 0 with numbers that are the file's, or exit 1/2 with one `Error:` line; never
exit 3, never a traceback, never a hang. The CLI runs in-process (`moetune.cli.main`,
which maps exceptions to exit codes as the installed command does).
"""

import contextlib
import io
import json
import os
import random
import re
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moetune.cli import main
from moetune.engines import names
from moetune.extract.evaluate import text_config_prefix
from moetune.extract.mappings import load_registry
from moetune.extract.paths import MISSING, parse_path, resolve
from moetune.extract.rules import value_problem

ROOT = Path(__file__).resolve().parent.parent
CONFIG_FILES = sorted((ROOT / "moetune" / "catalog").glob("*.json")) + sorted(
    (ROOT / "tests" / "fixtures" / "configs").glob("*.json")
)
CONFIGS = [json.loads(path.read_text()) for path in CONFIG_FILES]
QWEN3 = ROOT / "moetune" / "catalog" / "Qwen__Qwen3-30B-A3B.json"


def _builtin_excerpt():
    """The built-in moe_mappings.yaml cut to a few entries (validating it whole takes 0.1 s)."""
    data = yaml.safe_load((ROOT / "moe_mappings.yaml").read_text())
    data["entries"] = data["entries"][:2] + data["entries"][-2:]
    return yaml.safe_dump(data, sort_keys=False)


MAPPINGS_TEXT = _builtin_excerpt()
SHAPE_PARAMS = ("num_experts", "top_k", "intermediate_size", "hidden_size", "expert_hidden_size")
# Field names the registry reads: mutating these is what reaches the extractor.
MOE_FIELDS = sorted(
    {
        "num_experts",
        "num_local_experts",
        "n_routed_experts",
        "num_experts_per_tok",
        "num_experts_per_token",
        "moe_intermediate_size",
        "intermediate_size",
        "hidden_size",
        "moe_topk",
        "n_shared_experts",
        "num_shared_experts",
        "moe_latent_size",
        "routed_expert_hidden_size",
        "torch_dtype",
        "quantization_config",
        "quant_method",
        "weight_block_size",
        "config_groups",
        "ignore",
        "modules_to_not_convert",
        "bits",
        "group_size",
        "text_config",
        "architectures",
        "model_type",
    }
)
UNKNOWN_KEY_WARNING = re.compile(r": unknown (key|parameter) .* ignored \(known: ")
TIME_LIMIT_S = 10  # one command; the slowest real config takes well under a second

# A few seconds per property; MOETUNE_PROPERTY_EXAMPLES=2000 searches harder.
SETTINGS = settings(
    max_examples=int(os.environ.get("MOETUNE_PROPERTY_EXAMPLES", "60")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, -1, 1, 8, 64, 4096, 4097, 65536, 65537, 10**9])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([8.0, 0.5, -2.0, 1e300])
    | st.text(max_size=6)
    | st.sampled_from(["8", "bfloat16", "", "fp8"])
)
junk = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


@pytest.fixture(autouse=True)
def offline_no_gpu(monkeypatch, tmp_path):
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "MOETUNE_MAPPINGS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(names, "detect_device_name", lambda: None)


def run_cli(*args):
    """(exit code, stdout, stderr, seconds) of `moetune ARGS`, in-process."""
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(arg) for arg in args])
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue(), time.monotonic() - start


def lines_of(text):
    """The lines of a command's output (split on "\\n" only: a message may hold \\x1e)."""
    return text.removesuffix("\n").split("\n") if text else []


def is_warning(line):
    """A mappings file's unknown key, logged and ignored (not an error)."""
    return bool(UNKNOWN_KEY_WARNING.search(line))


def assert_clean_success(err, seconds):
    assert seconds < TIME_LIMIT_S
    assert all(is_warning(line) for line in lines_of(err)), err


def assert_clean_failure(code, out, err, seconds):
    """Exit 1 or 2 with one `Error:` line; for exit 1, nothing else but warnings."""
    assert seconds < TIME_LIMIT_S
    assert "Traceback" not in err
    assert code in (1, 2), err
    assert not any(ord(char) < 32 and char != "\n" for char in err), repr(err)
    error_lines = [line for line in err.split("\n") if line.startswith("Error:")]
    assert len(error_lines) == 1, err
    if code == 1:
        assert out == "", err
        lines = err.split("\n")  # not splitlines(): a message may hold \x1e, not a line break
        assert lines[-1] == "" and lines[-2].startswith("Error:"), err
        assert all(is_warning(line) for line in lines[:-2]), err


# --- (a) the extractor on mutated config.json files -----------------------------


def _containers(config, depth=3):
    """The config and the objects nested in it (text configs, quantization_config...)."""
    found = [config]
    if depth:
        for value in config.values():
            if isinstance(value, dict):
                found += _containers(value, depth - 1)
            elif isinstance(value, list):
                found += [item for item in value[:4] if isinstance(item, dict)]
    return found


@st.composite
def mutated_configs(draw):
    """A real config with a few fields replaced by junk, deleted or added."""
    config = json.loads(json.dumps(draw(st.sampled_from(CONFIGS))))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        container = draw(st.sampled_from(_containers(config)))
        key = draw(st.sampled_from(MOE_FIELDS) | st.sampled_from(sorted(container) or ["x"]))
        action = draw(st.sampled_from(["set", "set", "set", "delete"]))
        if action == "delete":
            container.pop(key, None)
        else:
            container[key] = draw(junk)
    return config


random_configs = st.fixed_dictionaries(
    {
        "architectures": st.lists(
            st.sampled_from(["Qwen3MoeForCausalLM", "X"]) | st.text(max_size=4)
        )
    },
    optional={name: junk for name in MOE_FIELDS if name != "architectures"},
)


def assert_numbers_are_the_files(config, report, registry=None):
    """Every value read from a path is the file's value there, and within its rule; a value
    from a default is used only where the file has nothing on any of the entry's paths
    (transformers' defaults: not even a null)."""
    registry = registry or load_registry()
    entry = next(e for e in registry.entries if e.name == report["entry"])
    prefix = text_config_prefix(config, entry)
    for name in SHAPE_PARAMS:
        value = report[name]
        assert value_problem(registry.rules[name], value) is None, (name, value)
        source = report["sources"][name]
        if source in ("default", "transformers default"):
            alternatives = entry.params.get(name) or entry.params["hidden_size"]
            paths = [parse_path(a).under(prefix) for a in alternatives if isinstance(a, str)]
            found = [resolve(config, path, keep_null=True) for path in paths]
            unset = (MISSING,) if source == "transformers default" else (MISSING, None)
            assert all(value in unset for value in found), (name, source, paths, found)
        else:
            assert resolve(config, source) == value, (name, source)
    assert report["top_k"] <= report["num_experts"]


def _extract(config):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.json"
        path.write_text(json.dumps(config))
        return run_cli("extract", "--model", path, "--json")


def _check_extract(config):
    code, out, err, seconds = _extract(config)
    if code == 0:
        assert err == "" and seconds < TIME_LIMIT_S, err
        assert_numbers_are_the_files(config, json.loads(out))
    else:
        assert_clean_failure(code, out, err, seconds)


@SETTINGS
@given(mutated_configs())
def test_extract_on_mutated_real_configs(config):
    _check_extract(config)


@SETTINGS
@given(random_configs)
def test_extract_on_random_configs(config):
    _check_extract(config)


def test_every_unmutated_config_extracts():
    for path, config in zip(CONFIG_FILES, CONFIGS, strict=True):
        code, out, err, _ = _extract(config)
        assert code == 0, (path, err)
        assert_numbers_are_the_files(config, json.loads(out))


# --- (b) the mappings reader on mutated YAML -----------------------------------

USER_MAPPINGS = """\
version: 1
common_params:
  dtype: [torch_dtype, dtype]
entries:
  - name: qwen3_moe
    description: a user's own Qwen3 entry
    architectures: [Qwen3MoeForCausalLM]
    model_types: qwen3_moe
    params:
      num_experts: [num_experts, {default: 128}]
      top_k: num_experts_per_tok
      intermediate_size: "moe_intermediate_size[0]"
      hidden_size: hidden_size
      num_shared_experts: {default: 0}
"""
TEXT_PIECES = [
    "&a ",
    "*a",
    "<<: ",
    "{default: -5}",
    "{default: 8.0}",
    "{default: true}",
    "[",
    "]",
    "{",
    ": ",
    "- ",
    "\t",
    "\n  ",
    "\n",
    "'",
    '"',
    "#",
    "null",
    "?",
    "!!python/object:os.system ",
    "9" * 5000,
    "\ufeff",
    "é",
]


def _mutate_data(data, rng):
    """Replace one node of a YAML document (a mapping, list or scalar) with something else."""
    if isinstance(data, dict) and data:
        key = rng.choice(list(data))
        if rng.random() < 0.5:
            data[key] = _mutate_data(data[key], rng)
        else:
            data[key] = rng.choice([None, -5, 8.0, True, "x", [], {}, {"default": -1}, [1, [2]]])
        return data
    if isinstance(data, list) and data:
        index = rng.randrange(len(data))
        data[index] = _mutate_data(data[index], rng)
        return data
    return rng.choice([None, -5, 0, 8.0, True, "a.b", "bad path!", {"default": 0}, [], {}])


@st.composite
def mutated_mappings(draw):
    """Bytes of a mappings file: a valid one with its text or its data mutated."""
    base = draw(st.sampled_from([USER_MAPPINGS, MAPPINGS_TEXT]))
    rng = random.Random(draw(st.integers(min_value=0, max_value=2**32)))
    if draw(st.booleans()):
        data = yaml.safe_load(base)
        for _ in range(draw(st.integers(min_value=1, max_value=3))):
            data = _mutate_data(data, rng)
        return yaml.safe_dump(data, sort_keys=False).encode()
    text = base
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        position = draw(st.integers(min_value=0, max_value=len(text)))
        if draw(st.booleans()):
            text = (
                text[:position]
                + draw(st.sampled_from(TEXT_PIECES) | st.text(max_size=4))
                + text[position:]
            )
        else:
            text = text[:position] + text[position + draw(st.integers(0, 20)) :]
    raw = text.encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 9)) == 0:
        raw += b"\xff"
    return raw


@SETTINGS
@given(mutated_mappings())
def test_validate_and_extract_on_mutated_mappings(raw):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "mappings.yaml"
        path.write_bytes(raw)
        code, out, err, seconds = run_cli("validate", path)
        assert seconds < TIME_LIMIT_S and "Traceback" not in err
        assert code in (0, 1), err
        if code == 0:
            assert out == f"{path}: valid\n"
            assert_clean_success(err, seconds)
        else:
            *problems, summary = [line for line in lines_of(err) if not is_warning(line)]
            assert problems and summary.startswith(f"Error: {path}: ")
            assert all(line.startswith(str(path)) for line in problems), err
        ext_code, ext_out, ext_err, seconds = run_cli(
            "extract", "--model", QWEN3, "--mappings", path, "--json"
        )
        if ext_code == 0:
            assert code == 0, "extract took a mappings file that validate refuses"
            assert_clean_success(ext_err, seconds)
            registry = load_registry(str(path))
            assert_numbers_are_the_files(
                json.loads(QWEN3.read_text()), json.loads(ext_out), registry
            )
            return
        assert_clean_failure(ext_code, ext_out, ext_err, seconds)
        error = lines_of(ext_err)[-1]
        if code == 1:  # extract stops at the first problem validate lists
            assert error == f"Error: {problems[0]}"
        else:
            assert not error.startswith(f"Error: {path}")


@SETTINGS
@given(st.binary(max_size=200))
def test_validate_on_random_bytes(raw):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "mappings.yaml"
        path.write_bytes(raw)
        code, out, err, seconds = run_cli("validate", path)
        assert seconds < TIME_LIMIT_S and "Traceback" not in err
        assert code == 1, (out, err)
        assert lines_of(err)[-1].startswith(f"Error: {path}: ")


# --- (c) --space files, summary.json and special files ------------------------------

SPACE_GRID = {"BLOCK_SIZE_M": [16, 32], "BLOCK_SIZE_N": 64, "num_warps": [4, 8], "num_stages": 3}
SPACE_LIST = [
    {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
     "num_warps": 4, "num_stages": 3},
    {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 16,
     "num_warps": 8, "num_stages": 4},
]  # fmt: skip
SPACE_PIECES = ["&a ", "*a", "[", "]", "{", "}", ": ", "- ", "\n  ", "4096", "-1", "1e9", "\ud800"]


@st.composite
def mutated_spaces(draw):
    """(file name, bytes) of a --space file: a valid grid or list with its data or text mutated."""
    base = draw(st.sampled_from([SPACE_GRID, SPACE_LIST]))
    name = draw(st.sampled_from(["space.yaml", "space.json"]))
    rng = random.Random(draw(st.integers(min_value=0, max_value=2**32)))
    data = json.loads(json.dumps(base))
    if draw(st.booleans()):
        for _ in range(draw(st.integers(min_value=1, max_value=3))):
            data = _mutate_data(data, rng)
    text = json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data)
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        position = draw(st.integers(min_value=0, max_value=len(text)))
        text = text[:position] + draw(st.sampled_from(SPACE_PIECES)) + text[position:]
    return name, text.encode("utf-8", "surrogatepass")


@SETTINGS
@given(mutated_spaces())
def test_load_space_on_mutated_space_files(case):
    from moetune.errors import TuneError
    from moetune.tune.search.space import PARAM_NAMES, load_space

    name, raw = case
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(raw)
        start = time.monotonic()
        try:
            candidates = load_space(path)
        except TuneError as exc:
            message = str(exc)
            assert str(path) in message and "\n" not in message, message
            assert "Traceback" not in message
        else:
            assert candidates
            for candidate in candidates:
                assert all(isinstance(getattr(candidate, key), int) for key in PARAM_NAMES)
        assert time.monotonic() - start < TIME_LIMIT_S


EXAMPLE_DIR = ROOT / "examples" / "h200-2026-12-01"


@st.composite
def mutated_summaries(draw):
    """A summary.json document of a real tune, with one to three of its values replaced."""
    document = json.loads((EXAMPLE_DIR / "summary.json").read_text())
    rng = random.Random(draw(st.integers(min_value=0, max_value=2**32)))
    entry = document["shapes"][0]
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        field = draw(st.sampled_from(["plan", "results", "baselines", "ceilings", "files"]))
        if draw(st.booleans()):
            entry[field] = draw(junk)
        else:
            entry[field] = _mutate_data(entry[field], rng)
    return document


@SETTINGS
@given(mutated_summaries(), st.booleans())
def test_report_on_mutated_summary_json(document, with_store):
    with tempfile.TemporaryDirectory() as folder:
        save_dir = Path(folder) / "tuned"
        save_dir.mkdir()
        (save_dir / "summary.json").write_text(json.dumps(document))
        if with_store:
            lines = (EXAMPLE_DIR / "measurements.jsonl").read_text().splitlines(keepends=True)
            (save_dir / "measurements.jsonl").write_text("".join(lines[:150]))
        code, out, err, seconds = run_cli("report", save_dir, "--json")
        assert seconds < TIME_LIMIT_S and "Traceback" not in err
        if code == 0:
            assert json.loads(out)["shapes"]
            assert all(line.startswith("Note: ") for line in lines_of(err)), err
        else:
            assert code == 1, err
            assert lines_of(err)[-1].startswith("Error: "), err


class _Hung(Exception):
    pass


@contextlib.contextmanager
def _alarm(seconds):
    """Raise `_Hung` in the main thread after `seconds`: a blocked open() of a FIFO fails the
    test instead of hanging it."""
    import signal

    def hung(signum, frame):
        raise _Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _special(kind, path):
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "dangling link":
        path.symlink_to(path.with_name("absent"))
    else:  # a link to a character device
        path.symlink_to(kind)


SPECIAL_KINDS = ["fifo", "folder", "dangling link", "/dev/null", "/dev/zero"]
READERS = {
    "--model": lambda p: ["extract", "--model", p],
    "--mappings": lambda p: ["extract", "--model", QWEN3, "--mappings", p],
    "validate": lambda p: ["validate", p],
    "--space": lambda p: ["tune", "--model", QWEN3, "--dry-run", "--space", p, "--save-dir",
                          p.with_name("out")],
    "benchmark --config": lambda p: ["benchmark", "--model", QWEN3, "--dry-run", "--config", p],
}  # fmt: skip


@SETTINGS
@given(st.sampled_from(SPECIAL_KINDS), st.sampled_from(sorted(READERS)))
def test_special_files_as_inputs_are_refused_at_once(kind, reader):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / ("config.json" if reader == "--model" else "input.yaml")
        _special(kind, path)
        with _alarm(TIME_LIMIT_S):
            code, out, err, seconds = run_cli(*READERS[reader](path))
        assert seconds < TIME_LIMIT_S and "Traceback" not in err
        if reader == "validate" and code == 1:  # each problem listed, then a count
            assert lines_of(err)[-1] == f"Error: {path}: 1 problem", err
        else:
            assert_clean_failure(code, out, err, seconds)
        assert "unexpected" not in err
