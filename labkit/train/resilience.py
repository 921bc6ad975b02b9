"""Training that survives the real world: checkpoints, resume, interruption and heartbeats.

- Checkpoints (weights, optimiser, scheduler, RNG and the data position, as transformers' Trainer
  writes them) go to `training/trainer/checkpoint-N` every `train.save_steps` steps and at the end;
  stage 04 always resumes from the newest one that passes a validity check (`checkpoint_problem`: a save
  cut short or a truncated file falls back to the one before), so re-running it (or `labkit run --resume RUN_ID`)
  continues where the last process stopped.
- SIGTERM or Ctrl-C (SIGINT) during training: the current step finishes, a checkpoint is written,
  training stops and the stage raises `TrainingInterrupted`, which the run records as `interrupted`
  with its last step. A second signal stops at once.
- Heartbeats: every stage kernel and `labkit run` touch `<run>/heartbeat` every 30 s, so a run whose
  process died (SIGKILL, machine gone) can be told from a running one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from safetensors import safe_open

from labkit.train.callbacks import InterruptStop


WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "adapter_model.bin")  # the Trainer's weight files
SHARDED = ("pytorch_model_fsdp_*", "global_step*")  # FSDP's sharded state folders, DeepSpeed's ZeRO folder
PICKLES = ("optimizer.pt", "scheduler.pt", "rng_state*.pth", "scaler.pt")  # torch.save files (zip archives)


def _safetensors_problem(path: Path) -> str | None:
    try:
        with safe_open(str(path), "pt"):  # reads the header and checks the file covers every tensor
            return None
    except Exception as exc:  # noqa: BLE001 - safetensors' error types vary across versions
        return f"{path.name} does not read ({str(exc).splitlines()[0][:100]})"


def checkpoint_problem(folder: Path) -> str | None:
    """Why a `checkpoint-N` folder cannot be resumed from (None when it can).

    Valid: trainer_state.json parses (the Trainer writes it last); the weights are present — safetensors files
    whose header reads and covers every tensor (with an index, every shard it names), or PyTorch / FSDP /
    DeepSpeed weights; optimizer, scheduler and RNG files are non-empty, complete zip archives (torch.save).

    Args:
        folder: the checkpoint folder.
    Returns:
        a short reason, or None.
    """
    try:
        state = json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "no trainer_state.json (the Trainer writes it last: the save did not finish)"
    except (OSError, ValueError) as exc:
        return f"trainer_state.json does not parse ({exc})"
    if not isinstance(state, dict):
        return "trainer_state.json is not a JSON object"
    weights = sorted({p for pattern in WEIGHTS for p in folder.glob(pattern) if p.is_file()})
    for index in folder.glob("*.safetensors.index.json"):
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            return f"{index.name} does not parse ({exc})"
        if missing := sorted(name for name in shards if not (folder / name).is_file()):
            return f"{index.name} names missing shards: {', '.join(missing[:3])}"
    sharded = [p for pattern in SHARDED for p in folder.glob(pattern) if p.is_dir() and any(p.iterdir())]
    if not weights and not sharded:
        return "no weights file (adapter_model / model .safetensors or .bin, FSDP or DeepSpeed state)"
    for path in weights:
        if path.stat().st_size == 0:
            return f"{path.name} is empty"
        if path.suffix == ".safetensors" and (problem := _safetensors_problem(path)):
            return problem
    for path in sorted({p for pattern in PICKLES for p in folder.glob(pattern) if p.is_file()}):
        if path.stat().st_size == 0:
            return f"{path.name} is empty"
        if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a cut one has no central directory
            return f"{path.name} is truncated (not a complete torch.save archive)"
    return None


def last_checkpoint(folder: Path, note: Callable[[str], None] | None = print) -> str | None:
    """The newest `checkpoint-N` folder under `folder` that passes `checkpoint_problem` (None when there is none).

    A newer checkpoint that fails the check (a save cut short by a preemption, a truncated file) is skipped with
    a note naming it and why, so training resumes from the previous one.

    Args:
        folder: the Trainer's output folder.
        note: where the notes go (default print; None: silent).
    Returns:
        the checkpoint folder's path as a string, or None.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    found = sorted(((int(m.group(1)), p) for p in folder.iterdir()
                    if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and p.is_dir()), reverse=True)
    for _, path in found:
        problem = checkpoint_problem(path)
        if problem is None:
            return str(path)
        if note is not None:
            note(f"labkit: checkpoint skipped: {path.name}: {problem}; trying the one before it")
    return None


class Interruption:
    """Turns SIGTERM / SIGINT during training into: finish the step, checkpoint, stop.

    Under several processes each may get the signal at its own moment (a scheduler signals every process, labkit
    forwards to each worker one after the other): the processes stop at the step on which they *agree* (`agree`,
    one all-reduce at each step's end), never on a flag read after it, so no process trains a step the others left.

    Attributes:
        signal: the name of the signal this process received (None if none).
        stop: whether the processes agreed to stop (at a step's end; read by `InterruptStop`).
        step: the optimiser step at which training stopped.
    """

    def __init__(self) -> None:
        self.signal: str | None = None
        self.stop = False
        self.step = 0
        self._previous: dict[int, Any] = {}
        self._depth = 0

    def _handler(self, signum: int, frame: Any) -> None:
        if self.signal is not None:  # a second signal to this process: stop now
            self._restore()
            raise KeyboardInterrupt(signal.Signals(signum).name)
        self.signal = signal.Signals(signum).name
        # os.write, not print: the signal may interrupt a print to the same stream (a reentrant call raises)
        line = f"labkit: {self.signal} received — finishing this step, writing a checkpoint, then stopping\n"
        try:
            os.write(1, line.encode())
        except OSError:
            pass

    def install(self) -> None:
        """Install the handlers (main thread only; elsewhere signals keep their defaults). Nested calls keep the
        outermost installation: the handlers go when the last matching `restore` runs."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._depth += 1
        if self._depth == 1:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handler)

    def restore(self) -> None:
        """Undo one `install` (the previous handlers come back with the outermost one)."""
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0:
            self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        self._depth = 0

    @contextmanager
    def held(self) -> Iterator[None]:
        """The handlers installed for a whole block (stage 04's training and what it writes after the last step): a
        signal after the last step then stops nothing half-written; `labkit run` stops before the next stage."""
        self.install()
        try:
            yield
        finally:
            self.restore()

    def agree(self) -> bool:
        """Whether to stop at this step's end: this process got a signal, or (under several processes) any did.

        The processes decide on the all-reduced value alone: a signal arriving during the all-reduce counts at the
        next step's end, on every process alike.

        Returns:
            the decision, also kept in `stop`.
        """
        received = self.signal is not None  # read once, before the collective
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            flag = torch.tensor([1.0 if received else 0.0], device="cuda" if dist.get_backend() == "nccl" else "cpu")
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            received = bool(flag.item())
        self.stop = self.stop or received
        return self.stop

    def callback(self) -> Any:
        """The TrainerCallback that installs the handlers and stops at a signal (`callbacks.InterruptStop`)."""
        return InterruptStop(self)

    def report(self, checkpoint_dir: Path, run_id: str) -> str | None:
        """After `trainer.train()`: what stopped training and how to continue (None when no signal did)."""
        if not self.stop:
            return None
        saved = last_checkpoint(checkpoint_dir)
        return (f"{self.signal or 'a signal to another process'} at step {self.step}; checkpoint "
                f"{Path(saved).name if saved else 'none'} written; continue with: labkit run --resume {run_id}")
