"""Live progress on the terminal: the runner's tail of a stage's progress file, and `labkit runs --follow RUN`.

The stage's process writes events to `<run>/progress.jsonl` (`labkit.core.progress`); these read it and print one
line per update, so the terminal shows training steps, loss and ETA, evaluation batches and the stages' checks,
while the archived notebook holds no progress bars. A stage quiet for `labkit.core.progress.quiet_seconds` gets a
"no update for N min" line. The runner's `Tail` marks each stage's start and end in the file; both the runner and
`follow` print a stage's duration from those marks (`labkit.core.progress.stage_seconds`).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from labkit.core import runs as R
from labkit.core.heartbeat import is_dead
from labkit.core.progress import Follower, read_events, stage_event, stage_seconds
from labkit.errors import MissingInput

LATEST = "latest"  # `labkit runs --follow latest`: the newest run of the registry


class Tail:
    """Print a run's progress lines from a background thread while a stage executes (`with Tail(run_dir, log):`),
    marking the stage's start and end in the progress file.

    Args:
        run_dir: the run folder.
        log: where lines go.
        every: seconds between reads.
        stage: the stage (default: $LABKIT_STAGE, which the runner sets for the stage's kernel).
    """

    def __init__(self, run_dir: Path, log: Callable[[str], None], every: float = 1.0, stage: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.stage = stage or os.environ.get("LABKIT_STAGE", "?")
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
        stage_event(self.run_dir, self.stage, "start")
        self._thread.start()
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        stage_event(self.run_dir, self.stage, "end", ok=exc_type is None)
        self._stop.set()
        self._thread.join(timeout=5)
        self._print(self.follower.poll(flush=True))


def resolve_run(spec: str, root: Path) -> R.Run:
    """The run `--follow` names: `latest` (the newest run of the registry), a run id, a unique prefix of one, or a
    run folder (`labkit.core.runs.find_run`: an ambiguous prefix is a UsageError listing the matches).

    Args:
        spec: what the user gave.
        root: the runs root.
    Returns:
        the Run.
    Raises:
        MissingInput: no run yet (latest) or no such run; UsageError: an ambiguous prefix or a pattern.
    """
    if spec != LATEST:
        return R.find_run(spec, root)
    rows = [r for r in R.summarise(R.read_registry(root)) if (root / str(r["experiment"]) / r["run_id"]).is_dir()]
    if not rows:
        raise MissingInput(f"no runs under {root} yet: start one with `labkit run CARD`")
    # the registry's times are UTC ISO strings (they sort as text); of two started in the same second, the later line
    _, newest = max(enumerate(rows), key=lambda pair: (pair[1]["started"], pair[0]))
    return R.Run(root / str(newest["experiment"]) / newest["run_id"])


def _say(line: str) -> None:
    print(line, flush=True)


def _stage_line(run: R.Run, stage: str, entry: dict[str, Any], ended: bool) -> str | None:
    """The line of a stage whose status changed; None while its end is recorded but its duration not yet (the
    runner marks the stage's end in the progress file after the notebook is saved)."""
    state = entry.get("status", "")
    if state not in ("done", "failed", "interrupted"):
        return f"  {R.NOTEBOOKS.get(stage, stage):<28} {state}"
    events = read_events(run.dir)
    seconds = stage_seconds(run.dir, stage, events)
    marked = any(e.get("phase") == "stage" and e.get("stage") == stage for e in events)
    if seconds is None and marked and not ended:
        return None  # wait for the runner's end mark
    if seconds is None:  # a run started before the marks existed, or run by hand: the stage's own record
        seconds = entry.get("seconds")
    return f"  {R.NOTEBOOKS.get(stage, stage):<28} {state}" + (f" in {seconds:.1f} s" if seconds is not None else "")


def follow(run: R.Run, log: Callable[[str], None] = _say, every: float = 1.0) -> str:
    """Print a run's progress until it ends (`labkit runs --follow RUN`); a finished run: its last updates, at once.

    Args:
        run: the run (`resolve_run` finds it from `latest` or a prefix).
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
                line = _stage_line(run, stage, entry, ended)
                if line is None:
                    continue
                stages_seen[stage] = state
                progress = follower.poll(flush=True, stage=stage)  # what the stage reported, before its end
                for text in progress:
                    log(text)
                log(line)
        for line in follower.poll(flush=ended):
            log(line)
        if ended:
            label = R.status_label(status) if status.get("status") != "running" else "interrupted (its process is gone)"
            log(f"{label}" + (f": {status['error']}" if status.get("error") else "") + f" → {run.dir}")
            return str(status.get("status"))
        time.sleep(every)
