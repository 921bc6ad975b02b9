"""Per-example scoring of label and JSON targets on small fixed prediction files: the paired view, the concentration
check, per-class precision / recall / F1 (scikit-learn's definitions, worked by hand), slot F1 with optional keys."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from labkit.core.io import read_jsonl
from labkit.evaluate.verdict import paired
from labkit.scoring.bootstrap import Columns, concentration_for, metric, paired_intervals
from labkit.scoring.metrics import OTHER, per_class_f1, score_key, score_predictions
from labkit.show.plots import confusion_counts

DATA = Path(__file__).parent / "data"
LABEL = {"kind": "label", "required_keys": [], "category_key": None}


def _label_rows() -> tuple[list[dict], list[dict], dict, dict]:
    base, base_metrics = score_predictions(read_jsonl(DATA / "label_baseline.jsonl"), LABEL)
    tuned, tuned_metrics = score_predictions(read_jsonl(DATA / "label_tuned.jsonl"), LABEL)
    return base, tuned, base_metrics, tuned_metrics


def test_per_class_precision_recall_f1_as_scikit_learn_defines_them() -> None:
    # worked by hand, as sklearn.metrics.precision_recall_fscore_support(gold, pred, labels=[account, billing, shipping]):
    # billing  tp 2 (t00, t01), fp 1 (t07 is shipping), fn 1 (t02)  -> P 2/3, R 2/3, F1 2/3, support 3
    # account  tp 2 (t03, t09), fp 1 (t02 is billing),  fn 1 (t04 answered free text) -> P 2/3, R 2/3, F1 2/3, support 3
    # shipping tp 3 (t05, t06, t08), fp 0, fn 1 (t07)    -> P 1, R 3/4, F1 2·(3/4)/(7/4) = 6/7, support 4
    # accuracy_score = 7/10; f1_score(average="macro", labels=reference labels) = (2/3 + 2/3 + 6/7) / 3 = 46/63
    _, tuned, _, metrics = _label_rows()
    per = metrics["per_category"]
    assert per["billing"]["precision"] == pytest.approx(2 / 3) and per["billing"]["recall"] == pytest.approx(2 / 3)
    assert per["account"]["f1"] == pytest.approx(2 / 3) and per["account"]["support"] == 3
    assert per["shipping"] == pytest.approx({**per["shipping"], "precision": 1.0, "recall": 0.75, "f1": 6 / 7, "support": 4})
    assert metrics["overall"]["accuracy"] == pytest.approx(0.7)
    assert metrics["overall"]["macro_f1"] == pytest.approx(46 / 63)
    # accuracy within a category is what it says: the share of that category answered right (its recall), not F1
    assert per["shipping"]["accuracy"] == pytest.approx(0.75) and per["shipping"]["accuracy"] != per["shipping"]["f1"]
    ones = np.ones((1, len(tuned)))
    cols = Columns(tuned, [r["id"] for r in tuned])
    assert metric(ones, cols, "macro_f1")[0] == pytest.approx(46 / 63)
    # a known label nobody answered is reported with support 0 and does not enter macro-F1 (absent from the references)
    known = per_class_f1(["a", "a", "b"], ["a", "c", "b"], labels=["a", "b", "c"])
    assert known["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}


def test_label_task_paired_wins_losses_ties_and_concentration() -> None:
    base, tuned, base_metrics, tuned_metrics = _label_rows()
    assert [r["correct"] for r in base] == [1, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    # t01 t03 t05 t06 t08 t09 become right; t02 becomes wrong; t00 stays right, t04 t07 stay wrong
    assert paired(base, tuned, "accuracy") == {"key": "correct", "wins": 6, "losses": 1, "ties": 3}
    assert paired(base, tuned, "macro_f1")["wins"] == 6
    found = concentration_for(base, tuned, "accuracy")
    assert found["net_gain"] == 5 and found["top_examples"] == 1 and found["top_share_of_gain"] == pytest.approx(0.2)
    assert found["gain_by_category"] == {"billing": 0.0, "account": 2.0, "shipping": 3.0}
    assert found["flags"] == [] and "the largest category (shipping) carries 60%" in found["statement"]
    one = [dict(r, correct=r["correct"] if r["category"] != "shipping" else 0.0) for r in base]
    only_shipping = concentration_for(one, [dict(r, correct=1.0 if r["category"] == "shipping" else o["correct"])
                                            for r, o in zip(tuned, one)], "accuracy")
    assert any("one category (shipping)" in f for f in only_shipping["flags"])
    assert concentration_for(base, tuned, "train_seconds") is None  # a run metric has no per-example value
    intervals = paired_intervals(base, tuned, ["accuracy"], resamples=300)
    assert intervals["overall"]["accuracy"]["diff"]["value"] == pytest.approx(0.5)
    assert intervals["per_category"]["accuracy"]["shipping"]["tuned"]["value"] == pytest.approx(0.75)


def test_confusion_matrix_over_known_labels_plus_one_other_answer_column() -> None:
    base, tuned, _, _ = _label_rows()
    rows, columns, counts = confusion_counts(tuned, ["account", "billing", "shipping"])
    assert columns == ["account", "billing", "shipping", OTHER] and rows == ["account", "billing", "shipping"]
    assert counts[0].tolist() == [2, 0, 0, 1]  # account: two right, one free-text answer
    _, columns, counts = confusion_counts(base, ["account", "billing", "shipping"])
    assert len(columns) == 4 and counts[:, 3].sum() == 8  # eight distinct free-text answers: one column
    many = [f"label{i:02d}" for i in range(40)]
    rows40 = [{"category": lab, "predicted_category": lab if i % 3 else "?"} for i, lab in enumerate(many * 2)]
    rows_, columns, counts = confusion_counts(rows40, many, top_k=30)
    assert len(rows_) == 31 and rows_[-1] == "10 other labels" and columns[-1] == OTHER and counts.sum() == 80


SLOTS = {"kind": "json", "required_keys": ["category"], "optional_keys": ["product", "order_id"], "category_key": "category"}


def test_slot_f1_with_optional_keys() -> None:
    refs = [{"category": "billing"}, {"category": "account", "product": "Beacon"}, {"category": "shipping", "order_id": "A1"}]
    answers = [{"category": "billing"}, {"category": "account", "product": "beacon", "order_id": None},
               {"category": "billing", "product": "Atlas"}]
    rows = [{"id": f"j{i}", "category": r["category"], "target": json.dumps(r), "prediction": json.dumps(a)}
            for i, (r, a) in enumerate(zip(refs, answers))]
    scored, metrics = score_predictions(rows, SLOTS)
    # a reference without an optional key does not penalise a perfect answer
    assert [r["slot_f1"] for r in scored[:2]] == [1.0, 1.0] and [r["field_accuracy"] for r in scored[:2]] == [1.0, 1.0]
    # totals: tp 1 + 2 + 0, fp 0 + 0 + 2 (wrong category, unexpected product), fn 0 + 0 + 2 (category, order_id)
    overall = metrics["overall"]
    assert (overall["slot_precision"], overall["slot_recall"], overall["slot_f1"]) == pytest.approx((0.6, 0.6, 0.6))
    assert overall["field_accuracy"] == pytest.approx(2 / 3)
    per_key = metrics["per_key"]
    assert per_key["category"] == pytest.approx({"slot_precision": 2 / 3, "slot_recall": 2 / 3, "slot_f1": 2 / 3, "support": 3})
    assert per_key["product"] == pytest.approx({"slot_precision": 0.5, "slot_recall": 1.0, "slot_f1": 2 / 3, "support": 1})
    assert per_key["order_id"]["slot_recall"] == 0.0 and per_key["order_id"]["support"] == 1
    intervals = paired_intervals(scored, scored, ["slot_f1"], resamples=200)
    assert intervals["overall"]["slot_f1"]["tuned"]["value"] == pytest.approx(0.6)
    assert set(intervals["per_key"]["slot_f1"]) == {"category", "product", "order_id"}
    assert intervals["per_key"]["slot_f1"]["product"]["tuned"]["value"] == pytest.approx(2 / 3)


def test_nested_values_compare_as_json_in_fields_and_slots_alike() -> None:
    fmt = {"kind": "json", "required_keys": ["name", "address", "tags", "count"], "optional_keys": [],
           "category_key": None}
    ref = {"name": "Ana", "address": {"city": "Oslo", "zip": "0150"}, "tags": ["a", "b"], "count": 3}
    same = {"count": 3.0, "tags": ["a", "b"], "address": {"zip": "0150", "city": " oslo"}, "name": "ana"}
    other = {"count": 3.5, "tags": ["b", "a"], "address": {"zip": "0151", "city": "Oslo"}, "name": "Ana"}
    rows = [{"id": f"n{i}", "category": "x", "target": json.dumps(ref), "prediction": json.dumps(a)}
            for i, a in enumerate((same, other))]
    scored, _ = score_predictions(rows, fmt)
    # key order inside an object, 3 vs 3.0, case and spaces do not matter; a list's order and another number do
    assert [r["field_accuracy"] for r in scored] == [1.0, 0.25]
    assert [r["slot_f1"] for r in scored] == [1.0, 0.25]
    assert scored[1]["slots"] == {"name": [1, 0, 0], "address": [0, 1, 1], "tags": [0, 1, 1], "count": [0, 1, 1]}


def test_a_category_column_the_answers_never_name_scores_no_accuracy_and_groups_the_rows() -> None:
    """A JSON target whose references lack `category_key` (the category is a column only): no predicted category,
    so no accuracy, macro_f1 or per-class F1 (they would read 0 for every model), and the per-example score the
    example tables compare is field accuracy; one reference holding the key brings them back."""
    fmt = {"kind": "json", "required_keys": ["city", "date"], "optional_keys": [], "category_key": "category"}
    refs = [{"city": "Oslo", "date": "2027-01-02"}, {"city": "Łódź", "date": "2027-03-04"}]
    answers = [{"city": "Oslo", "date": "2027-01-02"}, {"city": "Lodz", "date": "2027-03-04"}]
    rows = [{"id": f"e{i}", "category": kind, "target": json.dumps(r), "prediction": json.dumps(a)}
            for i, (r, a, kind) in enumerate(zip(refs, answers, ["launch", "review"]))]
    scored, metrics = score_predictions(rows, fmt)
    assert not any("predicted_category" in r or "correct" in r for r in scored)
    assert "accuracy" not in metrics["overall"] and "macro_f1" not in metrics["overall"] and "labels" not in metrics
    assert {c: v["field_accuracy"] for c, v in metrics["per_category"].items()} == {"launch": 1.0, "review": 0.5}
    assert not any("f1" in v for v in metrics["per_category"].values())
    assert score_key(scored) == "field_accuracy"
    rows[0]["target"] = json.dumps({**refs[0], "category": "launch"})
    scored, metrics = score_predictions(rows, fmt)
    assert all("predicted_category" in r for r in scored) and "accuracy" in metrics["overall"]
    assert score_key(scored) == "correct"
