"""The counted cost where people read it: the report's runs table and the metrics sent to MLflow."""

from __future__ import annotations

from labkit.experiment.runs_table import summary_rows
from labkit.experiment.tracking import numbers


COST = {"tokens": 91_234, "loss_tokens": 20_001, "tokens_per_second": 304.1, "mfu": 0.0123, "peak_flops": 5e10,
        "convention": "6N (full training)"}


def test_the_runs_table_shows_counted_tokens_per_second_and_mfu() -> None:
    counted = {"run_id": "a", "status": "completed", "run_metrics": {"tokens_seen": 91_234, "tokens_per_second": 304.1,
                                                                     "mfu": 0.0123}}
    old = {"run_id": "b", "status": "completed", "run_metrics": {"tokens_seen": None, "tokens_per_second": None}}
    rows = summary_rows({"runs": [counted, old]})
    assert rows[0]["tokens seen"] == "91,234" and rows[0]["tokens/s · MFU"] == "304 · 1.23%"
    assert rows[1]["tokens seen"] == "—" and rows[1]["tokens/s · MFU"] == "—"  # trained before labkit counted


def test_the_counted_cost_lands_in_mlflow_from_the_outcome_and_the_run_metrics() -> None:
    sent = numbers({"steps": 8, "cost": COST}, "training")
    assert sent["training/cost.tokens"] == 91_234 and sent["training/cost.mfu"] == 0.0123
    assert "training/cost.convention" not in sent  # text is no metric
    sent = numbers({"overall": {"field_accuracy": 0.5}, "run": {"mfu": 0.0123, "loss_tokens": 20_001}}, "comparison")
    assert sent["comparison/run.mfu"] == 0.0123 and sent["comparison/run.loss_tokens"] == 20_001
