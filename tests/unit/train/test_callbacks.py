"""The trainer callbacks of `labkit.train.callbacks`: stage 04's ETA (moved here from tests/unit/core/test_progress.py,
which tests the progress events themselves) and stage 03's step timer and snapshots."""

from __future__ import annotations

import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerControl, TrainerState, TrainingArguments

from labkit.core.io import read_jsonl
from labkit.core.progress import describe
from labkit.train.callbacks import BudgetStop, LiveProgress, StepTimer, eta
from labkit.train.trainer import BudgetCallback


def test_eta_uses_stage_03_until_three_steps_are_timed() -> None:
    assert eta(step=1, total=9, start_step=0, elapsed=100.0, planned=2.0) == 16.0
    assert eta(step=1, total=9, start_step=0, elapsed=100.0, planned=None) is None
    assert eta(step=4, total=9, start_step=0, elapsed=8.0, planned=50.0) == 10.0  # this run's own pace
    assert eta(step=7, total=9, start_step=4, elapsed=30.0, planned=1.0) == 20.0  # resumed at step 4


def test_step_timer_times_each_step() -> None:
    timer, args = StepTimer(), SimpleNamespace(device=torch.device("cpu"))
    for _ in range(2):
        timer.on_step_begin(args, None, None)
        time.sleep(0.01)
        timer.on_step_end(args, None, None)
    assert len(timer.seconds) == 2 and all(s >= 0.01 for s in timer.seconds)


def test_step_timer_drains_the_gpu_queue_at_both_ends_of_a_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA each step's time waits for its queued kernels (no GPU here: the drain is counted, not run)."""
    drained = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: drained.append(device))
    timer, gpu = StepTimer(), SimpleNamespace(device=torch.device("cuda", 0))
    for _ in range(2):
        timer.on_step_begin(gpu, None, None)
        timer.on_step_end(gpu, None, None)
    assert drained == [torch.device("cuda", 0)] * 4 and len(timer.seconds) == 2
    timer.on_step_begin(SimpleNamespace(device=torch.device("cpu")), None, None)
    assert len(drained) == 4  # nothing to wait for on the CPU


def test_the_budget_warning_comes_once_as_soon_as_the_eta_exceeds_the_budget_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    progress = tmp_path / "progress.jsonl"
    monkeypatch.setenv("LABKIT_PROGRESS", str(progress))
    monkeypatch.setenv("LABKIT_STAGE", "training")
    monkeypatch.setenv("LABKIT_STEP_SECONDS", "130")  # stage 03's step time: 24 steps are 52 minutes
    budget = BudgetCallback(20)
    live = LiveProgress(1, budget)
    state = TrainerState(max_steps=24, global_step=0)
    live.on_train_begin(None, state, TrainerControl())
    state.global_step = 1
    live.on_log(None, state, TrainerControl(), logs={"loss": 2.0})
    events = read_jsonl(progress)
    (warning,) = [e for e in events if e["phase"] == "budget"]
    assert warning["warning"] == budget.warning and warning["stage"] == "training"
    text = warning["warning"]
    assert re.match(r"ETA 52:00 exceeds the (19:59|20:00) left of budget\.max_minutes 20: ", text), text
    assert "stop at about step 9 of 24" in text and re.search(r"raise budget\.max_minutes to 5[23] or more", text)
    assert all(o in text for o in ("train.max_steps / train.epochs", "data.max_length", "budget.is_protocol: true"))
    assert describe(warning) == f"    training: warning: {text}"  # the line `labkit run` and --follow print
    assert [e["phase"] for e in events] == ["budget", "train"]


def test_no_budget_warning_within_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LABKIT_PROGRESS", str(tmp_path / "progress.jsonl"))
    monkeypatch.setenv("LABKIT_STEP_SECONDS", "10")  # 24 steps: 4 minutes of 20
    budget = BudgetCallback(20)
    live = LiveProgress(1, budget)
    live.on_train_begin(None, TrainerState(max_steps=24, global_step=0), TrainerControl())
    spent = BudgetCallback(1e-6)  # spent, but at the last step nothing is left to stop: no warning either
    LiveProgress(1, spent).on_log(None, TrainerState(max_steps=2, global_step=2), TrainerControl(), logs={"loss": 1.0})
    assert budget.warning is None and spent.warning is None
    assert not [e for e in read_jsonl(tmp_path / "progress.jsonl") if e["phase"] == "budget"]


def test_the_last_planned_step_is_never_a_budget_stop(tmp_path: Path) -> None:
    args = TrainingArguments(output_dir=str(tmp_path), save_strategy="no", use_cpu=True, report_to="none")
    budget = BudgetCallback(1e-6)
    time.sleep(0.01)
    stop = BudgetStop(budget)
    control = stop.on_step_end(args, TrainerState(max_steps=4, global_step=4), TrainerControl())
    assert not budget.exhausted and not control.should_training_stop  # trained all its steps
    control = stop.on_step_end(args, TrainerState(max_steps=4, global_step=2), TrainerControl())
    assert budget.exhausted and control.should_training_stop
