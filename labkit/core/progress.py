"""Live progress of a running stage: events appended to `<run>/progress.jsonl`, read back as terminal lines.

The stage's process (a notebook kernel under papermill, or a training worker) calls `emit` — the training callback
(`labkit.train.trainer`) after every logged step, the generation loop (`labkit.evaluate.generation`) after every
batch. `labkit run` sets `LABKIT_PROGRESS` to the run's file for its kernels; without it `emit` writes nothing, so
a notebook opened by hand is unchanged. The runner, and `labkit runs --follow RUN` from another terminal, read the
file with a `Follower` and print one line per update, so the archived notebooks hold no progress bars.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

FILE = "progress.jsonl"
ENV = "LABKIT_PROGRESS"


def emit(**event: Any) -> None:
    """Append one progress event (stage, phase, done, total, …) to the file named by $LABKIT_PROGRESS, if any.

    Args:
        event: the event's fields, e.g. stage="training", phase="train", done=3, total=8, loss=2.1, eta_s=40.
    """
    path = os.environ.get(ENV)
    if not path:
        return
    if os.environ.get("RANK", "0") != "0":  # one process of a distributed launch speaks for all
        return
    event.setdefault("stage", os.environ.get("LABKIT_STAGE", "?"))
    line = json.dumps({"time": time.time(), **event}, default=str)
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
    except OSError:  # progress is a convenience: never fail a stage over it
        pass


def fmt_seconds(seconds: float | None) -> str:
    """Seconds as m:ss (h:mm:ss from an hour on); "—" when unknown. The one formatter: `labkit.show.tables` uses it."""
    if seconds is None:
        return "—"
    hours, rest = divmod(int(round(max(0.0, seconds))), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def describe(event: dict[str, Any]) -> str:
    """One terminal line for an event: `training: step 6/8 · loss 2.134 · ETA 0:12` (a warning: its text)."""
    if event.get("warning"):
        return f"    {event.get('stage', '?')}: warning: {event['warning']}"
    count = f"{event.get('done')}/{event.get('total')}"
    what = f"step {count}" if event.get("phase") == "train" else f"{event.get('label') or 'generating'} {count} examples"
    stage = str(event.get("stage", "?"))
    parts = [what if what.startswith(stage + ":") else f"{stage}: {what}"]  # "baseline: generating", not twice
    parts += [f"{key} {event[key]:.4g}" for key in ("loss", "eval_loss") if event.get(key) is not None]
    if event.get("eta_s") is not None:
        parts.append(f"ETA {fmt_seconds(event['eta_s'])}")
    return "    " + " · ".join(parts)


class Follower:
    """Reads new events from a run's progress file and says which to print.

    Each `poll` prints, for every (stage, phase, label, evaluation or not) with new events, its newest one — at most one line per
    `interval` seconds each, except the last of a phase (done == total), which is always printed.
    """

    def __init__(self, run_dir: Path, interval: float | None = None) -> None:
        self.path = Path(run_dir) / FILE
        self.offset = 0
        env = os.environ.get("LABKIT_PROGRESS_SECONDS")
        self.interval = interval if interval is not None else float(env) if env else 5.0
        self._printed: dict[tuple, float] = {}
        self._pending: dict[tuple, dict[str, Any]] = {}

    def _read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        end = data.rfind(b"\n") + 1  # a line being written is read next time
        self.offset += end
        events = []
        for raw in data[:end].splitlines():
            try:
                events.append(json.loads(raw))
            except json.JSONDecodeError:
                continue
        return events

    def poll(self, flush: bool = False, stage: str | None = None) -> list[str]:
        """The lines to print now.

        Args:
            flush: print every pending update regardless of the interval (the stage or run ended).
            stage: only this stage's updates (the others stay pending).
        Returns:
            the terminal lines, oldest first.
        """
        for event in self._read():
            kind = "eval" if event.get("eval_loss") is not None else ""  # a validation pass does not hide a step
            self._pending[(event.get("stage"), event.get("phase"), event.get("label"), kind)] = event
        now, lines = time.monotonic(), []
        for key, event in list(self._pending.items()):
            if stage is not None and key[0] != stage:
                continue
            final = event.get("done") is not None and event.get("done") == event.get("total")
            if flush or final or now - self._printed.get(key, -1e9) >= self.interval:
                lines.append(describe(event))
                self._printed[key] = now
                del self._pending[key]
        return lines
