"""Run metrics read from a run's stage 03 and 04 files (labkit.stages.run_metrics), and a reference run's metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.stages.run_metrics import RunMetrics, reference_metrics, run_metrics


def _run(tmp: Path, name: str, seconds: float, epoch: float = 1.0) -> Path:
    run = tmp / name
    (run / "training").mkdir(parents=True)
    (run / "parameter_check").mkdir()
    (run / "training" / "outcome.json").write_text(json.dumps(
        {"steps": 63, "world_size": 1, "metrics": {"train_runtime": seconds, "epoch": epoch}}))
    (run / "parameter_check" / "fit.json").write_text(json.dumps({"plan": {"train_tokens": 50_000, "train_seconds": 300.0}}))
    (run / "parameter_check" / "memory.json").write_text(json.dumps(
        {"comparison": [{"peak_gib_measured": 1.5}, {"peak_gib_measured": 2.25}]}))
    return run


def test_run_metrics_from_the_stage_files(tmp_path: Path) -> None:
    m = run_metrics(_run(tmp_path, "a", 338.0, epoch=2.0), price_per_gpu_hour=3.6)
    assert m["train_seconds"] == 338.0 and m["steps"] == 63 and m["tokens_seen"] == 100_000
    assert m["tokens_per_second"] == pytest.approx(100_000 / 338.0)
    assert m["peak_memory_gib"] == 2.25 and m["cost"] == pytest.approx(338.0 / 3600 * 3.6)
    assert run_metrics(tmp_path / "nothing")["train_seconds"] is None
    assert set(m) == set(RunMetrics.__required_keys__) and m["predicted_train_seconds"] == 300.0


def test_a_reference_runs_metrics_carry_its_run_metrics(tmp_path: Path) -> None:
    run = _run(tmp_path, "parent", 100.0)
    (run / "comparison").mkdir()
    (run / "comparison" / "tuned_metrics.json").write_text(json.dumps({"overall": {"field_accuracy": 0.8}}))
    got = reference_metrics(run, price_per_gpu_hour=36.0)
    assert got["overall"] == {"field_accuracy": 0.8} and got["run"]["cost"] == pytest.approx(1.0)
