"""Training that survives the real world: checkpoints, resume, interruption and heartbeats.

- Checkpoints (weights, optimiser, scheduler, RNG and the data position, as transformers' Trainer
  writes them) go to `training/trainer/checkpoint-N` every `train.save_steps` steps and at the end;
  stage 04 always resumes from the newest one, so re-running it (or `labkit run --resume RUN_ID`)
  continues where the last process stopped.
- SIGTERM or Ctrl-C (SIGINT) during training: the current step finishes, a checkpoint is written,
  training stops and the stage raises `TrainingInterrupted`, which the run records as `interrupted`
  with its last step. A second signal stops at once.
- Heartbeats: every stage kernel and `labkit run` touch `<run>/heartbeat` every 30 s, so a run whose
  process died (SIGKILL, machine gone) can be told from a running one.
"""

from __future__ import annotations

import re
import signal
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from labkit.train.callbacks import InterruptStop


def last_checkpoint(folder: Path) -> str | None:
    """The newest complete `checkpoint-N` folder under `folder` (None when there is none).

    A checkpoint counts as complete when its trainer_state.json exists (written last by the Trainer).
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in folder.iterdir()
             if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and (p / "trainer_state.json").exists()]
    return str(max(found)[1]) if found else None


class Interruption:
    """Turns SIGTERM / SIGINT during training into: finish the step, checkpoint, stop.

    Attributes:
        signal: the name of the signal received (None if none).
        step: the optimiser step at which training stopped.
    """

    def __init__(self) -> None:
        self.signal: str | None = None
        self.step = 0
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.signal is not None:  # a second signal: stop now
            self.restore()
            raise KeyboardInterrupt(signal.Signals(signum).name)
        self.signal = signal.Signals(signum).name
        print(f"labkit: {self.signal} received — finishing this step, writing a checkpoint, then stopping", flush=True)

    def install(self) -> None:
        """Install the handlers (main thread only; elsewhere signals keep their defaults)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handler)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def agree(self) -> None:
        """Under several processes, stop all at the same step when any one got the signal."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            flag = torch.tensor([1.0 if self.signal else 0.0],
                                device="cuda" if dist.get_backend() == "nccl" else "cpu")
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() and self.signal is None:
                self.signal = "SIGTERM"

    def callback(self) -> Any:
        """The TrainerCallback that installs the handlers and stops at a signal (`callbacks.InterruptStop`)."""
        return InterruptStop(self)

    def report(self, checkpoint_dir: Path, run_id: str) -> str | None:
        """After `trainer.train()`: what stopped training and how to continue (None when no signal did)."""
        if self.signal is None:
            return None
        saved = last_checkpoint(checkpoint_dir)
        return (f"{self.signal} at step {self.step}; checkpoint {Path(saved).name if saved else 'none'} written; "
                f"continue with: labkit run --resume {run_id}")
