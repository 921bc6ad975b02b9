"""Metrics on hand-made predictions, and the verdict/guardrail logic built on them."""

from __future__ import annotations

import json

import pytest

from labkit.card.load import load_card
from labkit.evaluate.verdict import guardrail_checks, paired, verdict
from labkit.scoring.metrics import (
    aggregate,
    parse_json_answer,
    per_class_f1,
    score_example,
    score_predictions,
)

FMT = {"kind": "json", "required_keys": ["category", "priority", "product"], "category_key": "category"}


def _t(cat: str, pri: str, prod: str) -> str:
    return json.dumps({"category": cat, "priority": pri, "product": prod})


def test_parse_strict_and_lenient() -> None:
    assert parse_json_answer('  {"a": 1} ') == ({"a": 1}, True)
    assert parse_json_answer('```json\n{"a": 1}\n```') == ({"a": 1}, False)
    assert parse_json_answer('Sure! {"a": 1} hope it helps') == ({"a": 1}, False)
    assert parse_json_answer("[1, 2]") == (None, False)
    assert parse_json_answer("no json here") == (None, False)
    assert parse_json_answer('{"a": ') == (None, False)


def test_score_example_fields() -> None:
    gold = _t("billing", "high", "Orbit Phone")
    perfect = score_example(gold, gold, FMT)
    assert perfect["json_valid"] == 1.0 and perfect["field_accuracy"] == 1.0 and perfect["exact_match"] == 1.0
    two_of_three = score_example(_t("billing", "low", "orbit phone"), gold, FMT)
    assert two_of_three["field_accuracy"] == pytest.approx(2 / 3)  # case-insensitive product, wrong priority
    assert two_of_three["field_presence"] == 1.0
    partial = score_example('{"category": "billing"}', gold, FMT)
    assert partial["field_presence"] == pytest.approx(1 / 3)
    assert partial["predicted_category"] == "billing"
    prose = score_example("It is a billing problem.", gold, FMT)
    assert prose["json_valid"] == 0.0 and prose["field_accuracy"] == 0.0 and prose["predicted_category"] == "<none>"
    fenced = score_example(f"```json\n{gold}\n```", gold, FMT)
    assert fenced["json_valid"] == 0.0 and fenced["field_accuracy"] == 1.0


def test_per_class_f1_by_hand() -> None:
    gold = ["a", "a", "b", "b", "c"]
    pred = ["a", "b", "b", "b", "<none>"]
    f1 = per_class_f1(gold, pred)
    assert f1["a"] == {"precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3), "support": 2}
    assert f1["b"]["precision"] == pytest.approx(2 / 3) and f1["b"]["recall"] == 1.0
    assert f1["b"]["f1"] == pytest.approx(0.8)
    assert f1["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert "<none>" not in f1


def _rows(preds: list[tuple[str, str]]) -> list[dict]:
    return [{"id": f"r{i}", "category": cat, "target": _t(cat, "low", "X"), "prediction": p}
            for i, (cat, p) in enumerate(preds)]


def test_aggregate_overall_and_per_category() -> None:
    rows = _rows([("billing", _t("billing", "low", "X")), ("billing", "garbage"),
                  ("shipping", _t("shipping", "low", "Y")), ("shipping", _t("billing", "low", "X"))])
    scored, metrics = score_predictions(rows, FMT)
    assert metrics["n"] == 4
    overall = metrics["overall"]
    assert overall["json_valid_rate"] == 0.75
    assert overall["field_accuracy"] == pytest.approx((1 + 0 + 2 / 3 + 2 / 3) / 4)
    assert overall["accuracy"] == 0.5
    billing = metrics["per_category"]["billing"]
    assert billing["recall"] == 0.5 and billing["precision"] == 0.5 and billing["support"] == 2
    assert metrics["per_category"]["shipping"]["json_valid_rate"] == 1.0
    assert scored[1]["predicted_category"] == "<none>"


def test_rouge_for_text_targets() -> None:
    fmt = {"kind": "text", "required_keys": [], "category_key": None}
    rows = [{"id": "a", "category": None, "target": "the cat sat on the mat", "prediction": "the cat sat on the mat"},
            {"id": "b", "category": None, "target": "the cat sat on the mat", "prediction": "dogs bark loudly"}]
    _, metrics = score_predictions(rows, fmt)
    assert metrics["overall"]["rougeL"] == pytest.approx(0.5)
    assert "rouge_l" not in metrics["overall"]  # replaced by rouge_score's own names, not kept beside them
    assert "json_valid_rate" not in metrics["overall"]


def test_empty_rows_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        aggregate([], FMT)


def _metrics(preds):
    return score_predictions(_rows(preds), FMT)


def test_verdict_and_guardrails(repo) -> None:
    card = load_card(repo / "params" / "quickstart.yaml").card
    base_three = [("billing", "no idea"), ("shipping", "no idea"), ("billing", _t("billing", "low", "X"))]
    tuned_three = [("billing", _t("billing", "low", "X")), ("shipping", _t("shipping", "low", "X")),
                   ("billing", _t("billing", "low", "X"))]
    base_rows, base = _metrics(base_three * 8)  # 24 examples: enough for the interval of a +0.67 gain to clear 0.30
    tuned_rows, tuned = _metrics(tuned_three * 8)
    decision = verdict(card, base, tuned, reference_rows=base_rows, tuned_rows=tuned_rows)
    assert decision["primary"]["gain"] == pytest.approx(tuned["overall"]["field_accuracy"] - base["overall"]["field_accuracy"])
    assert decision["confirmed"] is True, decision
    assert decision["primary"]["gain_low"] > 0.30 and decision["primary"]["n"] == 24
    assert all(r["ok"] for r in decision["guardrails"])
    assert paired(base_rows, tuned_rows, "field_accuracy") == {"key": "field_accuracy", "wins": 16, "losses": 0, "ties": 8}
    # the same gain on the first three examples alone: the point estimate clears 0.30, its interval does not
    few_base_rows, few_base = _metrics(base_three)
    few_tuned_rows, few_tuned = _metrics(tuned_three)
    few = verdict(card, few_base, few_tuned, reference_rows=few_base_rows, tuned_rows=few_tuned_rows)
    assert few["decision"] == "inconclusive" and few["confirmed"] is False and few["primary"]["point_ok"] is True
    assert few["primary"]["gain_low"] < 0.30 and few["primary"]["examples_needed"] > 3
    assert few["verdict"].startswith("INCONCLUSIVE against the baseline")
    # the reverse direction fails the primary metric AND the per-category guardrail, each with a reason
    worse = verdict(card, tuned, base, reference_rows=tuned_rows, tuned_rows=base_rows)
    assert worse["confirmed"] is False
    failed = [r for r in worse["guardrails"] if not r["ok"]]
    assert {r["metric"] for r in failed} >= {"json_valid_rate", "per_category_f1[shipping]"}
    assert "worse by" in next(r["why"] for r in failed if r["metric"] == "per_category_f1[shipping]")
    assert worse["verdict"].startswith("NOT CONFIRMED")


def test_guardrail_min_boundary(repo) -> None:
    card = load_card(repo / "params" / "quickstart.yaml").card
    _, base = _metrics([("billing", _t("billing", "low", "X"))] * 19 + [("billing", "x")])
    rows = guardrail_checks(card, base, base)
    valid = next(r for r in rows if r["metric"] == "json_valid_rate")
    assert valid["value"] == 0.95 and valid["ok"]  # min is inclusive
