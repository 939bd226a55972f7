"""The command line stays thin: no function in moetune/commands/ is over 80 lines.

A command parses its options, builds the request the library takes and prints what
comes back; the work lives below commands/ (issue 31). A function is measured from
its ``def`` line to its last line, docstring included (decorators are not counted).
"""

import ast
from pathlib import Path

COMMANDS = Path(__file__).resolve().parents[1] / "moetune" / "commands"
MAX_LINES = 80


def too_long(path: Path, limit: int = MAX_LINES) -> list[str]:
    """Each function of `path` over `limit` lines, as ``file:line name() is N lines``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                found.append(f"{path.name}:{node.lineno} {node.name}() is {length} lines")
    return found


def test_no_function_in_commands_is_over_80_lines():
    files = sorted(COMMANDS.glob("*.py"))
    assert len(files) > 5  # the folder is where this test thinks
    assert [line for path in files for line in too_long(path)] == []


def test_the_measure_finds_a_long_function_nested_or_not(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(79))
    source = (
        f"@decorator\ndef exactly_80():\n{body}\n"  # def + 79 lines: 80, allowed
        f"def over():\n{body}    return 1\n\n"
        f"class Holder:\n    def method(self):\n{body.replace('    ', '        ')}"
        "        return 2\n"
    )
    path = tmp_path / "module.py"
    path.write_text(source)
    assert too_long(path) == [
        "module.py:83 over() is 81 lines",
        "module.py:166 method() is 81 lines",
    ]
