"""The trainer callbacks of `labkit.train.callbacks`: stage 04's ETA (moved here from tests/unit/core/test_progress.py,
which tests the progress events themselves) and stage 03's step timer and snapshots."""

from __future__ import annotations

import time

import torch

from labkit.train.callbacks import StepTimer, eta


def test_eta_uses_stage_03_until_three_steps_are_timed() -> None:
    assert eta(step=1, total=9, start_step=0, elapsed=100.0, planned=2.0) == 16.0
    assert eta(step=1, total=9, start_step=0, elapsed=100.0, planned=None) is None
    assert eta(step=4, total=9, start_step=0, elapsed=8.0, planned=50.0) == 10.0  # this run's own pace
    assert eta(step=7, total=9, start_step=4, elapsed=30.0, planned=1.0) == 20.0  # resumed at step 4


def test_step_timer_times_each_step() -> None:
    timer = StepTimer()
    for _ in range(2):
        timer.on_step_begin(None, None, None)
        time.sleep(0.01)
        timer.on_step_end(None, None, None)
    assert len(timer.seconds) == 2 and all(s >= 0.01 for s in timer.seconds)
