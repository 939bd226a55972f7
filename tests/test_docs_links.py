"""Every relative link of the documentation points to a file that exists (and, with a
#fragment into a Markdown file, to one of its headings)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = sorted(
    [
        ROOT / "README.md",
        ROOT / "BENCHMARKS.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "bench" / "results").glob("*/README.md"),
    ]
)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+ (.+)$", re.M)


def links(text: str) -> list[str]:
    """The link targets of Markdown text, outside code blocks and code spans."""
    # A code span inside link text ([`x`](y)) leaves the link: [](y).
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    return [match.group(1) for match in LINK.finditer(prose)]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {anchor(h) for h in HEADING.findall(FENCE.sub("", path.read_text()))}


def test_the_link_finder_skips_code_and_reads_fragments():
    text = "see [a](docs/a.md#two-words) and `[b](nope.md)`\n```\n[c](nor.md)\n```\n"
    assert set(links(text)) == {"docs/a.md#two-words"}
    assert anchor("The format: `--space` files") == "the-format---space-files"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(document):
    broken = []
    for target in set(links(document.read_text())):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path_part, _, fragment = target.partition("#")
        path = (document.parent / path_part).resolve() if path_part else document
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif fragment and path.suffix == ".md" and fragment not in anchors(path):
            broken.append(f"{target}: no heading #{fragment}")
    assert not broken, f"{document.relative_to(ROOT)}: {broken}"
