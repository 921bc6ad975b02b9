"""SIGTERM / Ctrl-C while `labkit run` executes a stage: passed on to the training stage, else the run stops."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from labkit.core import runs as R


class Signals:
    """SIGTERM / Ctrl-C while `labkit run` executes a stage.

    During training the signal is passed on to the stage's kernel, which finishes its step, writes a
    checkpoint and stops (the stage then fails with TrainingInterrupted, recorded as interrupted);
    in any other stage, or on a second signal, the run stops at once (recorded as interrupted).
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
        kernel = self.run.status().get("stages", {}).get(self.stage, {}).get("pid")
        if self.received is None and self.stage == "training" and kernel:
            self.received = name
            print(f"labkit: {name} — asking the training stage to checkpoint and stop (again to stop at once)",
                  file=sys.stderr, flush=True)
            try:
                os.kill(int(kernel), signal.SIGTERM)
                return
            except ProcessLookupError:
                pass
        raise KeyboardInterrupt(name)
