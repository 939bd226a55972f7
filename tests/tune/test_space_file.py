"""The --space file format: one schema, its documentation, and one-line errors."""

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from moetune.errors import TuneError
from moetune.tune.search.space import DEFAULT_VALUES, PARAM_NAMES, load_space

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schemas" / "search_space.schema.json"
DOC = ROOT / "docs" / "search-space.md"
CODE_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def test_the_schema_is_a_schema_and_the_package_ships_it():
    schema = json.loads(SCHEMA.read_text())
    Draft202012Validator.check_schema(schema)
    packaged = ROOT / "moetune" / "data" / "schemas" / "search_space.schema.json"
    assert packaged.resolve() == SCHEMA.resolve()


def test_every_example_of_the_doc_loads(tmp_path):
    blocks = [(lang, body) for lang, body in CODE_BLOCK.findall(DOC.read_text())]
    examples = [(lang, body) for lang, body in blocks if lang in ("json", "yaml")]
    assert len(examples) >= 3
    counts = []
    for index, (lang, body) in enumerate(examples):
        path = tmp_path / f"example{index}.{lang}"
        path.write_text(body)
        counts.append(len(load_space(path)))
    assert counts == [48, 384, 3]  # as the doc says
    # The bundled CPU example is the doc's list example.
    tiny = ROOT / "tests" / "tune" / "data" / "tiny-space.json"
    assert json.loads(tiny.read_text()) == json.loads(examples[2][1])


def test_the_doc_shows_the_error_moetune_prints(tmp_path):
    (console,) = [body for lang, body in CODE_BLOCK.findall(DOC.read_text()) if lang == "console"]
    shown = console.splitlines()[1].removeprefix("Error: ")
    path = tmp_path / "space.json"
    path.write_text('{"BLOCK_SIZE_N": [32, 48]}')
    with pytest.raises(TuneError) as error:
        load_space(path)
    assert str(error.value).replace(str(path), "space.json") == shown


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"BLOCK_SIZE_N": [32, 48]}', "BLOCK_SIZE_N, item 2: 48 is not a power of two"),
        ('{"num_stages": 2.0}', "num_stages: 2.0 must be an integer: write 2"),
        ('{"GROUP_SIZE_M": 0}', "GROUP_SIZE_M: 0 is not an integer from 1 to 4096"),
        ('{"num_warps": [4, 4]}', "num_warps: [4, 4] has non-unique elements"),
        ('{"BLOCK_M": 16}', "unknown parameter(s) BLOCK_M; expected BLOCK_SIZE_M"),
        ('[{"BLOCK_SIZE_M": 16}]', "config 1: missing BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M"),
        (
            '[{"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, '
            '"num_warps": 4, "num_stages": "3"}]',
            'config 1, num_stages: "3" must be an integer: write 3',
        ),
        ('{"num_warps": 3}', "num_warps: 3 is not 1, 2, 4, 8, 16 or 32"),
        ('"all"', "expected a mapping of parameter -> values or a list of configs, got str"),
    ],
)
def test_a_fault_is_one_line_naming_the_file_and_the_place(tmp_path, text, message):
    path = tmp_path / "space.json"
    path.write_text(text)
    with pytest.raises(TuneError) as error:
        load_space(path)
    line = str(error.value)
    assert line.startswith(f"search space {path}: ") and message in line, line
    assert "\n" not in line and "docs/search-space.md" in line


values = st.fixed_dictionaries(
    {},
    optional={
        name: st.lists(st.sampled_from(DEFAULT_VALUES[name]), min_size=1, unique=True)
        for name in PARAM_NAMES
    },
)


@settings(max_examples=40, deadline=None)
@given(values)
def test_any_grid_of_allowed_values_loads_as_their_product(tmp_path_factory, grid):
    path = tmp_path_factory.mktemp("space") / "space.json"
    path.write_text(json.dumps(grid))
    expected = 1
    for name in PARAM_NAMES:
        expected *= len(grid.get(name, DEFAULT_VALUES[name]))
    assert len(load_space(path)) == expected
