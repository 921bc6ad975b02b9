"""ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum from rouge_score, and the length ratio of an answer to its reference.

Every value is rouge_score's F-measure of one answer against its reference (`RougeScorer(...).score(target,
prediction)`), with Porter stemming when the card's `eval.rouge.use_stemmer` is on (the default). ROUGE-Lsum is the
union-LCS ROUGE-L over sentences: rouge_score 0.1.2 takes a summary's sentences as its newline-separated lines (its
own splitter, `split_summaries=True`, needs nltk's punkt data, which is not installed offline), so both texts are
split into sentences by `sentences` (a sentence ends at `.`, `!` or `?` followed by whitespace; existing line breaks
are kept) and joined with newlines before scoring. ROUGE-1/2/L tokenise on non-alphanumeric characters, so the
newlines leave their values unchanged.

The length ratio is the answer's word count over the reference's (words: whitespace-separated, as `str.split`
counts them); `mean_length_ratio` is its mean over examples, a guardrail against winning ROUGE recall by rambling.
"""

from __future__ import annotations

import functools
import re
from importlib.metadata import version
from typing import Any

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
LENGTH_UNIT = "words (whitespace-separated)"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@functools.cache
def scorer(use_stemmer: bool) -> Any:
    """rouge_score's scorer for the four ROUGE types, imported and built on first use: rouge_score imports nltk
    (0.6-1 s), which every stage kernel would otherwise pay through the trainer's early stopping."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=use_stemmer)


def sentences(text: str) -> str:
    """The text with one sentence per line, as rouge_score's ROUGE-Lsum expects.

    Args:
        text: a summary.
    Returns:
        its sentences (split after `.`, `!` or `?` followed by whitespace, and at existing line breaks), stripped,
        joined with newlines.
    """
    parts = (s.strip() for line in text.splitlines() for s in _SENTENCE_END.split(line))
    return "\n".join(p for p in parts if p)


def rouge_scores(prediction: str, target: str, use_stemmer: bool = True) -> dict[str, float]:
    """ROUGE F-measures of one answer against its reference.

    Args:
        prediction: the generated answer.
        target: the reference.
        use_stemmer: Porter-stem tokens before matching (rouge_score's `use_stemmer`).
    Returns:
        {"rouge1", "rouge2", "rougeL", "rougeLsum"}: F-measures in [0, 1]; all 0.0 for an empty reference.
    """
    if not target.strip():
        return dict.fromkeys(ROUGE_TYPES, 0.0)
    scores = scorer(use_stemmer).score(sentences(target), sentences(prediction))
    return {name: scores[name].fmeasure for name in ROUGE_TYPES}


def length_ratio(prediction: str, target: str) -> float:
    """The answer's word count over the reference's (a reference without words counts as one word).

    Args:
        prediction: the generated answer.
        target: the reference.
    Returns:
        len(prediction.split()) / max(1, len(target.split())).
    """
    return len(prediction.split()) / max(1, len(target.split()))


def settings(use_stemmer: bool) -> dict[str, Any]:
    """How the ROUGE and length values were computed, recorded with the metrics."""
    return {"use_stemmer": use_stemmer, "rouge_score": version("rouge_score"),
            "rougeLsum_sentences": "split after . ! ? followed by whitespace, and at line breaks",
            "length_unit": LENGTH_UNIT}
