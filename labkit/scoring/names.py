"""The metrics' names: what each needs and means, the run metrics and their direction, the two-sided ones.

The catalogue the card is checked against (`labkit.card.schema`) without the scorers (`labkit.scoring.metrics`,
whose ROUGE imports rouge_score and nltk), so reading a card stays fast.
"""

from __future__ import annotations

# name -> (what it needs, what it means); the card's primary metric and guardrails must be one of these.
METRICS: dict[str, tuple[str, str]] = {
    "json_valid_rate": ("json", "share of answers that are exactly one JSON object"),
    "field_presence_rate": ("json", "share of the reference's keys present in the answer"),
    "field_accuracy": ("json", "share of the reference's keys whose value the answer gets right (mean per example)"),
    "slot_precision": ("json", "share of the answer's key-value pairs that are in the reference (micro)"),
    "slot_recall": ("json", "share of the reference's key-value pairs found in the answer (micro)"),
    "slot_f1": ("json", "harmonic mean of slot precision and recall (micro)"),
    "accuracy": ("category", "share of answers whose category equals the reference"),
    "macro_f1": ("category", "unweighted mean of the per-class F1 over the reference labels"),
    "per_category_f1": ("category", "F1 of each category (guardrails judge every category)"),
    "exact_match": ("any", "answer equals the reference after whitespace normalisation"),
    "rouge1": ("any", "ROUGE-1 F-measure against the reference (unigrams; rouge_score, stemmed by default)"),
    "rouge2": ("any", "ROUGE-2 F-measure against the reference (bigrams)"),
    "rougeL": ("any", "ROUGE-L F-measure against the reference (longest common subsequence)"),
    "rougeLsum": ("any", "ROUGE-Lsum F-measure (union LCS over the sentences of answer and reference)"),
    "mean_length_ratio": ("any", "mean over examples of answer words / reference words (a guardrail with min / max: "
                          "no good direction, so not a primary metric, max_drop or early-stopping metric)"),
    "stop_rate": ("any", "share of answers that ended on a stop token before eval.max_new_tokens (text and JSON cards "
                  "get a default guardrail on it: labkit.evaluate.verdict)"),
    "mean_answer_tokens": ("any", "mean over examples of the tokens generated before the stop token (eval.max_new_tokens "
                           "for an answer that ran to it); shown, not judged by default: shorter is not always better, "
                           "so a guardrail with min / max only"),
    "train_seconds": ("run", "wall-clock seconds of stage 04's training (lower is better)"),
    "tokens_per_second": ("run", "training tokens counted (padding excluded) per second of optimiser steps "
                          "(higher is better)"),
    "mfu": ("run", "model FLOPs utilisation of training: FLOPs per token × tokens per second / the device's peak "
            "(docs/cost.md; higher is better)"),
    "peak_memory_gib": ("run", "peak memory of a training step measured by stage 03, GiB (lower is better)"),
    "cost": ("run", "training hours × processes × budget.price_per_gpu_hour (lower is better)"),
}
# run metric -> True when higher is better
RUN_METRICS = {"train_seconds": False, "tokens_per_second": True, "mfu": True, "peak_memory_gib": False, "cost": False}
# metrics without a good direction (a length: closer to the reference's is better): judged only against absolute or
# ratio bounds
TWO_SIDED = ("mean_length_ratio", "mean_answer_tokens")
