"""Bad input to the commands that read a model: one line and exit 1 or 2, never a guess.

Each case is an exact repro of a fault found by fault injection: a malformed
config value silently replaced by a default, a device name that escapes the
output folder, crashes on deep JSON or a non-UTF-8 mappings file, a YAML alias
bomb that hangs, absurd shapes that tune for minutes, and a mappings literal
that `validate` accepted and `extract` refused.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moetune.cli import main
from moetune.engines import names
from moetune.errors import MoetuneError

REPO_ROOT = Path(__file__).resolve().parent.parent
QWEN3 = REPO_ROOT / "moetune" / "catalog" / "Qwen__Qwen3-30B-A3B.json"
TINY_MOE = REPO_ROOT / "tests" / "tune" / "data" / "tiny-moe"


@pytest.fixture(autouse=True)
def offline_no_gpu(monkeypatch, tmp_path):
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "MOETUNE_MAPPINGS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(names, "detect_device_name", lambda: None)


def run(capsys, *args):
    """Run the CLI in-process as `moetune` does; return (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main([str(arg) for arg in args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def qwen3_with(tmp_path, **fields):
    config = json.loads(QWEN3.read_text())
    config.update(fields)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def error_line(err):
    """The one `Error: ...` line of a failed command (click prints usage lines before it)."""
    lines = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# --- 1. a malformed value is an error, not a fall-through to a default ----------


@pytest.mark.parametrize(
    ("value", "shown"),
    [("8", '"8"'), (0, "0"), (-1, "-1"), (8.0, "8.0"), (True, "true"), ([8], "[8]")],
)
def test_invalid_num_experts_is_an_error_naming_field_path_and_value(
    capsys, tmp_path, value, shown
):
    path = qwen3_with(tmp_path, num_experts=value)
    code, out, err = run(capsys, "extract", "--model", path, "--json")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1
    line = error_line(err)
    assert str(path) in line
    assert f"num_experts is {shown}" in line
    assert "an integer >= 1" in line
    assert "transformers default" not in err and "E=128" not in err


def test_integer_written_as_a_float_says_how_to_write_it(capsys, tmp_path):
    code, _, err = run(capsys, "extract", "--model", qwen3_with(tmp_path, num_experts=8.0))
    assert code == 1
    assert "write 8" in error_line(err)


def test_null_num_experts_is_not_filled_from_transformers_defaults(capsys, tmp_path):
    # config.json's null is what transformers keeps (it does not apply its class default)
    path = qwen3_with(tmp_path, num_experts=None)
    code, out, err = run(capsys, "extract", "--model", path, "--json")
    assert (code, out) == (1, "")
    line = error_line(err)
    assert str(path) in line and "num_experts is null" in line
    assert "set it in config.json" in line


def test_invalid_value_does_not_fall_through_to_a_later_path(capsys, tmp_path):
    # qwen3_moe reads num_experts, then num_local_experts: a bad first value is not skipped
    path = qwen3_with(tmp_path, num_experts="64", num_local_experts=64)
    code, _, err = run(capsys, "extract", "--model", path)
    assert code == 1
    assert 'num_experts is "64"' in error_line(err)


def test_valid_config_is_unchanged(capsys):
    code, out, err = run(capsys, "extract", "--model", QWEN3, "--json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert (report["num_experts"], report["vllm_config_file"]) == (
        128,
        "E=128,N=768,device_name=NVIDIA_H200.json",
    )


# --- 2. --device-name never becomes a path -------------------------------------


BAD_DEVICE_NAMES = ["../../../X", "a/b", "a\\b", "..", "", "   ", "NVIDIA\x00H200", "H200\n"]


@pytest.mark.parametrize("name", BAD_DEVICE_NAMES)
def test_extract_refuses_a_device_name_that_is_not_a_plain_name(capsys, name):
    code, out, err = run(capsys, "extract", "--model", QWEN3, "--device-name", name)
    assert (code, out) == (2, "")
    assert "--device-name" in error_line(err)


@pytest.mark.parametrize("command", ["check", "tune", "benchmark"])
def test_every_command_refuses_a_path_as_device_name(capsys, tmp_path, command):
    extra = {"tune": ["--dry-run", "--save-dir", tmp_path / "out"], "benchmark": ["--dry-run"]}
    code, _, err = run(
        capsys, command, "--model", TINY_MOE, "--device-name", "../../../X", *extra.get(command, [])
    )
    assert code == 2
    assert "--device-name" in error_line(err)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["extract", "check", "tune", "benchmark"])
@pytest.mark.parametrize("name", ["", "  "])
def test_empty_device_name_is_refused_not_replaced_by_the_fallback(capsys, command, name):
    extra = {"tune": ["--dry-run"], "benchmark": ["--dry-run"]}.get(command, [])
    code, out, err = run(capsys, command, "--model", QWEN3, "--device-name", name, *extra)
    assert (code, out) == (2, "")
    assert "NVIDIA_H200" not in err and f"--device-name {name!r} is empty" in err


def test_file_name_builders_refuse_a_path_too():
    # vLLM folds "/" into "_" as vLLM does; the ".." that is left is refused.
    with pytest.raises(MoetuneError, match="contains '..'"):
        names.vllm_config_filename(8, 64, "../x")
    with pytest.raises(MoetuneError, match="path separator"):
        names.sglang_config_filename(8, 64, "a/b")


# --- 3. crashes become one line --------------------------------------------------


def test_deeply_nested_config_json(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"a": ' + "[" * 200_000 + "]" * 200_000 + "}")
    code, out, err = run(capsys, "extract", "--model", path)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1
    assert str(path) in error_line(err) and "nested" in err


def test_integer_too_long_to_read(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"num_experts": ' + "9" * 5000 + "}")
    code, _, err = run(capsys, "extract", "--model", path)
    assert code == 1
    assert str(path) in error_line(err)


def test_mappings_file_that_is_not_utf8(capsys, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_bytes(b"version: 1\nentries: []\n# caf\xe9\n")
    code, _, err = run(capsys, "validate", path)
    assert code == 1
    assert f"{path}: not UTF-8 text" in err and "Traceback" not in err
    code, _, err = run(capsys, "extract", "--model", QWEN3, "--mappings", path)
    assert code == 1
    assert error_line(err).startswith(f"Error: {path}: not UTF-8 text")


# --- 4. YAML alias bombs are refused, not expanded ------------------------------

BILLION_LAUGHS = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(
        f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
        for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
    )
    + "entries: []\n"
)


@pytest.mark.parametrize("command", ["validate", "extract"])
def test_yaml_alias_bomb_is_refused_at_once(tmp_path, command):
    path = tmp_path / "laughs.yaml"
    path.write_text(BILLION_LAUGHS)
    args = (
        [str(path)] if command == "validate" else ["--model", str(QWEN3), "--mappings", str(path)]
    )
    result = subprocess.run(
        [sys.executable, "-m", "moetune", command, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 1
    assert f"{path}:1:4: YAML anchors and aliases are not allowed" in result.stderr
    assert "Traceback" not in result.stderr


# --- 5. shapes larger than any MoE layer are refused up front --------------------


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        ({"num_experts": 1_000_000_000}, "num_experts is 1000000000"),
        ({"hidden_size": 100_000}, "hidden_size is 100000"),
        ({"moe_intermediate_size": 1_000_000}, "intermediate_size is 1000000"),
    ],
)
def test_huge_shape_is_refused_unless_allowed(capsys, tmp_path, fields, shown):
    path = qwen3_with(tmp_path, **fields)
    code, out, err = run(capsys, "extract", "--model", path)
    assert (code, out) == (1, "")
    line = error_line(err)
    assert shown in line and "--allow-huge-shape" in line and str(path) in line
    code, out, err = run(capsys, "extract", "--model", path, "--allow-huge-shape", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["sources"]


def test_huge_experts_are_allowed_and_named_with_the_flag(capsys, tmp_path):
    path = qwen3_with(tmp_path, num_experts=1_000_000_000)
    code, out, _ = run(capsys, "extract", "--model", path, "--allow-huge-shape", "--json")
    assert code == 0
    assert json.loads(out)["vllm_config_file"].startswith("E=1000000000,N=768,")


@pytest.mark.parametrize("command", ["check", "tune", "benchmark"])
def test_every_command_that_extracts_refuses_a_huge_shape(capsys, tmp_path, command):
    config = json.loads((TINY_MOE / "config.json").read_text())
    config["num_local_experts"] = 1_000_000_000
    (tmp_path / "config.json").write_text(json.dumps(config))
    extra = {"tune": ["--dry-run", "--save-dir", tmp_path / "out"], "benchmark": ["--dry-run"]}
    code, _, err = run(capsys, command, "--model", tmp_path, *extra.get(command, []))
    assert code == 1
    assert "--allow-huge-shape" in error_line(err)


def test_top_k_above_the_experts_is_refused(capsys, tmp_path):
    code, _, err = run(capsys, "extract", "--model", qwen3_with(tmp_path, num_experts_per_tok=200))
    assert code == 1
    assert "top_k 200 (from num_experts_per_tok) is more than num_experts 128" in error_line(err)


# --- 6. validate and extract agree on literal defaults ---------------------------

NEGATIVE_DEFAULT = """\
version: 1
entries:
  - name: qwen3_moe
    architectures: [Qwen3MoeForCausalLM]
    params:
      num_experts: [not_there, {default: -5}]
      top_k: num_experts_per_tok
      intermediate_size: moe_intermediate_size
      hidden_size: hidden_size
"""


def test_validate_refuses_the_literal_default_that_extract_refuses(capsys, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(NEGATIVE_DEFAULT)
    expected = (
        f"{path}, line 6: entry 'qwen3_moe', field 'params.num_experts[1].default': "
        "expected an integer >= 1, got -5"
    )
    code, out, err = run(capsys, "validate", path)
    assert code == 1
    assert err.splitlines()[0] == expected
    code, out, err = run(capsys, "extract", "--model", QWEN3, "--mappings", path)
    assert (code, out) == (1, "")
    assert err == f"Error: {expected}\n"


def test_unknown_common_param_is_ignored_with_a_warning_not_a_crash(capsys, caplog, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("version: 1\ncommon_params:\n  d&a type: [torch_dtype, dtype]\nentries: []\n")
    code, out, err = run(capsys, "extract", "--model", QWEN3, "--mappings", path, "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["num_experts"] == 128
    assert "common_params: unknown parameter 'd&a type' ignored" in caplog.text


def test_unknown_architecture_with_control_characters_is_printed_escaped(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["Evil\x1b[2J"], "model_type": "x\x1ey"}))
    code, out, err = run(capsys, "extract", "--model", path)
    assert (code, out) == (1, "")
    assert not any(ord(char) < 32 for char in err.removesuffix("\n")), repr(err)
    assert 'architectures: ["Evil\\u001b[2J"], model_types: ["x\\u001ey"]' in err
    assert "{name: x_y, " in err


# --- 7. a --space file is guarded as a mappings file is --------------------------


def run_moetune(*args, timeout=60):
    """`python -m moetune ARGS` in a subprocess under a timeout: a hang fails the test."""
    result = subprocess.run(
        [sys.executable, "-m", "moetune", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    return result.returncode, result.stdout, result.stderr


def tune_dry_run_with_space(capsys, tmp_path, space):
    return run(
        capsys, "tune", "--model", TINY_MOE, "--dry-run", "--space", space,
        "--save-dir", tmp_path / "out",
    )  # fmt: skip


def test_space_alias_bomb_is_refused_at_once(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(BILLION_LAUGHS.replace("entries: []\n", "BLOCK_SIZE_M: *i\n"))
    code, out, err = run_moetune(
        "tune", "--model", TINY_MOE, "--dry-run", "--space", path, "--save-dir", tmp_path / "o",
        timeout=20,
    )  # fmt: skip
    assert code == 1
    assert error_line(err) == (
        f"Error: search space {path}:1:4: YAML anchors and aliases are not allowed in a "
        "search space (an alias can expand without bound); write the values out"
    )


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("space.yaml", "BLOCK_SIZE_M: " + "[" * 100_000 + "]" * 100_000 + "\n"),
        ("space.yaml", "".join("  " * depth + "- \n" for depth in range(5000))),
        ("space.json", '{"BLOCK_SIZE_M": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    ],
)
def test_deeply_nested_space_is_one_line(capsys, tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    code, out, err = tune_dry_run_with_space(capsys, tmp_path, path)
    assert (code, out) == (1, "")
    line = error_line(err)
    assert f"search space {path}" in line and "RecursionError" not in line


def test_a_list_of_a_million_configs_is_refused_at_once(tmp_path):
    config = (
        '{"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, '
        '"GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}'
    )
    path = tmp_path / "space.json"
    path.write_text("[" + ", ".join([config] * 1_000_000) + "]")
    started = time.monotonic()
    code, _, err = run_moetune(
        "tune", "--model", TINY_MOE, "--dry-run", "--space", path, "--save-dir", tmp_path / "o",
        timeout=30,
    )  # fmt: skip
    assert code == 1
    assert error_line(err).startswith(f"Error: cannot read search space {path}: 108.7 MiB, more ")
    assert time.monotonic() - started < 10


def test_a_short_list_of_too_many_configs_and_a_huge_grid_are_refused(capsys, tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("".join(f"- {{BLOCK_SIZE_M: {i}}}\n" for i in range(20_000)))
    code, _, err = tune_dry_run_with_space(capsys, tmp_path, path)
    assert code == 1
    assert "a list of 20,000 configs, more than the 10,000 a search space may hold" in (
        error_line(err)
    )
    path.write_text(f"GROUP_SIZE_M: {list(range(1, 4097))}\nnum_stages: {list(range(1, 17))}\n")
    code, _, err = tune_dry_run_with_space(capsys, tmp_path, path)
    assert code == 1
    assert "a grid of 7,864,320 configs, more than the 100,000 a search space may hold" in (
        error_line(err)
    )


def test_a_space_that_is_not_utf8_is_one_line(capsys, tmp_path):
    path = tmp_path / "space.yaml"
    path.write_bytes(b"BLOCK_SIZE_M: 16 # caf\xe9\n")
    code, _, err = tune_dry_run_with_space(capsys, tmp_path, path)
    assert code == 1
    assert error_line(err) == f"Error: search space {path} is not UTF-8 text"


# --- 8. a large mappings file is validated fast, a huge one refused at once -------


def _entries_yaml(count):
    return "version: 1\nentries:\n" + "".join(
        f"  - name: arch_{i}\n    architectures: [Arch{i}ForCausalLM]\n"
        f"    model_types: [arch_{i}]\n    params:\n"
        "      num_experts: [num_experts, num_local_experts]\n"
        "      top_k: num_experts_per_tok\n"
        "      intermediate_size: moe_intermediate_size\n"
        "      hidden_size: hidden_size\n"
        for i in range(count)
    )


def test_a_mappings_file_of_20000_entries_validates_in_seconds(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(_entries_yaml(20_000))
    started = time.monotonic()
    code, out, err = run_moetune("validate", path, timeout=60)
    assert (code, out.strip(), err) == (0, f"{path}: valid", "")
    assert time.monotonic() - started < 20  # 2.5 s of CPU here; 29 s before


def test_a_mappings_file_of_200000_entries_is_refused_at_once(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(_entries_yaml(200_000))
    started = time.monotonic()
    code, _, err = run_moetune("extract", "--model", QWEN3, "--mappings", path, timeout=30)
    assert code == 1
    assert error_line(err) == (
        f"Error: {path}: cannot read mappings file (51.4 MiB, more than the 8 MiB such a file "
        "can be)"
    )
    assert time.monotonic() - started < 10


def test_an_entry_of_a_shape_seen_before_is_still_checked_where_it_differs(capsys, tmp_path):
    # Entries of one shape are schema-checked once: a bad name or path among them is not.
    text = _entries_yaml(50).replace("name: arch_40\n", "name: arch 40\n")
    text = text.replace("[Arch45ForCausalLM]", "[]")
    path = tmp_path / "m.yaml"
    path.write_text(text.replace("top_k: num_experts_per_tok\n", "top_k: num experts\n", 1))
    code, _, err = run(capsys, "validate", path)
    assert code == 1
    problems = err.splitlines()[:-1]
    assert len(problems) == 3, err
    assert "entry 'arch_0', field 'params.top_k'" in problems[0]
    assert "entry 'arch 40', field 'name'" in problems[1]
    assert "entry 'arch_45', field 'architectures'" in problems[2]


# --- 9. a lone surrogate and a full stdout are one line, never exit 3 --------------


@pytest.mark.parametrize("field", ["architectures", "model_type"])
def test_a_lone_surrogate_in_the_config_is_one_line(capsys, tmp_path, field):
    path = tmp_path / "config.json"
    config = json.loads(QWEN3.read_text())
    config[field] = ["Qwen3MoeForCausalLM\ud800"] if field == "architectures" else "qwen3\udc00"
    path.write_text(json.dumps(config))  # ensure_ascii writes the \ud800 escape
    code, out, err = run(capsys, "extract", "--model", path)
    assert (code, out) == (1, "")
    assert "a lone surrogate: not valid Unicode" in error_line(err)
    assert str(path) in error_line(err)


@pytest.mark.parametrize(
    "args", [["extract", "--model", QWEN3], ["extract", "--model", QWEN3, "--json"],
             ["archs", "--help"], ["--help"], ["archs"]],
)  # fmt: skip
def test_a_full_stdout_is_one_line_and_exit_1(args):
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "moetune", *map(str, args)],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env={"PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        )
    assert result.returncode == 1
    assert result.stderr == "Error: cannot write to stdout: No space left on device\n"
