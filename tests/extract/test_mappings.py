"""Loading, validating, merging and matching moe_mappings.yaml (moetune.extract.mappings)."""

import json
import logging
from pathlib import Path

import pytest
import yaml

from moetune.errors import InvalidMappingsError, UnknownArchitectureError
from moetune.extract.evaluate import extract_shape
from moetune.extract.mappings import (
    Default,
    builtin_mappings_path,
    load_registry,
    schema_path,
    validate_file,
)

ROOT = Path(__file__).resolve().parents[2]

MINIMAL_ENTRY = """\
version: 1
entries:
  - name: foo_moe
    architectures: [FooMoeForCausalLM]
    model_types: [foo_moe]
    params:
      num_experts: n_experts
      top_k: k
      intermediate_size: expert_width
      hidden_size: width
"""

FOO_CONFIG = {
    "architectures": ["FooMoeForCausalLM"],
    "model_type": "foo_moe",
    "n_experts": 24,
    "k": 3,
    "expert_width": 640,
    "width": 1280,
}


@pytest.fixture
def write(tmp_path):
    def _write(text, name="mappings.yaml"):
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return _write


@pytest.fixture(autouse=True)
def no_user_mappings(monkeypatch):
    monkeypatch.delenv("MOETUNE_MAPPINGS", raising=False)


def test_builtin_file_is_valid_and_shipped_through_the_package():
    assert validate_file(builtin_mappings_path()) == []
    # the package's copies are symlinks to the repository's sources of truth
    assert builtin_mappings_path().resolve() == (ROOT / "moe_mappings.yaml").resolve()
    assert schema_path().resolve() == (ROOT / "schemas" / "moe_mappings.schema.json").resolve()


def test_builtin_registry_shape():
    registry = load_registry()
    names = registry.names()
    assert len(names) == len(set(names))
    assert registry.entries[-1].fallback
    assert [entry.name for entry in registry.entries if entry.fallback] == ["generic"]
    assert registry.source_files == (str(builtin_mappings_path()),)
    # common_params are inherited: every entry can read dtype and quantization
    assert all("dtype" in entry.params for entry in registry.entries)


def test_no_architecture_claimed_twice():
    seen = {}
    for entry in load_registry().entries:
        for name in entry.architectures + entry.model_types:
            assert name not in seen, f"{name} in {seen.get(name)} and {entry.name}"
            seen[name] = entry.name


def test_malformed_yaml_names_file_and_line(write):
    path = write("version: 1\nentries:\n  - name: x\n    params: {a: [b\n")
    assert validate_file(path) == [
        f"{path}:5:1: malformed YAML (while parsing a flow sequence did not find expected ',' or ']')"
    ]
    with pytest.raises(InvalidMappingsError) as exc:
        load_registry(path)
    assert str(exc.value) == validate_file(path)[0]


def test_schema_violation_names_file_line_entry_field_expected_and_got(write):
    path = write(MINIMAL_ENTRY.replace("top_k: k", "top_k: 5"))
    assert validate_file(path) == [
        f"{path}, line 8: entry 'foo_moe', field 'params.top_k': expected a dotted path like "
        "'text_config.num_experts' or 'moe_topk[0]', a literal {default: value}, or a list of "
        "them (the first that resolves wins), got 5"
    ]


def test_bad_path_syntax_is_a_schema_violation(write):
    path = write(MINIMAL_ENTRY.replace("top_k: k", "top_k: [k, a..b]"))
    problems = validate_file(path)
    assert len(problems) == 1
    assert problems[0].startswith(
        f"{path}, line 8: entry 'foo_moe', field 'params.top_k[1]': expected"
    )
    assert problems[0].endswith('got "a..b"')


def test_missing_required_parameter(write):
    path = write(MINIMAL_ENTRY.replace("      hidden_size: width\n", ""))
    assert validate_file(path) == [
        f"{path}, line 7: entry 'foo_moe', field 'params.hidden_size': missing (required)"
    ]


def test_entry_must_say_what_it_matches(write):
    path = write(
        MINIMAL_ENTRY.replace("    architectures: [FooMoeForCausalLM]\n", "").replace(
            "    model_types: [foo_moe]\n", ""
        )
    )
    assert validate_file(path) == [
        f"{path}, line 3: entry 'foo_moe': expected architectures, model_types or 'fallback: true' "
        "(an entry must say what it matches), got an object with keys name, params"
    ]


def test_not_a_mapping_and_unreadable(write, tmp_path):
    path = write("entries: {}\n")
    assert validate_file(path) == [
        f"{path}, line 1: field 'entries': expected a list of entries, in priority order, "
        "got an object with keys (none)"
    ]
    path = write("- a\n- b\n", "list.yaml")
    assert validate_file(path) == [
        f'{path}, line 1: expected a mapping with a list of \'entries\', got ["a", "b"]'
    ]
    missing = tmp_path / "absent.yaml"
    assert validate_file(missing) == [
        f"{missing}: cannot read mappings file (No such file or directory)"
    ]


def test_duplicate_names_and_two_fallbacks(write):
    generic = "  - name: g{0}\n    fallback: true\n    params: {{num_experts: a, top_k: b, intermediate_size: c, hidden_size: d}}\n"
    text = (
        MINIMAL_ENTRY + MINIMAL_ENTRY.split("entries:\n")[1] + generic.format(1) + generic.format(2)
    )
    path = write(text)
    assert validate_file(path) == [
        f"{path}: entry 'foo_moe': duplicate entry name",
        f"{path}: more than one fallback entry (g1, g2)",
    ]


def test_unknown_keys_warn_but_load(write, caplog):
    text = MINIMAL_ENTRY.replace("    params:\n", "    colour: blue\n    params:\n      topk: k\n")
    path = write("flavour: 1\n" + text)
    with caplog.at_level(logging.WARNING, logger="moetune.extract.mappings"):
        assert validate_file(path) == []
    known_params = (
        "num_experts, top_k, intermediate_size, hidden_size, expert_hidden_size, "
        "num_shared_experts, dtype, quant_method, weight_block_size"
    )
    assert caplog.record_tuples == [
        (
            "moetune.extract.mappings",
            logging.WARNING,
            f"{path}: top level: unknown key 'flavour' ignored (known: version, parameters, common_params, entries)",
        ),
        (
            "moetune.extract.mappings",
            logging.WARNING,
            f"{path}: entry 'foo_moe': unknown key 'colour' ignored (known: name, description, "
            "notes, architectures, model_types, text_config, fallback, params)",
        ),
        (
            "moetune.extract.mappings",
            logging.WARNING,
            f"{path}: entry 'foo_moe': unknown parameter 'topk' ignored (known: {known_params})",
        ),
    ]
    entry = load_registry(path).match(FOO_CONFIG)[0]
    assert "topk" not in entry.params


def test_new_architecture_through_a_user_file_needs_no_code(write):
    path = write(MINIMAL_ENTRY)
    registry = load_registry(path)
    assert registry.source_files == (str(builtin_mappings_path()), path)
    assert registry.names()[0] == "foo_moe"
    extraction = extract_shape(FOO_CONFIG, registry)
    assert extraction.entry == "foo_moe" and not extraction.guessed
    shape = extraction.shape
    assert (shape.num_experts, shape.top_k, shape.intermediate_size, shape.hidden_size) == (
        24,
        3,
        640,
        1280,
    )
    assert extraction.sources == {
        "num_experts": "n_experts",
        "top_k": "k",
        "intermediate_size": "expert_width",
        "hidden_size": "width",
        "expert_hidden_size": "width",
    }


def test_environment_variable_and_explicit_path(write, monkeypatch):
    path = write(MINIMAL_ENTRY)
    monkeypatch.setenv("MOETUNE_MAPPINGS", path)
    assert load_registry().names()[0] == "foo_moe"
    other = write(MINIMAL_ENTRY.replace("foo_moe", "bar_moe"), "other.yaml")
    assert load_registry(other).names()[0] == "bar_moe"


def test_user_entry_replaces_builtin_of_the_same_name(write):
    text = MINIMAL_ENTRY.replace("name: foo_moe", "name: mixtral").replace(
        "architectures: [FooMoeForCausalLM]", "architectures: [MixtralForCausalLM]"
    )
    registry = load_registry(write(text))
    assert registry.names().count("mixtral") == 1
    entry, _ = registry.match({"architectures": ["MixtralForCausalLM"]})
    assert entry.params["num_experts"] == ("n_experts",)


def test_replace_uses_the_user_file_alone(write):
    registry = load_registry(write(MINIMAL_ENTRY), replace=True)
    assert registry.names() == ["foo_moe"]
    with pytest.raises(UnknownArchitectureError) as exc:
        registry.match({"architectures": ["FooMoeForCausalLm"], "model_type": "foo"})
    assert str(exc.value) == (
        "unknown architecture 'FooMoeForCausalLm' model_type 'foo'; close matches: "
        "FooMoeForCausalLM, foo_moe; add an entry to moe_mappings.yaml (or a --mappings file): "
        "{name: foo, architectures: [FooMoeForCausalLm], model_types: [foo], params: "
        "{num_experts: <path>, top_k: <path>, intermediate_size: <path>, hidden_size: <path>}}"
    )


def test_match_prefers_architecture_then_model_type_then_fallback():
    registry = load_registry()
    # Kimi-K2 ships DeepseekV3ForCausalLM with model_type kimi_k2
    assert (
        registry.match({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2"})[
            0
        ].name
        == "deepseek"
    )
    assert registry.match({"model_type": "mixtral"}) == (
        registry.match({"architectures": ["MixtralForCausalLM"]})[0],
        False,
    )
    entry, guessed = registry.match(
        {"architectures": ["NewMoeForCausalLM"], "model_type": "new_moe"}
    )
    assert (entry.name, guessed) == ("generic", True)


def test_literals_parse_as_defaults(write):
    path = write(MINIMAL_ENTRY.replace("top_k: k", "top_k: [k, {default: 2}]"))
    entry = load_registry(path).match(FOO_CONFIG)[0]
    assert entry.params["top_k"] == ("k", Default(2))
    assert entry.to_yaml_dict()["params"]["top_k"] == ["k", {"default": 2}]


def test_to_yaml_dict_round_trips_through_the_schema(write):
    entry = load_registry().match({"architectures": ["KimiK3ForConditionalGeneration"]})[0]
    path = write(yaml.safe_dump({"version": 1, "entries": [entry.to_yaml_dict()]}))
    assert validate_file(path) == []


def test_json_mappings_file(write):
    path = write(json.dumps(yaml.safe_load(MINIMAL_ENTRY)), "mappings.json")
    assert load_registry(path).names()[0] == "foo_moe"


def test_no_architecture_names_in_the_python_code():
    """Architectures live in moe_mappings.yaml only: no Python branch may name one."""
    registry = load_registry()
    architectures = {name for entry in registry.entries for name in entry.architectures}
    quoted_model_types = {
        f"{quote}{name}{quote}"
        for entry in registry.entries
        for name in entry.model_types
        for quote in "\"'"
    }
    offenders = []
    for path in sorted((ROOT / "moetune").rglob("*.py")):
        source = path.read_text()
        offenders += [
            f"{path.name}: {name}" for name in architectures | quoted_model_types if name in source
        ]
    assert offenders == []


def test_duplicate_keys_are_refused_not_silently_dropped(write):
    path = write(MINIMAL_ENTRY.replace("      top_k: k\n", "      top_k: k\n      top_k: kk\n"))
    assert validate_file(path) == [f"{path}, line 9: duplicate key 'top_k'"]
