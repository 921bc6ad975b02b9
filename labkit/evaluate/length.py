"""The generation length of the evaluation: the card's `eval.max_new_tokens`, or sized from the reference answers.

A card that leaves `eval.max_new_tokens` out gets it from its data, once, in stage 01: the 95th percentile of the
reference answers' token lengths over the training and validation splits (never the test split), each counted with
the base tokenizer plus one token for the end of turn, plus a margin of 10 % (at least 8 tokens). The figure and how
it was reached are written to the run folder (`generation_length.json`); every later stage, `labkit final` and
`labkit export` read it from there (`labkit.core.run_card.resolved_card`), so the whole run generates with one
length. It depends only on the data and the tokenizer, which the baseline's cache key already covers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from labkit.card.schema import Card
from labkit.core import io
from labkit.core.run_card import GENERATION_LENGTH as FILE
from labkit.core.run_card import recorded_length as recorded

PERCENTILE = 95
MARGIN_SHARE, MARGIN_MIN = 0.10, 8


def size_generation(tokenizer: Any, targets: list[str]) -> dict[str, Any]:
    """Size the generation length from reference answers.

    Args:
        tokenizer: the base model's tokenizer.
        targets: the reference answers (training and validation splits).
    Returns:
        {"max_new_tokens", "from": "references", "p95_tokens", "margin", "longest_tokens", "references"}; the p95 is
        the nearest-rank percentile (the smallest length at or above 95 % of the references).
    """
    if not targets:
        raise ValueError("no reference answers to size the generation length from")
    lengths = sorted(len(tokenizer(t, add_special_tokens=False)["input_ids"]) + 1 for t in targets)  # + end of turn
    p95 = lengths[max(0, math.ceil(PERCENTILE / 100 * len(lengths)) - 1)]
    margin = max(MARGIN_MIN, math.ceil(MARGIN_SHARE * p95))
    return {"max_new_tokens": p95 + margin, "from": "references", "p95_tokens": p95, "margin": margin,
            "longest_tokens": lengths[-1], "references": len(lengths)}


def record(run_dir: Path | str, tokenizer: Any, train: list[dict[str, Any]],
           validation: list[dict[str, Any]]) -> dict[str, Any]:
    """Size the generation length from the run's training and validation references and record it (once).

    Args:
        run_dir: the run folder.
        tokenizer: the base model's tokenizer.
        train, validation: the prepared splits' rows (with `target`).
    Returns:
        what `size_generation` returns (read back when the run has recorded it already).
    """
    found = recorded(run_dir)
    if found is None:
        found = size_generation(tokenizer, [r["target"] for r in [*train, *validation]])
        io.write_json(Path(run_dir) / FILE, found)
    return found


def statement(card: Card, run_dir: Path | str) -> str:
    """One line on the generation length used: the card's value, or how it was sized (shown in stage 01).

    Args:
        card: the card as loaded, or the run's resolved card (`labkit.core.run_card.resolved_card`), whose
            `eval.max_new_tokens` is the recorded one: the run's archived `card.yaml`, when there is one, says whether
            the card set it.
        run_dir: the run folder.
    Returns:
        the line, in Markdown.
    """
    found = recorded(run_dir)
    archived = Path(run_dir) / "card.yaml"
    given = ((yaml.safe_load(archived.read_text(encoding="utf-8")).get("eval") or {}).get("max_new_tokens")
             if archived.exists() else card.eval.max_new_tokens)
    if given is not None or found is None:
        return f"Generation length: **{card.eval.max_new_tokens}** new tokens (`eval.max_new_tokens`, set by the card)."
    return (f"Generation length: **{found['max_new_tokens']}** new tokens, sized from the data (`eval.max_new_tokens` "
            f"unset): the 95th percentile of the {found['references']} training and validation references' token "
            f"lengths, {found['p95_tokens']} (end of turn included; the longest is {found['longest_tokens']}), plus a "
            f"margin of {found['margin']}.")
