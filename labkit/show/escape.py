"""Text that labkit did not write (cards, data, model answers) made inert in the Markdown and HTML pages it writes.

Markdown passes raw HTML through and turns `[text](url)` into links: a hypothesis holding `<img onerror=…>` or a
`javascript:` link would run in the browser of whoever opens a shared report or an exported README. Everything here
keeps the text readable and takes away its power to become markup.
"""

from __future__ import annotations

import html
import re
from typing import Any

import bleach
import mistune

_MARKUP = re.compile(r"[<>\[\]]")


def _inert(text: str) -> str:
    """`<`, `>`, `[` and `]` as entities: no tag, no link, no autolink; the reader sees the same characters."""
    return _MARKUP.sub(lambda m: {"<": "&lt;", ">": "&gt;", "[": "&#91;", "]": "&#93;"}[m.group()], text)


def md_text(value: Any) -> str:
    """Untrusted text for a Markdown page, outside a code span: shown as written, never as markup.

    Args:
        value: the text (converted with str).
    Returns:
        the text with `&` and markup characters as entities.
    """
    return _inert(html.escape(str(value), quote=False).replace("&lt;", "<").replace("&gt;", ">"))


def md_code(value: Any) -> str:
    """Untrusted text as a Markdown code span, fenced by more backticks than it holds (CommonMark), on one line."""
    text = " ".join(str(value).split())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_fence(text: str, lang: str = "") -> list[str]:
    """Untrusted text as a fenced Markdown code block whose fence is longer than any backtick run inside (CommonMark),
    so no line of the text can close it early.

    Returns:
        the block's lines.
    """
    fence = "`" * max(3, max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return [f"{fence}{lang}", *text.splitlines(), fence]


# what labkit's own Markdown renders to; anything else in a rendered page is shown as text
TAGS = ["p", "strong", "em", "b", "i", "code", "pre", "ul", "ol", "li", "br", "hr", "blockquote", "h1", "h2", "h3",
        "h4", "a", "table", "thead", "tbody", "tr", "th", "td", "del"]


def markdown_html(text: str) -> str:
    """Markdown labkit composed with values in it, rendered to HTML and sanitised: labkit's formatting stays, any other
    tag or attribute is shown as text, and links keep only http(s) and mailto targets.

    Sanitising the rendered HTML (bleach) rather than the Markdown source holds whatever a renderer makes of odd
    input (code spans over several lines, escaped backticks, HTML blocks).

    Args:
        text: the Markdown.
    Returns:
        the HTML fragment.
    """
    return bleach.clean(mistune.html(text), tags=TAGS, attributes={"a": ["href", "title"]},
                        protocols=["http", "https", "mailto"], strip=False)
