"""Live progress on the terminal: the runner's tail of a stage's progress file, and `labkit runs --follow RUN`.

The stage's process writes events to `<run>/progress.jsonl` (`labkit.core.progress`); these read it and print one
line per update, so the terminal shows training steps, loss and ETA, and evaluation batches, while the archived
notebook holds no progress bars.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

from labkit.core import runs as R
from labkit.core.heartbeat import is_dead
from labkit.core.progress import Follower


class Tail:
    """Print a run's progress lines from a background thread while a stage executes (`with Tail(run_dir, log):`)."""

    def __init__(self, run_dir: Path, log: Callable[[str], None], every: float = 1.0) -> None:
        self.follower = Follower(run_dir)
        self.follower.offset = self.follower.path.stat().st_size if self.follower.path.exists() else 0
        self.log = log
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="labkit-progress")

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self._print(self.follower.poll())

    def _print(self, lines: list[str]) -> None:
        for line in lines:
            self.log(line)

    def __enter__(self) -> "Tail":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._print(self.follower.poll(flush=True))


def _say(line: str) -> None:
    print(line, flush=True)


def follow(run: R.Run, log: Callable[[str], None] = _say, every: float = 1.0) -> str:
    """Print a run's progress until it ends (`labkit runs --follow RUN`); a finished run: its last updates, at once.

    Args:
        run: the run.
        log: where lines go.
        every: seconds between reads of the progress file.
    Returns:
        the run's status when it ended (completed, failed, interrupted, invalid).
    """
    follower = Follower(run.dir)
    status = run.status()
    log(f"following {run.experiment}/{run.run_id} ({status.get('status')})")
    stages_seen: dict[str, str] = {}
    while True:
        status = run.status()
        ended = status.get("status") != "running" or bool(is_dead(run.dir, status))
        for stage, entry in status.get("stages", {}).items():
            state = entry.get("status", "")
            if stages_seen.get(stage) != state:
                stages_seen[stage] = state
                progress = follower.poll(flush=True, stage=stage)  # what the stage reported, before its end
                for line in progress:
                    log(line)
                log(f"  {R.NOTEBOOKS.get(stage, stage):<28} {state}" + (f" in {entry['seconds']:.1f} s"
                                                                        if entry.get("seconds") is not None else ""))
        for line in follower.poll(flush=ended):
            log(line)
        if ended:
            label = R.status_label(status) if status.get("status") != "running" else "interrupted (its process is gone)"
            log(f"{label}" + (f": {status['error']}" if status.get("error") else "") + f" → {run.dir}")
            return str(status.get("status"))
        time.sleep(every)
