"""What stage 04's trainer reports while it trains: live progress events and TensorBoard's folder.

The progress callback emits one `labkit.core.progress` event per logged step (step / total, loss, ETA) and per
evaluation; `labkit run` prints them on the terminal while the archived notebook stays free of progress bars.
The ETA uses stage 03's measured step time ($LABKIT_STEP_SECONDS, set by `labkit run` from
`parameter_check/fit.json`) until three steps of this run have been timed, then this run's own pace.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from labkit.core.progress import emit

# transformers takes seconds to import: imported inside the functions that use it


def eta(step: int, total: int, start_step: int, elapsed: float, planned: float | None) -> float | None:
    """Seconds left: this run's pace once three steps are timed, else stage 03's planned step time.

    Args:
        step: the current global step.
        total: the last step.
        start_step: the step training started (or resumed) at.
        elapsed: seconds since then.
        planned: stage 03's seconds per step (None: unknown).
    Returns:
        the seconds left, or None when neither pace is known.
    """
    done = step - start_step
    if done >= 3:
        return (total - step) * elapsed / done
    return None if planned is None else (total - step) * planned


def progress_callback(every: int = 1) -> Any:
    """A transformers TrainerCallback emitting `{"phase": "train", "done", "total", "loss"|"eval_loss", "eta_s"}`
    every `every` steps (train.logging_steps), at the first and last step and at every evaluation."""
    from transformers import TrainerCallback

    planned = float(os.environ["LABKIT_STEP_SECONDS"]) if os.environ.get("LABKIT_STEP_SECONDS") else None

    class _LiveProgress(TrainerCallback):
        start = 0.0
        start_step = 0

        def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
            self.start, self.start_step = time.monotonic(), state.global_step

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN003
            logs = logs or {}
            if not state.is_world_process_zero or not ({"loss", "eval_loss"} & set(logs)):
                return
            step, total = state.global_step, state.max_steps
            if "loss" in logs and not (step % every == 0 or step <= 1 or step == total):
                return
            emit(phase="train", done=step, total=total, loss=logs.get("loss"), eval_loss=logs.get("eval_loss"),
                 eta_s=eta(step, total, self.start_step, time.monotonic() - self.start, planned))

    return _LiveProgress()


def tensorboard_into(trainer: Any, folder: Path) -> None:
    """Point the trainer's TensorBoard callback (present when report_to names tensorboard) at `folder`.

    Args:
        trainer: a transformers Trainer.
        folder: the event files' folder (the run's `training/tensorboard`).
    """
    from transformers.integrations import TensorBoardCallback

    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, TensorBoardCallback):
            callback.logging_dir = str(folder)  # read in on_train_begin, when the writer is made
