"""The documentation's links: every relative link in README.md and docs/*.md points to a file that exists
(and, with an anchor, to a heading of that file), the README stays a front page of at most 250 lines, and
it links to every page in docs/."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, …


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def without_fences(text: str) -> str:
    """The text with fenced code blocks blanked (a `# comment` in a shell block is not a heading)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans (a link written in code is not a link)."""
    return INLINE_CODE.sub("code", without_fences(text))


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link in a file, outside code."""
    text = prose(path.read_text(encoding="utf-8"))
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(text)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text, lower-cased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading counts by its text
    text = text.replace("`", "").replace("*", "").lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (repeated headings get -1, -2, …)."""
    seen: dict[str, int] = {}
    out = set()
    for match in HEADING.finditer(without_fences(path.read_text(encoding="utf-8"))):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def shown(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Every relative link of a file whose target file, or heading, does not exist."""
    problems = []
    for line, target in links(path):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{shown(path, root)}:{line}: ({target})"
        if not resolved.exists():
            problems.append(f"{where} no such file: {resolved}")
        elif anchor and resolved.suffix == ".md" and unquote(anchor).lower() not in anchors(resolved):
            problems.append(f"{where} no heading with anchor #{anchor} in {shown(resolved, root)}")
    return problems


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    problems = broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_is_a_front_page() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/ (at most {MAX_README_LINES})"


def test_readme_links_every_docs_page() -> None:
    pages = {p.resolve() for p in DOCS.iterdir() if p.is_file()}
    assert pages, "docs/ holds no pages"
    linked = {(README.parent / unquote(t.partition("#")[0])).resolve() for _, t in links(README) if not EXTERNAL.match(t)}
    missing = sorted(str(p.relative_to(ROOT)) for p in pages - linked)
    assert not missing, f"README.md does not link to: {', '.join(missing)}"


@pytest.mark.parametrize("heading, anchor", [
    ("The five stages", "the-five-stages"),
    ("`labkit compare EXPERIMENT`: every variant, under one protocol",
     "labkit-compare-experiment-every-variant-under-one-protocol"),
    ("Early stopping on the card's metric", "early-stopping-on-the-cards-metric"),
    ("04 · Training", "04--training"),
    ("Variants and `parent:`", "variants-and-parent"),
    ("snake_case and [a link](x.md)", "snake_case-and-a-link"),
])
def test_slug_follows_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Present heading\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("# Top\n[ok](other.md#present-heading) [same](#top) [gone](missing.md) [bad](other.md#absent)\n"
                    "[ext](https://example.org/x) [mail](mailto:a@b.c) `[code](nowhere.md)`\n"
                    "```\n[fenced](nowhere.md)\n```\n", encoding="utf-8")
    problems = broken_links(page, root=tmp_path)
    assert len(problems) == 2, problems
    assert "missing.md" in problems[0] and "#absent" in problems[1]
