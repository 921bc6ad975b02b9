"""SIGTERM / Ctrl-C while `labkit run` or `labkit stage` executes a stage: passed on to the training stage, else
the run stops."""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from labkit.core import runs as R
from labkit.core.io import utc_seconds
from labkit.errors import StageInterrupted
from labkit.stages.records import OUTCOME


class Signals:
    """SIGTERM / Ctrl-C while `labkit run` or `labkit stage` executes a stage.

    During training the signal is passed on to the stage's kernel, which finishes its step, writes a
    checkpoint and stops (the stage then fails with TrainingInterrupted, recorded as interrupted);
    in any other stage, or on a second signal, the run stops at once (recorded as interrupted). A signal passed on
    also stops the run when the stage does not stop on it (it came after training's last step: the run stops before
    the next stage) or ends in an error instead (a kernel or a launch it ended): `during`, `check_between`.
    """

    def __init__(self, run: R.Run) -> None:
        self.run = run
        self.stage = ""
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "Signals":
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handler(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        entry = self.run.status().get("stages", {}).get(self.stage, {})
        if self.received is None and self.stage == "training" and entry.get("pid"):
            self.received = name
            if _trained(self.run, entry.get("time", "")):  # nothing left to stop: its kernel finishes the stage
                print(f"labkit: {name} — training has finished; the run stops after this stage (again to stop at once)",
                      file=sys.stderr, flush=True)
                return
            print(f"labkit: {name} — asking the training stage to checkpoint and stop (again to stop at once)",
                  file=sys.stderr, flush=True)
            try:
                os.kill(int(entry["pid"]), signal.SIGTERM)
                return
            except ProcessLookupError:
                pass
        raise KeyboardInterrupt(name)

    @contextmanager
    def during(self, stage: str) -> Iterator[None]:
        """Execute a stage: a signal now goes to it; if it then ends in an error (its kernel or its launch stopped by
        the signal), StageInterrupted is raised instead (StageInterrupted itself passes through).

        Args:
            stage: the stage about to execute.
        """
        self.stage = stage
        try:
            yield
        except Exception as exc:
            if not self.received or isinstance(exc, StageInterrupted):
                raise
            first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            R.record(self.run, "stage_interrupted", stage=stage, error=f"{self.received}: {first}")
            raise StageInterrupted(f"{self.received} during stage {stage}, which stopped ({first}); "
                                   f"continue with: labkit run --resume {self.run.run_id}") from None

    def check_between(self, next_stage: str | None) -> None:
        """Raise StageInterrupted before the next stage when a signal was passed on to a stage that completed anyway.

        Args:
            next_stage: the stage that would run next (None: the run is complete).
        """
        if self.received and next_stage:
            raise StageInterrupted(f"{self.received} during stage {self.stage}, after its last step: the stage "
                                   f"completed, the run stops before stage {next_stage}; continue with: "
                                   f"labkit run --resume {self.run.run_id}")


def _trained(run: R.Run, started: str) -> bool:
    """Whether this attempt at stage 04 has written its outcome (training/outcome.json, newer than the stage's start:
    an earlier attempt's is older)."""
    outcome = run.dir / "training" / OUTCOME
    try:
        return outcome.stat().st_mtime >= utc_seconds(started)
    except (OSError, ValueError):
        return False
