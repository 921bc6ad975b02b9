"""Hypotheses against a sibling variant, and run metrics (time, throughput, memory, cost) judged as metrics
(tests/unit/stages/test_run_metrics.py reads them from a run's files)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from conftest import write_run_files

from labkit.card.load import load_card
from labkit.card.schema import Card
from labkit.errors import CardError
from labkit.evaluate.verdict import verdict
from labkit.stages.run_metrics import run_metrics

REPO = Path(__file__).resolve().parents[3]


def _card(**target) -> Card:
    raw = copy.deepcopy(load_card(REPO / "params" / "examples" / "ticket-packed.yaml").resolved)
    raw["experiment"]["target"] = {"behaviour": "extraction", "primary_metric": "field_accuracy", **target}
    raw["experiment"]["guardrails"] = [{"metric": "train_seconds", "max_ratio": 1.0},
                                       {"metric": "json_valid_rate", "max_drop": 0.05}]
    return Card.model_validate(raw)


_run = write_run_files


def _metrics(field_accuracy: float, valid: float, run: dict | None = None) -> dict:
    return {"n": 100, "overall": {"field_accuracy": field_accuracy, "json_valid_rate": valid}, "per_category": {},
            **({"run": run} if run else {})}


def _rows(field_accuracy: float) -> list[dict]:
    """100 scored examples whose field accuracy averages `field_accuracy` (the first ones right): two such lists
    differ only on the examples between their two shares."""
    right = round(field_accuracy * 100)
    return [{"id": f"e{i:03d}", "category": None, "field_accuracy": float(i < right), "json_valid": 1.0}
            for i in range(100)]


def test_against_variant_train_seconds_guardrail_refuted_when_the_variant_is_slower(tmp_path: Path) -> None:
    card = _card(against="quickstart-lora-r16", min_improvement=-0.01)  # at least the parent's accuracy, in less time
    baseline = _metrics(0.01, 0.2)
    parent = _metrics(0.85, 1.0, run_metrics(_run(tmp_path, "parent", 292.0)))
    slower = _metrics(0.86, 1.0, run_metrics(_run(tmp_path, "packed", 338.0)))
    decision = verdict(card, baseline, slower, parent, "parent-run", reference_rows=_rows(0.85), tuned_rows=_rows(0.86))
    assert decision["confirmed"] is False and decision["against"] == "quickstart-lora-r16"
    assert decision["primary"]["ok"] is True and decision["primary"]["reference"] == 0.85  # judged against the parent
    rail = next(r for r in decision["guardrails"] if r["metric"] == "train_seconds")
    assert rail["ok"] is False and rail["reference"] == 292.0 and rail["value"] == 338.0
    assert "338.000 / 292.000 = 1.158 > max_ratio 1.0" in rail["why"]
    assert decision["verdict"].startswith("NOT CONFIRMED against variant quickstart-lora-r16 (run parent-run)")
    assert "train_seconds" in decision["verdict"]
    faster = _metrics(0.86, 1.0, run_metrics(_run(tmp_path, "packed-fast", 250.0)))
    # one example better, none worse: the interval of the gain, [0, +0.03], clears "at most 0.01 worse"
    faster_decision = verdict(card, baseline, faster, parent, "parent-run", reference_rows=_rows(0.85),
                              tuned_rows=_rows(0.86))
    assert faster_decision["confirmed"] is True and faster_decision["decision"] == "confirmed"
    assert faster_decision["primary"]["gain_low"] >= -0.01 and faster_decision["primary"]["n"] == 100
    worse = _metrics(0.80, 1.0, run_metrics(_run(tmp_path, "packed-worse", 250.0)))
    assert "field_accuracy gain -0.050 < required -0.01" in verdict(card, baseline, worse, parent, "p",
                                                                   reference_rows=_rows(0.85),
                                                                   tuned_rows=_rows(0.80))["verdict"]
    pending = verdict(card, baseline, slower)  # the parent has no completed run yet: no verdict, said so
    assert pending["confirmed"] is False and pending["verdict"].startswith("NOT JUDGED")


def test_run_metric_as_primary_with_a_ratio(tmp_path: Path) -> None:
    card = _card(primary_metric="train_seconds", against="quickstart-lora-r16", max_ratio=0.8)
    parent = _metrics(0.85, 1.0, run_metrics(_run(tmp_path, "parent", 300.0)))
    quick = _metrics(0.85, 1.0, run_metrics(_run(tmp_path, "quick", 200.0)))
    decision = verdict(card, _metrics(0.01, 0.2), quick, parent, "parent-run")  # a run metric needs no examples
    assert decision["primary"]["ratio"] == pytest.approx(2 / 3) and decision["primary"]["gain"] == 100.0
    assert decision["confirmed"] is True
    assert decision["primary"]["rule"] == "point" and decision["primary"]["n"] is None
    assert "run metric, one number per run: judged on that number" in decision["verdict"]


def test_card_refuses_a_run_metric_compared_with_the_base_model(tmp_path: Path) -> None:
    raw = copy.deepcopy(load_card(REPO / "params" / "quickstart.yaml").resolved)
    raw["experiment"]["guardrails"] = [{"metric": "train_seconds", "max_ratio": 1.0}]
    path = tmp_path / "card.yaml"
    import yaml

    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(CardError, match="train_seconds max_ratio compares with the reference.*target.against"):
        load_card(path)
    raw["experiment"]["guardrails"] = [{"metric": "train_seconds", "max": 600}]  # an absolute bound needs no reference
    path.write_text(yaml.safe_dump(raw))
    assert load_card(path).card.experiment.guardrails[0].max == 600
    raw["data"]["target_format"]["optional_keys"] = ["category"]
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(CardError, match="both required and optional"):
        load_card(path)
