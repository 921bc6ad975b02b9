"""Run metrics read from a run's stage 03 and 04 files (labkit.stages.run_metrics), and a reference run's metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import write_run_files

from labkit.stages.run_metrics import RunMetrics, reference_metrics, run_metrics


_run = write_run_files


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
