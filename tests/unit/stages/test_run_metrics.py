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
    assert m["train_seconds"] == 338.0 and m["steps"] == 63 and m["predicted_tokens"] == 100_000
    assert m["tokens_seen"] is None and m["tokens_per_second"] is None and m["mfu"] is None  # trained before counting
    assert m["peak_memory_gib"] == 2.25 and m["cost"] == pytest.approx(338.0 / 3600 * 3.6)
    assert run_metrics(tmp_path / "nothing")["train_seconds"] is None
    assert set(m) == set(RunMetrics.__required_keys__) and m["predicted_train_seconds"] == 300.0


def test_run_metrics_read_the_counted_tokens_and_mfu(tmp_path: Path) -> None:
    run = _run(tmp_path, "counted", 338.0, epoch=2.0)
    outcome = json.loads((run / "training" / "outcome.json").read_text())
    outcome["cost"] = {"tokens": 91_234, "loss_tokens": 20_001, "session_tokens": 91_234, "step_seconds": 300.0,
                       "tokens_per_second": 91_234 / 300.0, "parameters": 1000, "trainable_parameters": 10,
                       "reference_parameters": 0, "flops_per_token": 4020.0, "convention": "4N + 2N_trainable",
                       "precision": "fp32", "peak_flops": 5e10, "peak_source": "measured", "world_size": 1,
                       "mfu": 4020.0 * 91_234 / 300.0 / 5e10}
    (run / "training" / "outcome.json").write_text(json.dumps(outcome))
    m = run_metrics(run)
    assert (m["tokens_seen"], m["loss_tokens"], m["predicted_tokens"]) == (91_234, 20_001, 100_000)
    assert m["tokens_per_second"] == pytest.approx(91_234 / 300.0) and m["peak_flops"] == 5e10
    assert m["mfu"] == pytest.approx(4020.0 * 91_234 / 300.0 / 5e10) and 0 < m["mfu"] < 1
    assert m["flops_per_token"] == 4020.0 and m["flops_convention"].startswith("4N + 2N_trainable; peak: measured")


def test_a_reference_runs_metrics_carry_its_run_metrics(tmp_path: Path) -> None:
    run = _run(tmp_path, "parent", 100.0)
    (run / "comparison").mkdir()
    (run / "comparison" / "tuned_metrics.json").write_text(json.dumps({"overall": {"field_accuracy": 0.8}}))
    got = reference_metrics(run, price_per_gpu_hour=36.0)
    assert got["overall"] == {"field_accuracy": 0.8} and got["run"]["cost"] == pytest.approx(1.0)
