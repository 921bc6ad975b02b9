"""The strongest baseline: the base model measured under every prompt of `eval.baseline_prompts`, the best one the
reference.

A base model measured only under the training prompt (which it never saw) can be a straw man: "tuned beats base" then
partly measures "learned the format". Each prompt is measured with the evaluation procedure (same rows, decoding and
metrics; `labkit.evaluate.procedure.evaluate_rows`), and the strongest on the primary metric, in its good direction
(`labkit.evaluate.verdict.higher_is_better`), is the reference of the hypothesis. A tie keeps the prompt listed
first; a run metric as primary metric keeps the first measured prompt (the base model has no run metrics).
"""

from __future__ import annotations

from typing import Any, TypedDict

from labkit.card.baseline_prompts import BaselinePrompt, FewShotPrompt, parse, prompt_names, spec
from labkit.card.schema import Card
from labkit.data.prompting_baseline import (
    baseline_prompt_ids,
    chat_template_skip,
    describe,
    draw_shots,
    stop_strings,
)
from labkit.errors import CardError
from labkit.evaluate.procedure import evaluate_rows
from labkit.evaluate.verdict import higher_is_better
from labkit.scoring.metrics import RUN_METRICS, metric_value


class PromptResult(TypedDict):
    """One baseline prompt measured (or skipped): an entry of baseline/baseline_prompts.json."""

    name: str  # training, chat_template, template, few_shot_3, or the card's `name`
    spec: Any  # the card's item (`labkit.card.baseline_prompts.parse` reads it back)
    description: str  # in words
    stop: list[str]  # stop strings
    shots: list[dict[str, Any]]  # few-shot: the training rows in the prompt ({"id", "input", "target"})
    skipped: str | None  # why it was not measured (None: measured)
    primary: float | None  # the primary metric
    metrics: dict[str, Any] | None  # aggregated metrics (None when skipped)


def _too_long(model: Any, card: Card, prompts: list[list[int]]) -> str | None:
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    need = max(len(p) for p in prompts) + (card.eval.max_new_tokens or 0)
    if isinstance(limit, int) and need > limit:
        return f"the longest prompt plus eval.max_new_tokens is {need} tokens, over the model's {limit}"
    return None


def measure_prompt(model: Any, tokenizer: Any, card: Card, rows: list[dict[str, Any]], item: BaselinePrompt,
                   shots: list[dict[str, Any]], label: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The base model's answers to `rows` under one baseline prompt, scored (the evaluation procedure).

    Args:
        model: the base model.
        tokenizer: its tokenizer.
        card: the card.
        rows: the evaluation rows.
        item: the baseline prompt.
        shots: its few-shot examples (empty for other prompts).
        label: progress label.
    Returns:
        (per-example rows with scores, aggregated metrics).
    """
    prompts = [baseline_prompt_ids(tokenizer, card, item, r["input"], shots) for r in rows]
    return evaluate_rows(model, tokenizer, card, rows, label, prompts=prompts, stop_strings=stop_strings(item) or None)


def measure_all(model: Any, tokenizer: Any, card: Card, rows: list[dict[str, Any]],
                train_rows: list[dict[str, Any]]) -> list[tuple[PromptResult, list[dict[str, Any]]]]:
    """Every prompt of `eval.baseline_prompts` measured on `rows`, or skipped with its reason.

    Args:
        model: the base model.
        tokenizer: its tokenizer.
        card: the card.
        rows: the evaluation rows.
        train_rows: the training split's rows (the only source of few-shot examples).
    Returns:
        one (PromptResult, scored rows) per prompt, in the card's order (no rows when skipped).
    """
    out: list[tuple[PromptResult, list[dict[str, Any]]]] = []
    metric = card.experiment.target.primary_metric
    for name, item in zip(prompt_names(card.eval.baseline_prompts), card.eval.baseline_prompts, strict=True):
        shots = draw_shots(train_rows, item.few_shot, item.seed) if isinstance(item, FewShotPrompt) else []
        result: PromptResult = {"name": name, "spec": spec(item), "description": describe(item),
                                "stop": stop_strings(item), "shots": shots, "skipped": None, "primary": None,
                                "metrics": None}
        skip = chat_template_skip(tokenizer, card) if item == "chat_template" else None
        if skip is None and rows and item != "training":  # the training prompt is measured as it always was
            skip = _too_long(model, card, [baseline_prompt_ids(tokenizer, card, item, r["input"], shots) for r in rows])
        if skip is not None:
            out.append(({**result, "skipped": skip}, []))
            continue
        scored, metrics = measure_prompt(model, tokenizer, card, rows, item, shots, f"baseline ({name})")
        result.update(metrics=metrics, primary=None if metric in RUN_METRICS else _primary(metrics, metric))
        out.append((result, scored))
    return out


def _primary(metrics: dict[str, Any], metric: str) -> float | None:
    try:
        value = metric_value(metrics, metric)
    except KeyError:
        return None
    return float(value) if isinstance(value, (int, float)) else None


def strongest(results: list[PromptResult], metric: str) -> str:
    """The name of the strongest measured prompt on the primary metric, in its good direction.

    Args:
        results: the measured (and skipped) prompts, in the card's order.
        metric: the primary metric.
    Returns:
        the strongest prompt's name (the first measured on a tie, or when no prompt has the metric).
    Raises:
        CardError: no prompt was measured (every one skipped).
    """
    measured = [r for r in results if r["skipped"] is None]
    if not measured:
        raise CardError("eval.baseline_prompts: no prompt could be measured (" + "; ".join(
            f"{r['name']}: {r['skipped']}" for r in results) + "); add `training`")
    sign = 1.0 if higher_is_better(metric) else -1.0
    best = measured[0]
    for result in measured[1:]:
        value, top = result["primary"], best["primary"]
        if value is not None and (top is None or sign * value > sign * top):
            best = result
    return best["name"]


def item_of(result: PromptResult) -> BaselinePrompt:
    """The baseline prompt a recorded result was measured under (for `labkit final` to measure it again)."""
    return parse(result["spec"])


def measure_strongest(model: Any, tokenizer: Any, card: Card, rows: list[dict[str, Any]],
                      recorded: dict[str, Any] | None, label: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The base model on other rows (the test split: `labkit final`) under the prompt stage 01 found strongest.

    Args:
        model: the base model.
        tokenizer: its tokenizer.
        card: the card.
        rows: the rows to evaluate.
        recorded: stage 01's baseline_prompts.json (None for a run from before baseline prompts: the training prompt).
        label: progress label.
    Returns:
        (per-example rows with scores, aggregated metrics), with the same prompt and few-shot examples as stage 01.
    """
    if recorded is None:
        return evaluate_rows(model, tokenizer, card, rows, label)
    best = next(p for p in recorded["prompts"] if p["name"] == recorded["strongest"])
    return measure_prompt(model, tokenizer, card, rows, item_of(best), best["shots"], label)
