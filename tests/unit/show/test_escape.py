"""Text labkit did not write stays text in the Markdown it writes: rendered by nbconvert's own Markdown renderer (the
one that turns archived notebooks into the shared report), no tag, handler or link comes out of it."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from nbconvert.filters.markdown import markdown2html

from labkit.show.escape import markdown_html, md_code, md_text
from labkit.show.tables import md

HOSTILE = ["<img src=x onerror=alert(1)>", "<script>alert(1)</script>", "[click](javascript:alert(1))",
           "<a href='javascript:alert(1)'>x</a>", "`<svg onload=alert(1)>`", "a ``` b <iframe src=javascript:1>",
           "<https://evil.example>", "a ```\n<img src=z onerror=alert(1)>\n``` b", "\\`<img src=q onerror=alert(1)>`",
           "<div>\n<img src=w onerror=alert(1)>\n</div>"]


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, list]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.found.append((tag, attrs))


def _inert(rendered: str) -> bool:
    """Only formatting elements; no handler, no src, no link but to the web or within the page."""
    parser = _Tags()
    parser.feed(rendered)
    for tag, attrs in parser.found:
        if tag not in {"p", "strong", "em", "b", "code", "pre", "ul", "li", "a", "div", "span"}:
            return False
        for key, value in attrs:
            if key == "href" and tag == "a" and (value or "").startswith(("https://", "http://", "#")):
                continue
            if key != "class":
                return False
    return True


@pytest.mark.parametrize("text", HOSTILE)
def test_untrusted_text_renders_as_itself(text: str) -> None:
    assert _inert(markdown2html(f"**Hypothesis.** {md_text(text)}"))
    assert _inert(markdown2html(f"- expected: {md_code(text)}"))
    assert _inert(markdown_html(f"**Hypothesis.** {text} and `code <b>`"))
    assert _inert(md(f"A hypothesis: {text}").data)


def test_readable_and_labkit_formatting_kept() -> None:
    rendered = md("**Primary metric:** `field_accuracy` ≥ 0.30 (x < y) & `a<b`").data
    assert "<strong>Primary metric:</strong>" in rendered and "<code>field_accuracy</code>" in rendered
    assert "x &lt; y" in rendered and "<code>a&lt;b</code>" in rendered  # shown as the characters, code untouched
    assert md_code("uses `ticks`") == "`` uses `ticks` ``" and md_code("plain") == "`plain`"
    assert md_text("R&D <b>") == "R&amp;D &lt;b&gt;"


def test_a_fenced_block_cannot_be_closed_by_its_content() -> None:
    from labkit.show.escape import md_fence

    text = "hypothesis: |\n  ```\n  <img src=x onerror=alert(1)>\n  ````"
    parser = _Tags()
    parser.feed(markdown2html("\n".join(md_fence(text, "yaml"))))
    assert {tag for tag, _ in parser.found} <= {"div", "pre", "span"}, "everything stays inside the highlighted block"
    assert not [k for _, attrs in parser.found for k, _ in attrs if k != "class"]
