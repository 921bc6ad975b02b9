"""Stage 05's module writes tuned_metrics.json (with the run metrics), verdict.json, experiment.json and the summary;
stage 01's writes its summary from its own files. The summaries have their records' keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.card.load import load_card
from labkit.core import io
from labkit.core import runs as R
from labkit.errors import MissingInput
from labkit.evaluate.verdict import Verdict
from labkit.stages import baseline, comparison
from labkit.stages.context import Stage, open_stage
from labkit.stages.records import BaselineSummary, ComparisonSummary
from labkit.stages.run_metrics import RunMetrics

REPO = Path(__file__).resolve().parents[3]


def _keys(record: type) -> set[str]:
    return set(record.__required_keys__ | record.__optional_keys__)


@pytest.fixture
def run(tmp_path: Path) -> R.Run:
    """A fresh run of the smoke card (primary field_accuracy, min_improvement 0.05; json_valid_rate min 0.0 and
    per_category_f1 max_drop 1.0 as guardrails)."""
    return R.new_run(load_card(REPO / "params" / "smoke.yaml"), tmp_path / "runs")


def _open(run: R.Run, name: str) -> Stage:
    return open_stage(name, str(run.card_path), str(run.dir))


def _metrics(field_accuracy: float) -> dict:
    return {"n": 48, "overall": {"field_accuracy": field_accuracy, "json_valid_rate": 1.0},
            "per_category": {"billing": {"f1": 0.5}, "shipping": {"f1": 0.25}}}


def _predictions(run: R.Run, baseline_share: float, tuned_share: float, n: int = 48) -> None:
    """baseline_predictions.jsonl and tuned_predictions.jsonl of n examples whose field accuracy averages the shares
    (the verdict's paired interval reads them)."""
    for folder, name, share in (("baseline", "baseline_predictions.jsonl", baseline_share),
                                ("comparison", "tuned_predictions.jsonl", tuned_share)):
        right = round(share * n)
        io.write_jsonl(run.dir / folder / name, [{"id": f"r{i:02d}", "category": "billing", "json_valid": 1.0,
                                                  "field_accuracy": float(i < right)} for i in range(n)])


def test_judge_run_writes_the_verdict_and_the_run_metrics(run: R.Run) -> None:
    io.write_json(run.dir / "training" / "outcome.json", {"steps": 8, "world_size": 1, "metrics": {"train_runtime": 7.5}})
    stage = _open(run, "comparison")
    tuned = _metrics(0.5)
    _predictions(run, 0.25, 0.5)  # 12 of 48 examples won, none lost: the interval of the +0.25 gain clears 0.05
    decision = comparison.judge_run(stage, _metrics(0.25), tuned)
    assert set(decision) == _keys(Verdict) and decision["confirmed"] is True
    assert decision["decision"] == "confirmed" and decision["primary"]["gain_low"] > 0.05
    assert decision["primary"]["n"] == 48 and "on n = 48 examples" in decision["verdict"]
    assert decision["primary"]["gain"] == pytest.approx(0.25) and decision["against"] == "baseline"
    assert [g["metric"] for g in decision["guardrails"]] == ["json_valid_rate", "per_category_f1[billing]",
                                                            "per_category_f1[shipping]"]
    assert io.read_json(stage.path("verdict.json")) == decision
    written = io.read_json(stage.path("tuned_metrics.json"))
    assert set(written["run"]) == _keys(RunMetrics) and written["run"]["train_seconds"] == 7.5
    assert written["run"]["steps"] == 8 and written["overall"] == tuned["overall"]


def test_decide_records_the_verdict_json_says(run: R.Run) -> None:
    stage = _open(run, "comparison")
    with pytest.raises(MissingInput, match="comparison/verdict.json is missing"):
        comparison.decide(stage)
    _predictions(run, 0.5, 0.52)
    decision = comparison.judge_run(stage, _metrics(0.5), _metrics(0.52))  # +0.02 < the 0.05 required
    assert decision["confirmed"] is False and decision["verdict"].startswith("NOT CONFIRMED against the baseline")
    summary = comparison.decide(stage)
    assert set(summary) == _keys(ComparisonSummary)
    assert (summary["confirmed"], summary["verdict"], summary["primary"]) == (False, decision["verdict"],
                                                                             decision["primary"])
    assert io.read_json(stage.path("summary.json")) == summary
    comparison.record_experiment(stage, {"experiment": "smoke", "runs": []})
    assert io.read_json(stage.path("experiment.json")) == {"experiment": "smoke", "runs": []}


def test_baseline_decide_reads_the_measurement_files(run: R.Run) -> None:
    stage = _open(run, "baseline")
    stage.prepare_data()
    io.write_json(stage.path("baseline_metrics.json"), _metrics(0.125))  # as run_baseline leaves them
    io.write_json(stage.path("baseline_key.json"), {"key": "k", "cached": True, "cache": "c", "numerics": {}})
    summary = baseline.decide(stage)
    assert set(summary) == _keys(BaselineSummary)
    assert summary["baseline"] == 0.125 and summary["needed"] == pytest.approx(0.175) and summary["cached"] is True
    assert (summary["primary_metric"], summary["against"]) == ("field_accuracy", "baseline")
    assert summary["data_version"] == io.read_json(run.dir / "data_manifest.json")["data_version"]
    assert io.read_json(stage.path("summary.json")) == summary
