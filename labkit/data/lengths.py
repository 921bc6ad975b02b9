"""Token lengths of encoded splits: quantiles and what `data.max_length` cuts (stage 02's lengths.json, the model card).
"""

from __future__ import annotations

from typing import TypedDict

from labkit.card.schema import Card
from labkit.data.prompting import Encoded


class LengthStats(TypedDict):
    """One split's token lengths (prompt + completion, before truncation)."""

    rows: int
    min: int
    p50: int
    p95: int
    max: int
    truncated_rate: float  # share of rows longer than data.max_length
    completion_cut_rate: float  # share of rows whose completion was cut (the prompt fits)
    prompt_only_rate: float  # share of rows whose prompt alone fills data.max_length


def length_stats(card: Card, encoded: dict[str, list[Encoded]]) -> dict[str, LengthStats]:
    """Token lengths per split: quantiles, truncation rate, share of rows whose completion was cut.

    Args:
        card: the card (data.max_length).
        encoded: the encodings per split (`labkit.data.prompting.encode_rows`).
    Returns:
        {split: LengthStats}; an empty split is left out.
    """
    out: dict[str, LengthStats] = {}
    for split, encs in encoded.items():
        lengths = sorted(e.full_len for e in encs)
        if not lengths:
            continue
        cut = [e for e in encs if e.truncated and e.full_len - card.data.max_length > 0]
        out[split] = {
            "rows": len(lengths), "min": lengths[0], "p50": lengths[len(lengths) // 2],
            "p95": lengths[min(len(lengths) - 1, int(0.95 * len(lengths)))], "max": lengths[-1],
            "truncated_rate": sum(e.truncated for e in encs) / len(encs),
            "completion_cut_rate": sum(e.prompt_len < card.data.max_length for e in cut) / len(encs),
            "prompt_only_rate": sum(e.prompt_len >= card.data.max_length for e in encs) / len(encs),
        }
    return out
