"""Text that labkit did not write (cards, data, model answers) made inert in the Markdown and HTML pages it writes.

Markdown passes raw HTML through and turns `[text](url)` into links: a hypothesis holding `<img onerror=…>` or a
`javascript:` link would run in the browser of whoever opens a shared report or an exported README. Everything here
keeps the text readable and takes away its power to become markup.
"""

from __future__ import annotations

import html
import re
from typing import Any

_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(?:.|\n)*?(?<!`)\1(?!`)")  # CommonMark: equal fences, none longer
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


def safe_markdown(text: str) -> str:
    """Markdown labkit composed with values in it, with any HTML tag or link made inert outside its code spans.

    Args:
        text: the Markdown (labkit's own formatting uses no raw HTML and no links).
    Returns:
        the same Markdown, whose raw `<`, `>`, `[` and `]` outside code spans are entities.
    """
    out, last = [], 0
    for match in _CODE_SPAN.finditer(text):
        out += [_inert(text[last:match.start()]), match.group()]
        last = match.end()
    return "".join(out + [_inert(text[last:])])
