"""Stopping, measured: whether each answer ended on a stop token before the length limit, and its length in tokens.

"The model never stops" is the most reported fine-tuning bug (Llama 3's end-of-turn vs end-of-text, a masked EOS):
the evaluation stops on a list of stop ids (`labkit.evaluate.generation.stop_ids`) and cuts every answer at
`eval.max_new_tokens`, so an answer that never stops is still scored — these values say how many did. Each prediction
row carries `stopped` (bool) and `answer_tokens` (int); `labkit.scoring.metrics.aggregate` averages them into
`stop_rate` and `mean_answer_tokens`.
"""

from __future__ import annotations

from typing import Any

STOP_METRICS = ("stop_rate", "mean_answer_tokens")


def answer_end(generated: list[int], stops: list[int], pad: int | None, limit: int) -> tuple[bool, int]:
    """Whether one generated answer stopped before the length limit, and how many tokens it generated.

    An answer ends at its first stop token (which is not counted: `answer_tokens` are the answer's own tokens).
    Without one, it stopped on a stop string when generation padded it out before `limit` (transformers fills a
    finished row with the pad id until the batch's last row finishes); otherwise it ran to the limit.

    Args:
        generated: the row's generated token ids (the output after the prompt, batch padding included).
        stops: the token ids generation stops on.
        pad: the pad id generation fills finished rows with.
        limit: `eval.max_new_tokens`.
    Returns:
        (stopped, answer_tokens).
    """
    ends = set(stops)
    for i, token in enumerate(generated):
        if token in ends:
            return True, i
    n = len(generated)
    while pad is not None and n and generated[n - 1] == pad:
        n -= 1
    return n < limit, n


def stopping_rows(named: dict[str, dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    """One row per model: its stop rate, the answers that ran to the limit and the mean answer length.

    Args:
        named: {label: metrics} (`labkit.scoring.metrics.aggregate` output, e.g. baseline and tuned).
        limit: `eval.max_new_tokens`.
    Returns:
        [{"model", "stop_rate", "ran to the limit", "mean_answer_tokens", "max_new_tokens"}]; a model measured before
        labkit recorded stopping shows None.
    """
    rows = []
    for label, metrics in named.items():
        overall, n = metrics.get("overall") or {}, metrics.get("n")
        rate = overall.get("stop_rate")
        ran = round((1 - rate) * n) if rate is not None and n else None
        rows.append({"model": label, "stop_rate": rate, "ran to the limit": None if ran is None else f"{ran} of {n}",
                     "mean_answer_tokens": overall.get("mean_answer_tokens"), "max_new_tokens": limit})
    return rows


def stopping_line(named: dict[str, dict[str, Any]], limit: int | None) -> str:
    """The stopping of several models in one sentence (plain text), e.g. for stage 05 and the report.

    Args:
        named: {label: metrics}.
        limit: `eval.max_new_tokens`.
    Returns:
        "Stopped before max_new_tokens (64): baseline 0.40 (36 of 60 ran to the limit, 58.1 tokens on average);
        tuned 1.00 (…)." — or why it is not known.
    """
    parts = []
    for row in stopping_rows(named, limit):
        if row["stop_rate"] is None:
            parts.append(f"{row['model']} not measured (its answers were generated before labkit recorded stopping)")
        else:
            parts.append(f"{row['model']} {row['stop_rate']:.2f} ({row['ran to the limit']} ran to the limit, "
                         f"{row['mean_answer_tokens']:.1f} tokens on average)")
    return f"Stopped before max_new_tokens ({limit}): " + "; ".join(parts) + "."
