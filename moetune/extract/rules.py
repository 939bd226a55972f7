"""Value rules: what each MoE parameter's value must be, declared in moe_mappings.yaml.

The built-in moe_mappings.yaml holds one rule per parameter under `parameters`:
a small JSON Schema (`type`, `minimum`, `maximum`, `enum`, `minLength`, `items`,
`minItems`, `maxItems`) that every value is checked against where it is read
(config.json, transformers' defaults, `{default: ...}` literals). Two readings
differ from plain JSON Schema:

- an integer is a JSON integer: 8.0, "8" and true are not 8;
- `maximum` is the size bound, set above every released MoE layer: a larger
  value is almost surely a wrong field or a typo, and is accepted only with
  `allow_huge` (the commands' --allow-huge-shape).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

Rule = dict[str, Any]


@dataclass(frozen=True)
class ValueProblem:
    """Why a value breaks its rule.

    `expected` is what the rule asks, in words ("an integer >= 1", or "at most
    4096" for the size bound), `hint` how to write a value that only looks wrong
    to JSON (8.0 for 8), `bound` the size bound when only that is broken.
    """

    expected: str
    hint: str = ""
    bound: int | None = None

    @property
    def huge(self) -> bool:
        return self.bound is not None


def _strict_validator_class() -> Any:
    from jsonschema import Draft202012Validator, validators

    def is_integer(checker: Any, instance: Any) -> bool:
        return isinstance(instance, int) and not isinstance(instance, bool)

    type_checker = Draft202012Validator.TYPE_CHECKER.redefine("integer", is_integer)
    return validators.extend(Draft202012Validator, type_checker=type_checker)


@lru_cache(maxsize=64)
def _validator(rule_json: str) -> Any:
    return _strict_validator_class()(json.loads(rule_json))


def without_maximum(rule: Rule) -> Rule:
    """`rule` with every `maximum` (the size bound) removed, nested items included."""
    lifted = {key: value for key, value in rule.items() if key != "maximum"}
    if isinstance(lifted.get("items"), dict):
        lifted["items"] = without_maximum(lifted["items"])
    return lifted


def _passes(rule: Rule, value: Any) -> bool:
    return _validator(json.dumps(rule, sort_keys=True)).is_valid(value)


def expected(rule: Rule) -> str:
    """The rule in words, its size bound left out: 'an integer >= 1', 'a non-empty string'."""
    kind = rule.get("type")
    if kind == "integer":
        text = "an integer"
        if "minimum" in rule:
            text += f" >= {rule['minimum']}"
        return text
    if kind == "string":
        if "enum" in rule:
            return "one of " + ", ".join(rule["enum"])
        return "a non-empty string" if rule.get("minLength", 0) > 0 else "a string"
    if kind == "array":
        count = rule.get("minItems")
        size = f"{count} " if count is not None and count == rule.get("maxItems") else ""
        items = rule.get("items")
        each = f", each {expected(items)}" if isinstance(items, dict) else ""
        return f"a list of {size}items{each}"
    return f"a JSON {kind}"


def show(value: Any, limit: int = 60) -> str:
    """A value as JSON, cut to `limit` characters (what error messages print)."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = repr(type(value).__name__)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _hint(rule: Rule, value: Any) -> str:
    """How to write a value that only looks wrong to JSON ('write 8' for 8.0 or "8")."""
    if rule.get("type") != "integer" or isinstance(value, bool):
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e18:
        return f"write {int(value)}: an integer field takes a JSON integer"
    digits = value.strip().lstrip("-") if isinstance(value, str) else ""
    if digits.isascii() and digits.isdigit() and len(digits) < 30:
        return f"write {value.strip()} without quotes"
    return ""


def size_bound(rule: Rule) -> Any:
    """The rule's `maximum`, or its items' (a block size), or None."""
    if "maximum" in rule:
        return rule["maximum"]
    items = rule.get("items")
    return size_bound(items) if isinstance(items, dict) else None


def value_problem(rule: Rule, value: Any, *, allow_huge: bool = False) -> ValueProblem | None:
    """Why `value` breaks `rule`, or None when it is fine (see the module docstring)."""
    lifted = without_maximum(rule)
    if not _passes(lifted, value):
        return ValueProblem(expected(lifted), _hint(rule, value))
    if allow_huge or _passes(rule, value):
        return None
    bound = size_bound(rule)
    return ValueProblem(f"at most {bound}", bound=bound)
