"""Render tokenised examples as HTML: every token, with the positions that carry loss marked."""

from __future__ import annotations

import html
from typing import Any

from labkit.prompting import IGNORE, Encoded

STYLE = """<style>
.lk-ex{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;line-height:1.9;margin:6px 0 14px}
.lk-t{padding:1px 1px;margin:0 1px;border-radius:3px;white-space:pre-wrap}
.lk-mask{background:#eeeeee;color:#555}
.lk-loss{background:#c8f7c5;color:#063;border-bottom:2px solid #2a2}
.lk-special{outline:1px solid #a4f;font-weight:bold}
.lk-head{font-family:sans-serif;font-size:12px;color:#333;margin-top:8px}
.lk-warn{color:#b00;font-weight:bold}
</style>"""


def _show(piece: str) -> str:
    return html.escape(piece).replace("\n", "⏎\n").replace("\t", "⇥") or "∅"


def token_spans(tokenizer: Any, enc: Encoded) -> list[dict[str, Any]]:
    """Each token as {"id", "text", "loss", "special"} (text decoded alone, newlines kept)."""
    special = set(tokenizer.all_special_ids)
    return [{"id": tid, "text": tokenizer.decode([tid]), "loss": label != IGNORE, "special": tid in special}
            for tid, label in zip(enc.input_ids, enc.labels)]


def render(tokenizer: Any, enc: Encoded, title: str = "") -> str:
    """HTML of one example: grey tokens are masked (prompt), green tokens carry loss; special tokens outlined.

    Args:
        tokenizer: the tokenizer.
        enc: the encoded example.
        title: a heading (row id, category…).
    Returns:
        an HTML fragment (include STYLE once per page).
    """
    parts = []
    for span in token_spans(tokenizer, enc):
        cls = "lk-t " + ("lk-loss" if span["loss"] else "lk-mask") + (" lk-special" if span["special"] else "")
        parts.append(f'<span class="{cls}" title="id {span["id"]}">{_show(span["text"])}</span>')
    flags = f"{len(enc.input_ids)} tokens, {enc.loss_tokens} with loss, prompt {enc.prompt_len}"
    if enc.truncated:
        flags += f' — <span class="lk-warn">TRUNCATED from {enc.full_len} (max_length)</span>'
    if not enc.prefix_ok:
        flags += ' — <span class="lk-warn">prompt is not a token prefix</span>'
    text = html.escape(tokenizer.decode(enc.input_ids))
    return (f'<div class="lk-head"><b>{html.escape(title)}</b> · {flags}</div><div class="lk-ex">{"".join(parts)}</div>'
            f'<details><summary class="lk-head">exact text after the chat template</summary><pre>{text}</pre></details>')


def render_page(tokenizer: Any, items: list[tuple[str, Encoded]]) -> str:
    """A full HTML fragment with the legend and several examples."""
    legend = ('<div class="lk-head">Legend: <span class="lk-t lk-mask">masked (no loss)</span> '
              '<span class="lk-t lk-loss">loss</span> <span class="lk-t lk-mask lk-special">special token</span> '
              '⏎ newline</div>')
    return STYLE + legend + "".join(render(tokenizer, enc, title) for title, enc in items)
