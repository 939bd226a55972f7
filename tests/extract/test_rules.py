"""Value rules (moetune.extract.rules): declared in moe_mappings.yaml, read strictly."""

import pytest

from moetune.errors import InvalidMappingsError
from moetune.extract.mappings import builtin_rules, load_mappings_file
from moetune.extract.rules import expected, value_problem, without_maximum

SIZE = {"type": "integer", "minimum": 1, "maximum": 4096}
BLOCK = {
    "type": "array",
    "minItems": 2,
    "maxItems": 2,
    "items": {"type": "integer", "minimum": 1, "maximum": 65536},
}


def test_every_parameter_has_a_rule_in_the_builtin_file():
    rules = builtin_rules()
    assert set(rules) == {
        "num_experts",
        "top_k",
        "intermediate_size",
        "hidden_size",
        "expert_hidden_size",
        "num_shared_experts",
        "dtype",
        "quant_method",
        "weight_block_size",
    }
    assert rules["num_experts"] == SIZE
    assert rules["weight_block_size"] == BLOCK


@pytest.mark.parametrize("value", [8.0, "8", True, False, None, [8], {"n": 8}, 0, -1])
def test_an_integer_is_a_json_integer_within_the_minimum(value):
    assert value_problem(SIZE, value).expected == "an integer >= 1"


def test_hints_for_numbers_that_only_look_wrong():
    assert value_problem(SIZE, 8.0).hint == "write 8: an integer field takes a JSON integer"
    assert value_problem(SIZE, " 8").hint == "write 8 without quotes"
    assert value_problem(SIZE, "²").hint == ""
    assert value_problem(SIZE, True).hint == ""


def test_the_size_bound_is_its_own_problem_and_lifts():
    assert value_problem(SIZE, 4096) is None
    problem = value_problem(SIZE, 4097)
    assert (problem.huge, problem.bound, problem.expected) == (True, 4096, "at most 4096")
    assert value_problem(SIZE, 4097, allow_huge=True) is None
    assert value_problem(BLOCK, [128, 100_000]).bound == 65536
    assert value_problem(BLOCK, [128, 100_000], allow_huge=True) is None
    assert without_maximum(BLOCK)["items"] == {"type": "integer", "minimum": 1}


def test_rules_in_words():
    assert expected(without_maximum(BLOCK)) == "a list of 2 items, each an integer >= 1"
    assert expected({"type": "string", "minLength": 1}) == "a non-empty string"
    assert value_problem(BLOCK, [128]).expected == "a list of 2 items, each an integer >= 1"
    assert value_problem({"type": "string", "minLength": 1}, "") is not None


def test_a_user_file_may_repeat_the_rules_but_not_change_them(tmp_path):
    entry = (
        "entries:\n  - name: x\n    architectures: [X]\n"
        "    params: {num_experts: e, top_k: k, intermediate_size: i, hidden_size: h}\n"
    )
    same = tmp_path / "same.yaml"
    same.write_text(
        "parameters:\n  num_experts: {type: integer, minimum: 1, maximum: 4096}\n" + entry
    )
    assert load_mappings_file(same).rules == builtin_rules()
    looser = tmp_path / "looser.yaml"
    looser.write_text("parameters:\n  num_experts: {type: integer, minimum: 1}\n" + entry)
    with pytest.raises(InvalidMappingsError) as exc:
        load_mappings_file(looser)
    assert str(exc.value) == (
        f"{looser}, line 2: field 'parameters.num_experts': the value rules are moetune's own "
        "and a mappings file cannot change them (a shape above a size bound takes "
        "--allow-huge-shape); remove 'parameters'"
    )
