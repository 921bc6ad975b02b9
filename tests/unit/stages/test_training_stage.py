"""Stage 04's record comes from training/outcome.json and the log history, as training wrote them, and the budget
status of `labkit run` reads the outcome, not a summary a cell assembled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.card.load import load_card
from labkit.cli.summary import budget_stop
from labkit.core import io
from labkit.core import runs as R
from labkit.errors import MissingInput
from labkit.stages import training
from labkit.stages.context import Stage, open_stage
from labkit.stages.records import TrainingCost, TrainingOutcome, TrainingSummary, read_outcome
from labkit.stages.run_metrics import run_metrics

REPO = Path(__file__).resolve().parents[3]
HISTORY = [{"step": 2, "loss": 2.5, "learning_rate": 0.005}, {"step": 2, "eval_loss": 2.4},
           {"step": 4, "loss": 1.25, "learning_rate": 0.005}, {"step": 4, "train_runtime": 3.5}]


def _keys(record: type) -> set[str]:
    return set(record.__required_keys__ | record.__optional_keys__)


def _stage(tmp_path: Path, **train: object) -> Stage:
    card = tmp_path / "card.yaml"
    card.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\ntrain: {json.dumps(train)}\n")
    run = R.new_run(load_card(card), tmp_path / "runs")
    return open_stage("training", str(run.card_path), str(run.dir))


def _outcome(**changes: object) -> dict:
    return {"steps": 4, "metrics": {"train_runtime": 3.5, "train_loss": 1.8, "epoch": 0.4},
            "resumed_from": "/r/training/trainer/checkpoint-2", "budget_exhausted": False, "world_size": 1,
            "interrupted": None, "best_step": None, "best_eval_loss": None, "early_stopped": False,
            "early_stopping": None, **changes}


def test_finish_records_the_outcome_training_wrote(tmp_path: Path) -> None:
    stage = _stage(tmp_path)
    io.write_json(stage.path("outcome.json"), _outcome(budget_exhausted=True))
    io.write_jsonl(stage.path("log_history.jsonl"), HISTORY)
    summary = training.finish(stage)
    assert set(summary) == _keys(TrainingSummary)
    assert summary == {"stage": "training", "seconds": summary["seconds"], "steps": 4, "trainer": "sft",
                       "first_loss": 2.5, "last_loss": 1.25, "train_seconds": 3.5, "world_size": 1,
                       "resumed_from": "/r/training/trainer/checkpoint-2", "budget_exhausted": True}
    assert io.read_json(stage.path("summary.json")) == summary
    assert budget_stop(stage.run) == {
        "stopped_by": "budget", "note": "training stopped by budget.max_minutes after 4 step(s); a checkpoint was written"}
    # the budget status reads outcome.json: a summary edited by hand changes nothing
    io.write_json(stage.path("summary.json"), {**summary, "budget_exhausted": False})
    assert budget_stop(stage.run)["stopped_by"] == "budget"
    io.write_json(stage.path("outcome.json"), _outcome())
    assert budget_stop(stage.run) == {}


def test_finish_without_an_outcome_is_a_missing_input(tmp_path: Path) -> None:
    stage = _stage(tmp_path)
    with pytest.raises(MissingInput, match="training/outcome.json is missing: run the training stage"):
        training.finish(stage)
    assert read_outcome(stage.run.dir) is None and budget_stop(stage.run) == {}
    assert not stage.path("summary.json").exists()


def test_a_real_training_writes_the_typed_outcome(tmp_path: Path) -> None:
    """Two optimiser steps of the tiny Llama: outcome.json has exactly the TrainingOutcome's keys, and the summary
    says what it says."""
    stage = _stage(tmp_path, max_steps=2, save_steps=2, logging_steps=1)
    outcome = training.run(stage)
    assert set(outcome) == _keys(TrainingOutcome) and read_outcome(stage.run.dir) == outcome
    assert outcome["steps"] == 2 and outcome["interrupted"] is None and not outcome["budget_exhausted"]
    assert (stage.path("adapter") / "adapter_config.json").is_file()
    cost = outcome["cost"]  # counted (labkit.train.token_count): read back as the run metrics
    assert set(cost) == _keys(TrainingCost) and 0 < cost["loss_tokens"] < cost["tokens"] == cost["session_tokens"]
    assert 0 < cost["mfu"] < 1 and cost["peak_flops"] > 0 and cost["world_size"] == 1
    metrics = run_metrics(stage.run.dir)
    assert (metrics["tokens_seen"], metrics["loss_tokens"], metrics["mfu"]) == (cost["tokens"], cost["loss_tokens"],
                                                                              cost["mfu"])
    summary = training.finish(stage)
    losses = [r["loss"] for r in io.read_jsonl(stage.path("log_history.jsonl")) if "loss" in r]
    assert summary["steps"] == 2 and summary["train_seconds"] == outcome["metrics"]["train_runtime"] > 0
    assert (summary["first_loss"], summary["last_loss"]) == (losses[0], losses[-1])


def test_machines_that_did_not_meet_are_named_by_their_join_logs(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch on 4 machines that ended before they met: the machines without a join log never started joining,
    the one with a log started and did not connect; the line says what to run and quotes torch's last line."""
    monkeypatch.setenv("LABKIT_JOIN_TIMEOUT", "30")
    run = R.Run(tmp_path / "exp" / "r1")
    (run.dir / "logs").mkdir(parents=True)
    (run.dir / "logs" / "machine-2.log").write_text("join exp/r1 as machine 2 of 4\n")
    line = training.not_met(run, 4, 31.4, "DistStoreError: Timed out after 31 seconds waiting for clients. 3/4")
    assert "\n" not in line and line.startswith("the 4 machines did not all meet in 31 s (LABKIT_JOIN_TIMEOUT 30 s)")
    assert "machines 1, 3 never ran `labkit run --join r1`" in line and "machine 2 started joining but did not " \
        "connect" in line and line.endswith("waiting for clients. 3/4")
