"""Observed limits and the model-index: each metric judged in its good direction, only the task's metrics published."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from labkit.card.load import load_card
from labkit.export.hub_card import task_metrics
from labkit.export.limits import judged_change, worse_categories


def test_direction_follows_the_verdict() -> None:
    assert judged_change("field_accuracy", 0.2, 0.5) == pytest.approx(0.3)  # higher is better
    assert judged_change("f1", 0.8, 0.6) == pytest.approx(-0.2)
    assert judged_change("peak_memory_gib", 4.0, 3.0) == pytest.approx(1.0)  # lower is better (RUN_METRICS)
    assert judged_change("mean_length_ratio", 4.4, 1.0) > 0  # too long → the reference's length: better
    assert judged_change("mean_length_ratio", 1.0, 4.4) < 0
    assert judged_change("mean_length_ratio", 0.5, 2.0) == pytest.approx(0.0)  # as far off either way
    assert judged_change("mean_length_ratio", 0.0, 3.2) > 0  # empty answers are farther off than 3.2× too long
    assert judged_change("mean_length_ratio", 1.0, 0.0) < 0 and judged_change("mean_length_ratio", 0.0, 0.0) == 0
    assert judged_change("mean_answer_tokens", 40, 10) is None and judged_change("support", 3, 1) is None


def test_worse_categories_lists_only_what_got_worse_in_its_good_direction() -> None:
    base = {"per_category": {"billing": {"f1": 0.8, "field_accuracy": 0.3, "mean_length_ratio": 4.4, "support": 5,
                                         "mean_answer_tokens": 40.0},
                             "shipping": {"f1": 0.5, "field_accuracy": 0.2, "mean_length_ratio": 1.1, "support": 4}}}
    tuned = {"per_category": {"billing": {"f1": 0.9, "field_accuracy": 0.7, "mean_length_ratio": 1.0, "support": 5,
                                          "mean_answer_tokens": 12.0},
                              "shipping": {"f1": 0.3, "field_accuracy": 0.6, "mean_length_ratio": 2.0, "support": 4}}}
    rows = worse_categories(base, tuned)
    assert [(r["category"], r["metric"]) for r in rows] == [("shipping", "f1"), ("shipping", "mean_length_ratio")]
    assert rows[0]["drop"] == pytest.approx(0.2) and rows[0]["baseline"] == 0.5 and rows[0]["tuned"] == 0.3
    assert worse_categories(None, tuned) == []


def test_model_index_metrics_are_the_tasks(repo) -> None:
    quick = load_card(repo / "params" / "quickstart.yaml").card
    verdict = {"guardrails": [{"metric": "stop_rate"}, {"metric": "json_valid_rate"}, {"metric": "per_category_f1"}]}
    names = task_metrics(quick, verdict)
    assert names[:3] == ["field_accuracy", "json_valid_rate", "stop_rate"]  # the judged ones first
    assert {"field_presence_rate", "slot_f1", "accuracy", "macro_f1"} <= set(names)  # JSON with a category key
    assert not {"rougeL", "rouge1", "exact_match", "mean_length_ratio", "mean_answer_tokens", "per_category_f1",
                "train_seconds"} & set(names)
    text = SimpleNamespace(data=SimpleNamespace(target_format=SimpleNamespace(kind="text", category_key=None)),
                           experiment=SimpleNamespace(target=SimpleNamespace(primary_metric="rougeL"),
                                                      guardrails=[SimpleNamespace(metric="mean_length_ratio")]))
    names = task_metrics(text)
    assert names[:2] == ["rougeL", "mean_length_ratio"] and "rouge2" in names and "stop_rate" in names
    assert "field_accuracy" not in names and "mean_answer_tokens" not in names
