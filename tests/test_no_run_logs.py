"""moetune's code says what it does and why; the history of its numbers lives in git and
bench/results, indexed by BENCHMARKS.md.

A date in a docstring or comment (``2026-12-04``, or a results folder named for one) is a
run log: it goes stale with the next run, and it is the data table's (for the estimate,
moetune/data/estimate_rates.yaml) or BENCHMARKS.md's to cite where a number comes from.
"""

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATED = re.compile(r"\b20\d\d-\d\d(-\d\d)?\b")
# A file whose dates must stay -> why (a fact, not a log: an engine release's date). None now.
ALLOWED: dict[str, str] = {}
# Text tokens: comments, strings and docstrings, and f-strings' text from Python 3.12 on.
TEXT = {tokenize.COMMENT, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}


def dated_text(name: str, source: str) -> list[str]:
    """``name:line`` of each comment and string literal (docstrings included) of `source`
    that carries a date."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        match = DATED.search(token.string)
        if token.type in TEXT and match:
            found.append(f"{name}:{token.start[0] + token.string[: match.start()].count(chr(10))}")
    return found


def test_no_docstring_or_comment_in_moetune_cites_a_dated_run():
    found = [
        where
        for path in sorted((ROOT / "moetune").rglob("*.py"))
        for where in dated_text(path.relative_to(ROOT).as_posix(), path.read_text())
        if where.split(":")[0] not in ALLOWED
    ]
    assert not found, "dated run logs (cite BENCHMARKS.md or the data tables): " + ", ".join(found)


def test_the_check_sees_a_dated_comment_and_docstring():
    source = (
        '"""What it does.\n\nMeasured on 2026-12-04."""\n\nX = 1  # bench/results/2026-12-02-x\n'
    )
    assert dated_text("m.py", source) == ["m.py:3", "m.py:5"]
    assert dated_text("m.py", '"""What it does and why (BENCHMARKS.md)."""\n') == []
