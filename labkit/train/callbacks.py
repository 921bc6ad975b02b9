"""The transformers TrainerCallbacks labkit adds to its trainers, and TensorBoard's folder.

- `LiveProgress`: stage 04's live progress, one `labkit.core.progress` event per logged step (step / total, loss,
  ETA) and per evaluation, and the warning when the ETA exceeds the budget left (`budget_warning`); `labkit run`
  prints them on the terminal while the archived notebook stays free of progress bars. The ETA uses stage 03's measured step time ($LABKIT_STEP_SECONDS, set by `labkit run` from
  `parameter_check/fit.json`) until three steps of this run have been timed, then this run's own pace.
- `FiniteCheck`: stops training (`labkit.errors.NonFiniteError`) at a logged step whose loss or gradient norm is NaN
  or infinite, and at an evaluation whose loss is, naming the step, the last finite loss and the fix (`numerics_fix`).
- `BudgetStop`: stops after the step that spends the card's `budget.max_minutes` (`labkit.train.trainer`).
- `InterruptStop`: SIGTERM / Ctrl-C → checkpoint and stop (`labkit.train.resilience.Interruption`).
- `ThinnedProgress`, `ThinnedPrinter`, `NotebookProgress`: transformers' own progress output, printed every
  `train.logging_steps` although every step is logged.
- `StepTimer`: stage 03's timing of real steps (`labkit.preflight.measure`): each step's wall time, the GPU's queue
  drained at both ends (the step checks' own record of each step is `labkit.preflight.arms.StepRecord`).

The generation-metric callback of early stopping lives with its scoring (`labkit.train.early_stopping`); the token
count (`TokenCount`: tokens and loss tokens trained on, for stage 04's cost record) with the trainers' batch hook that
feeds it (`labkit.train.token_count`).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.integrations import TensorBoardCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from transformers.utils.notebook import NotebookProgressCallback

from labkit.core.progress import emit, fmt_seconds
from labkit.errors import NonFiniteError


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


def budget_warning(step: int, total: int, eta_s: float, remaining_s: float, max_minutes: float) -> str:
    """The warning when training's ETA exceeds the budget left: where it will stop, and the options.

    Args:
        step: the current step.
        total: the last step.
        eta_s: seconds training still needs (`eta`).
        remaining_s: seconds of budget.max_minutes left.
        max_minutes: budget.max_minutes.
    Returns:
        one line: the ETA against the budget left, the step it will stop at, the four options.
    """
    pace = eta_s / max(1, total - step)
    reach = min(total, step + int(max(0.0, remaining_s) // pace)) if pace > 0 else total
    need = math.ceil((max_minutes * 60 - remaining_s + eta_s) / 60)
    return (f"ETA {fmt_seconds(eta_s)} exceeds the {fmt_seconds(remaining_s)} left of budget.max_minutes "
            f"{max_minutes:g}: training will stop at about step {reach} of {total}, budget-stopped (not comparable "
            f"with runs that train their planned steps). Options: raise budget.max_minutes to {need} or more; fewer "
            "train.max_steps / train.epochs; a shorter data.max_length; or budget.is_protocol: true to accept the "
            "budget as the protocol")


class LiveProgress(TrainerCallback):
    """Emits `{"phase": "train", "done", "total", "loss"|"eval_loss", "eta_s"}` every `every` steps
    (train.logging_steps), at the first and last step and at every evaluation; and once, as soon as the ETA exceeds
    the budget left (stage 03's step time at the start, then this run's pace), `{"phase": "budget", "warning"}`
    (`budget_warning`), also printed (the notebook's output) and kept as `budget.warning`.

    Args:
        every: the logging interval in steps.
        budget: the `labkit.train.trainer.BudgetCallback` (start, max_seconds), or None: no budget warning.
    """

    def __init__(self, every: int = 1, budget: Any = None) -> None:
        self.every = every
        self.planned = float(os.environ["LABKIT_STEP_SECONDS"]) if os.environ.get("LABKIT_STEP_SECONDS") else None
        self.start = 0.0
        self.start_step = 0
        self.budget = budget
        self.warned = False

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
        self.start, self.start_step = time.monotonic(), state.global_step
        if state.is_world_process_zero:
            self._check_budget(state.global_step, state.max_steps, eta(state.global_step, state.max_steps,
                                                                       state.global_step, 0.0, self.planned))

    def _check_budget(self, step: int, total: int, left: float | None) -> None:
        if self.warned or self.budget is None or left is None or step >= total:
            return  # the last step is never a budget stop (`BudgetStop`)
        remaining = self.budget.max_seconds - (time.monotonic() - self.budget.start)
        if left <= remaining:
            return
        self.warned = True
        self.budget.warning = budget_warning(step, total, left, remaining, self.budget.max_seconds / 60)
        print(f"labkit: warning: {self.budget.warning}", flush=True)
        emit(phase="budget", warning=self.budget.warning, done=step, total=total, eta_s=left)

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN003
        logs = logs or {}
        if not state.is_world_process_zero or not ({"loss", "eval_loss"} & set(logs)):
            return
        step, total = state.global_step, state.max_steps
        left = eta(step, total, self.start_step, time.monotonic() - self.start, self.planned)
        if "loss" in logs:
            self._check_budget(step, total, left)
        if "loss" in logs and not (step % self.every == 0 or step <= 1 or step == total):
            return
        emit(phase="train", done=step, total=total, loss=logs.get("loss"), eval_loss=logs.get("eval_loss"), eta_s=left)


def numerics_fix(lr: float, max_grad_norm: float, precision: str, attention: str) -> str:
    """The fix a non-finite loss or gradient norm names, for the card's settings on this device.

    Args:
        lr: train.lr.
        max_grad_norm: train.max_grad_norm.
        precision: the decided training precision ("bf16", "fp16", "fp32").
        attention: the attention implementation the model runs.
    Returns:
        one clause: the changes to try, most likely first.
    """
    fixes = []
    if precision == "fp16":
        fixes.append("train.precision: bf16 (a GPU of compute capability ≥ 8.0) or fp32 — float16 overflows past 65504")
        if "eager" not in attention:
            fixes.append("model.attn_implementation: eager (Phi in float16 overflows in its attention scores)")
    fixes += [f"a lower train.lr (now {lr:g})", f"a lower train.max_grad_norm (now {max_grad_norm:g})"]
    return "fix: " + "; or ".join(fixes)


def _skipped_by_scaler(optimizer: Any) -> bool:
    """Whether fp16's loss scaler skipped this step (an overflow of the scaled gradients, its normal search for a
    scale) while its scale is still ≥ 1; below 1 the gradients overflow unscaled, a real failure."""
    scaler = getattr(optimizer, "scaler", None)
    return bool(scaler is not None and getattr(optimizer, "step_was_skipped", False) and scaler.get_scale() >= 1.0)


class FiniteCheck(TrainerCallback):
    """At every logged step: the loss and the gradient norm must be finite (a non-finite gradient norm on a step fp16's
    loss scaler skipped is its normal search for a scale), and every evaluation's loss; otherwise training stops
    with `NonFiniteError` naming the step, the last finite loss and `fix`.

    The trainer must log with `logging_nan_inf_filter=False`, or transformers replaces a NaN loss by the average of
    the previous ones (labkit's `build_trainer` sets it).

    Args:
        fix: the fix the error names (`numerics_fix`).
    """

    def __init__(self, fix: str) -> None:
        self.fix = fix
        self.last: tuple[int, float] | None = None  # (step, loss) of the last finite logged loss

    def _stop(self, where: str, what: str) -> NonFiniteError:
        last = (f"last finite loss {self.last[1]:.4f} at step {self.last[0]}" if self.last
                else "no finite loss logged before it")
        return NonFiniteError(f"{where}: {what} ({last}); {self.fix}")

    def on_log(self, args, state, control, logs=None, optimizer=None, **kwargs):  # noqa: ANN001, ANN003
        logs = logs or {}
        if "loss" not in logs:
            return
        step, loss, norm = state.global_step, float(logs["loss"]), logs.get("grad_norm")
        if not math.isfinite(loss):
            raise self._stop(f"training stopped at step {step}", f"the loss is {loss}")
        if norm is not None and not math.isfinite(float(norm)) and not _skipped_by_scaler(optimizer):
            raise self._stop(f"training stopped at step {step}", f"the gradient norm is {float(norm)}")
        self.last = (step, loss)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):  # noqa: ANN001, ANN003
        bad = {k: v for k, v in (metrics or {}).items() if isinstance(v, float) and not math.isfinite(v)}
        if bad:
            raise self._stop(f"training stopped at the evaluation of step {state.global_step}",
                             ", ".join(f"{k} is {v}" for k, v in bad.items()))


class BudgetStop(TrainerCallback):
    """Stops training after the step that spends the budget; a checkpoint to continue from when checkpoints are on.
    The last planned step is never a budget stop: that run trained all its steps.

    Args:
        budget: the `labkit.train.trainer.BudgetCallback` holding the start, the limit and the `exhausted` flag.
    """

    def __init__(self, budget: Any) -> None:
        self.budget = budget

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
        if time.monotonic() - self.budget.start > self.budget.max_seconds and state.global_step < state.max_steps:
            self.budget.exhausted = True
            control.should_training_stop = True
            control.should_save = args.save_strategy != "no"  # a checkpoint to continue from
        return control


class InterruptStop(TrainerCallback):
    """A signal received during training: finish the step, checkpoint, stop (and always a checkpoint at the end).

    The handlers stay from the start of training to its end, or longer while the interruption is `held`.

    Args:
        interruption: the `labkit.train.resilience.Interruption` holding the handlers and the signal received.
    """

    def __init__(self, interruption: Any) -> None:
        self.interruption = interruption

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
        self.interruption.install()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
        outer = self.interruption
        outer.step = state.global_step
        if outer.agree():  # every process decides on the same all-reduced value
            control.should_save = True
            control.should_training_stop = True
        elif state.max_steps and state.global_step >= state.max_steps:
            control.should_save = True  # always a checkpoint at the end
        return control

    def on_train_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
        self.interruption.restore()


class StepTimer(TrainerCallback):
    """The wall time of each training step, in `seconds` (one entry per step, in order).

    On CUDA the GPU's queue is drained at both ends of a step: kernels run asynchronously, and a step's optimiser
    kernels are still queued when its end is signalled. labkit's trainers wait for them anyway (`TokenCount` reads
    its counts at the step's end, before this callback); the drain keeps the timing right without it.
    """

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._t = 0.0

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
        _drain(args)
        self._t = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
        _drain(args)
        self.seconds.append(time.perf_counter() - self._t)


def _drain(args: Any) -> None:
    """Wait for the kernels queued on the trainer's GPU (nothing to wait for on the CPU)."""
    if args.device.type == "cuda":
        torch.cuda.synchronize(args.device)


def _kept(every: int, state: Any, logs: dict[str, Any] | None) -> bool:
    """Whether a log line is printed: every `every` steps, the first step, and every log without a training loss."""
    logs = logs or {}
    return state.global_step % every == 0 or state.global_step <= 1 or "loss" not in logs


class _Thinned:
    """A transformers log callback that passes on only every `every` steps' log lines (`_kept`)."""

    def __init__(self, every: int) -> None:
        super().__init__()
        self.every = every

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN003
        if _kept(self.every, state, logs):
            super().on_log(args, state, control, logs=logs, **kwargs)  # type: ignore[misc]


class ThinnedProgress(_Thinned, ProgressCallback):
    """transformers' console progress bar, its loss lines printed every `every` steps."""


class ThinnedPrinter(_Thinned, PrinterCallback):
    """transformers' log printer (progress bars off), printing every `every` steps."""


class NotebookProgress(NotebookProgressCallback):
    """transformers' notebook progress table, safe at a run that ends at its first timed step.

    transformers 5.24's notebook bar starts at the first step's end (step + 1); a run that ends at that very step
    (2 steps after it started or resumed, e.g. resumed from checkpoint-8 and early-stopped at step 10) keeps a stale
    time estimate with no rate, and on_train_end divides by None (TypeError).
    """

    def on_train_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
        tracker = self.training_tracker
        if tracker is not None and state.global_step <= (getattr(tracker, "start_value", None) or 0):
            tracker.predicted_remaining = None  # the run is over: nothing left to predict
        return super().on_train_end(args, state, control, **kwargs)


def thin_progress(trainer: Any, every: int) -> None:
    """Print the training loss every `every` steps (and every evaluation) although every step is logged: replaces
    the trainer's progress callbacks by `ThinnedProgress`, `ThinnedPrinter`, `NotebookProgress`.

    Args:
        trainer: a transformers Trainer.
        every: train.logging_steps.
    """
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(ThinnedProgress(every))
    if trainer.pop_callback(PrinterCallback) is not None:
        trainer.add_callback(ThinnedPrinter(every))
    if trainer.pop_callback(NotebookProgressCallback) is not None:
        trainer.add_callback(NotebookProgress())


def tensorboard_into(trainer: Any, folder: Path) -> None:
    """Point the trainer's TensorBoard callback (present when report_to names tensorboard) at `folder`.

    Args:
        trainer: a transformers Trainer.
        folder: the event files' folder (the run's `training/tensorboard`).
    """
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, TensorBoardCallback):
            callback.logging_dir = str(folder)  # read in on_train_begin, when the writer is made
