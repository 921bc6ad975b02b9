"""Text labkit did not write stays text in the Markdown it writes: rendered by nbconvert's own Markdown renderer (the
one that turns archived notebooks into the shared report), no tag, handler or link comes out of it."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from nbconvert.filters.markdown import markdown2html

from labkit.show.escape import md_code, md_text, safe_markdown
from labkit.show.tables import md

HOSTILE = ["<img src=x onerror=alert(1)>", "<script>alert(1)</script>", "[click](javascript:alert(1))",
           "<a href='javascript:alert(1)'>x</a>", "`<svg onload=alert(1)>`", "a ``` b <iframe src=javascript:1>",
           "<https://evil.example>"]


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, list]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.found.append((tag, attrs))


def _inert(rendered: str) -> bool:
    """No element but labkit's formatting and plain web links (the renderer links a bare https URL): no handler, no
    script URL, no src."""
    parser = _Tags()
    parser.feed(rendered)
    return all((tag in {"p", "strong", "em", "code", "ul", "li"} and not attrs)
               or (tag == "a" and [k for k, _ in attrs] == ["href"] and attrs[0][1].startswith(("https://", "http://")))
               for tag, attrs in parser.found)


@pytest.mark.parametrize("text", HOSTILE)
def test_untrusted_text_renders_as_itself(text: str) -> None:
    assert _inert(markdown2html(f"**Hypothesis.** {md_text(text)}"))
    assert _inert(markdown2html(f"- expected: {md_code(text)}"))
    assert _inert(markdown2html(safe_markdown(f"**Hypothesis.** {text} and `code <b>`")))
    assert _inert(markdown2html(md(f"A hypothesis: {text}").data))


def test_readable_and_labkit_formatting_kept() -> None:
    rendered = markdown2html(safe_markdown("**Primary metric:** `field_accuracy` ≥ 0.30 (x < y) & `a<b`"))
    assert "<strong>Primary metric:</strong>" in rendered and "<code>field_accuracy</code>" in rendered
    assert "x &lt; y" in rendered and "<code>a&lt;b</code>" in rendered  # shown as the characters, code untouched
    assert md_code("uses `ticks`") == "`` uses `ticks` ``" and md_code("plain") == "`plain`"
    assert md_text("R&D <b>") == "R&amp;D &lt;b&gt;"
