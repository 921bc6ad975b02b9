"""Render tokenised examples as HTML: every token, with the positions that carry loss marked.

Preference pairs (dpo/orpo cards) show the prompt once, then the chosen and the rejected answer, each token
marked with the loss term that reads it (`labkit.data.pairs.loss_positions`).
"""

from __future__ import annotations

import html
from typing import Any

from labkit.data.pairs import loss_positions
from labkit.data.prompting import IGNORE, Encoded

STYLE = """<style>
.lk-ex{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;line-height:1.9;margin:6px 0 14px}
.lk-t{padding:1px 1px;margin:0 1px;border-radius:3px;white-space:pre-wrap}
.lk-mask{background:#eeeeee;color:#555}
.lk-loss{background:#c8f7c5;color:#063;border-bottom:2px solid #2a2}
.lk-special{outline:1px solid #a4f;font-weight:bold}
.lk-head{font-family:sans-serif;font-size:12px;color:#333;margin-top:8px}
.lk-warn{color:#b00;font-weight:bold}
.lk-rej{background:#fbd3d0;color:#700;border-bottom:2px solid #c33}
.lk-nll{background:#e3f4e1;color:#063;border-bottom:1px dashed #2a2}
</style>"""

PAIR_NOTES = {
    "dpo": "DPO: the loss reads the answer tokens of both sequences (their summed log-probabilities, each against the "
           "reference model); the prompt is masked.",
    "orpo": "ORPO: the NLL term reads every token of prompt + chosen after the first (TRL computes it over the whole "
            "sequence, as the ORPO authors' code does); the odds-ratio term reads the answer tokens of both sequences "
            "(their mean log-probabilities).",
}
_PAIR_CLASS = {"": "lk-mask", "nll": "lk-nll", "answer": "lk-loss", "nll+answer": "lk-loss"}


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
            f'<details><summary class="lk-head">exact text after the prompt format</summary><pre>{text}</pre></details>')


def _spans(tokenizer: Any, ids: list[int], classes: list[str]) -> str:
    special = set(tokenizer.all_special_ids)
    return "".join(f'<span class="lk-t {cls}{" lk-special" if tid in special else ""}" title="id {tid}">'
                   f'{_show(tokenizer.decode([tid]))}</span>' for tid, cls in zip(ids, classes))


def render_pair(tokenizer: Any, pair: Any, title: str = "") -> str:
    """HTML of one preference pair: the prompt once, then the chosen and the rejected answer.

    Args:
        tokenizer: the tokenizer.
        pair: a `labkit.data.pairs.EncodedPair`.
        title: a heading.
    Returns:
        an HTML fragment (include STYLE once per page).
    """
    marks = loss_positions(pair)
    n = pair.prompt_len
    prompt = _spans(tokenizer, pair.prompt_ids, [_PAIR_CLASS[m] for m in marks["chosen"][:n]])
    chosen = _spans(tokenizer, pair.chosen_ids, [_PAIR_CLASS[m] for m in marks["chosen"][n:]])
    rejected = _spans(tokenizer, pair.rejected_ids, ["lk-rej" if m else "lk-mask" for m in marks["rejected"][n:]])
    flags = f"prompt {n} tokens, chosen {len(pair.chosen_ids)}, rejected {len(pair.rejected_ids)}"
    if pair.truncated:
        flags += f' — <span class="lk-warn">TRUNCATED from {pair.full_len} (max_length)</span>'
    if not (pair.chosen.prefix_ok and pair.rejected.prefix_ok):
        flags += ' — <span class="lk-warn">prompt is not a token prefix</span>'
    texts = "".join(f"<pre>{html.escape(tokenizer.decode(getattr(pair, side).input_ids))}</pre>"
                    for side in ("chosen", "rejected"))
    return (f'<div class="lk-head"><b>{html.escape(title)}</b> · {flags}</div><div class="lk-ex">{prompt}</div>'
            f'<div class="lk-ex">chosen → {chosen}</div><div class="lk-ex">rejected → {rejected}</div>'
            f'<details><summary class="lk-head">exact text of both sequences after the prompt format</summary>'
            f'{texts}</details>')


def render_page(tokenizer: Any, items: list[tuple[str, Any]]) -> str:
    """A full HTML fragment with the legend, the prompt format and several examples (Encoded, or preference pairs)."""
    legend = ('<div class="lk-head">Legend: <span class="lk-t lk-mask">masked (no loss)</span> '
              '<span class="lk-t lk-loss">loss</span> <span class="lk-t lk-mask lk-special">special token</span> '
              '⏎ newline</div>')
    first = getattr(items[0][1], "chosen", items[0][1]) if items else None
    if getattr(first, "prompt_format", ""):
        legend += f'<div class="lk-head">Prompt format: <b>{html.escape(first.prompt_format)}</b></div>'
    if items and hasattr(items[0][1], "rejected"):
        legend = ('<div class="lk-head">Legend: <span class="lk-t lk-mask">masked (no loss)</span> '
                  '<span class="lk-t lk-loss">chosen answer: log-probability raised</span> '
                  '<span class="lk-t lk-rej">rejected answer: log-probability lowered</span> '
                  '<span class="lk-t lk-nll">NLL term only (ORPO)</span> '
                  '<span class="lk-t lk-mask lk-special">special token</span> ⏎ newline</div>'
                  f'<div class="lk-head">{PAIR_NOTES[items[0][1].trainer]}</div>')
        return STYLE + legend + "".join(render_pair(tokenizer, pair, title) for title, pair in items)
    return STYLE + legend + "".join(render(tokenizer, enc, title) for title, enc in items)
