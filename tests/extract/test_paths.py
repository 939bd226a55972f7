"""The dotted-path language of moe_mappings.yaml (moetune.extract.paths)."""

import pytest

from moetune.extract.paths import MISSING, is_valid_path, parse_path, resolve, resolve_object

CONFIG = {
    "hidden_size": 4096,
    "ffn_config": {"moe_top_k": 4},
    "moe_topk": [8, 8, 6],
    "moe_intermediate_size": 3072,
    "n_shared_experts": None,
    "thinker_config": {"text_config": {"num_experts": 128}},
    "weight_block_size": [128, 64],
}


@pytest.mark.parametrize(
    "path, expected",
    [
        ("hidden_size", 4096),
        ("ffn_config.moe_top_k", 4),
        ("thinker_config.text_config.num_experts", 128),
        ("moe_topk[0]", 8),
        ("moe_topk[-1]", 6),
        # a per-layer path also reads a checkpoint that writes one plain number
        ("moe_intermediate_size[0]", 3072),
        ("moe_intermediate_size[5]", 3072),
        ("weight_block_size", [128, 64]),
        ("/hidden_size", 4096),
    ],
)
def test_resolve(path, expected):
    assert resolve(CONFIG, path) == expected


@pytest.mark.parametrize(
    "path",
    [
        "num_experts",  # absent
        "n_shared_experts",  # null counts as absent
        "moe_topk[3]",  # past the end
        "moe_topk[-4]",
        "hidden_size.x",  # below a number
        "ffn_config[0]",  # indexing an object
        "thinker_config.text_config.top_k",
    ],
)
def test_unresolved_paths_are_missing(path):
    assert resolve(CONFIG, path) is MISSING


def test_missing_is_falsy_and_distinct_from_none():
    assert not MISSING
    assert MISSING is not None


def test_parse_steps_and_root_anchor():
    path = parse_path("/a.b[2][-1].c")
    assert path.steps == ("a", "b", 2, -1, "c")
    assert path.from_root
    assert path.under("text_config") == "a.b[2][-1].c"
    assert parse_path("num_experts").under("text_config") == "text_config.num_experts"
    assert parse_path("num_experts").under("") == "num_experts"


@pytest.mark.parametrize("text", ["", "a..b", ".a", "a.", "a[x]", "a[0", "a b", "a/b", "[0]"])
def test_bad_paths_are_rejected(text):
    assert not is_valid_path(text)
    with pytest.raises(ValueError, match="is not a dotted path"):
        parse_path(text)


def test_resolve_object():
    assert resolve_object(CONFIG, "thinker_config.text_config") == {"num_experts": 128}
    assert resolve_object(CONFIG, "hidden_size") is None
    assert resolve_object(CONFIG, "text_config") is None
