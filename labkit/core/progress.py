"""Live progress of a running stage: events appended to `<run>/progress.jsonl`, read back as terminal lines.

The stage's process (a notebook kernel under papermill, or a training worker) calls `emit` — the training callback
(`labkit.train.trainer`) after every logged step, the generation loop (`labkit.evaluate.generation`) after every
batch — or wraps a longer piece of work in `task` (a start and an end event with its seconds: stage 03's checks,
fetching and converting a model, preparing the data, the export's reload check). `labkit run` sets
`LABKIT_PROGRESS` to the run's file for its kernels; without it `emit` writes nothing, so a notebook opened by hand
is unchanged. The runner, and `labkit runs --follow RUN` from another terminal, read the file with a `Follower` and
print one line per update, so the archived notebooks hold no progress bars; a stage that reports nothing for
`quiet_seconds` gets a "no update for N min" line. The runner marks each stage's start and end in the file
(`stage_event`); `stage_seconds` reads a stage's duration from them, the one both print.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator

FILE = "progress.jsonl"
ENV = "LABKIT_PROGRESS"
QUIET_ENV = "LABKIT_QUIET_MINUTES"  # minutes without an event before the watcher says so (default 2)
TASK, STAGE = "task", "stage"  # the phases of `task` and `stage_event` events
_echo: tuple["Follower", Callable[[str], None]] | None = None


def _append(path: str | Path, event: dict[str, Any]) -> None:
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(event, default=str) + "\n")
    except OSError:  # progress is a convenience: never fail a stage over it
        pass


def emit(**event: Any) -> None:
    """Append one progress event (stage, phase, done, total, …) to the file named by $LABKIT_PROGRESS, if any (and
    print it on the console `echo_to` set, if any).

    Args:
        event: the event's fields, e.g. stage="training", phase="train", done=3, total=8, loss=2.1, eta_s=40.
    """
    path = os.environ.get(ENV)
    if (not path and _echo is None) or os.environ.get("RANK", "0") != "0":  # one process of a launch speaks for all
        return
    event.setdefault("stage", os.environ.get("LABKIT_STAGE", "?"))
    event = {"time": time.time(), **event}
    if path:
        _append(path, event)
    if _echo is not None:
        follower, log = _echo
        follower.take([event])
        for line in follower.poll():
            log(line)


def echo_to(log: Callable[[str], None] | None, interval: float = 5.0) -> None:
    """Also print this process's events, throttled as `Follower` does, through `log` (None: stop); for a process
    whose output nobody tails, e.g. the export's reload check."""
    global _echo
    _echo = (Follower(None, interval), log) if log is not None else None


@contextmanager
def task(label: str, **fields: Any) -> Iterator[None]:
    """Report a piece of work: an event when it starts, and one when it ends with its seconds (or fails).

    Args:
        label: what is done, e.g. "memory: full step at 512 tokens (length 1/2)".
        fields: more fields for both events.
    """
    emit(phase=TASK, label=label, state="start", **fields)
    start = time.monotonic()
    try:
        yield
    except BaseException:
        emit(phase=TASK, label=label, state="failed", seconds=round(time.monotonic() - start, 1), **fields)
        raise
    emit(phase=TASK, label=label, state="end", seconds=round(time.monotonic() - start, 1), **fields)


@contextmanager
def timed(seconds: dict[str, float], name: str, label: str | None = None) -> Iterator[None]:
    """Add the block's wall seconds to `seconds[name]`; with a label, report the block as a progress `task` (None where
    the work inside reports its own parts)."""
    start = time.perf_counter()
    try:
        with task(label) if label else nullcontext():
            yield
    finally:
        seconds[name] = round(seconds.get(name, 0.0) + time.perf_counter() - start, 2)


def stage_event(run_dir: Path, stage: str, state: str, **fields: Any) -> None:
    """Mark a stage's start ("start") or end ("end") in the run's progress file (the runner, around the stage)."""
    _append(Path(run_dir) / FILE, {"time": time.time(), "stage": stage, "phase": STAGE, "state": state, **fields})


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """Every complete event of a run's progress file (none when it has none)."""
    follower = Follower(run_dir)
    return follower._read()


def stage_seconds(run_dir: Path, stage: str, events: list[dict[str, Any]] | None = None) -> float | None:
    """A stage's duration: from its last start event to the end event after it (`stage_event`), to 0.1 s.

    The one definition `labkit run` and `labkit runs --follow` print.

    Args:
        run_dir: the run folder.
        stage: the stage name.
        events: the run's events, when already read.
    Returns:
        the seconds, or None when the stage has not ended (or never started) in this file.
    """
    start = end = None
    for event in read_events(run_dir) if events is None else events:
        if event.get("phase") == STAGE and event.get("stage") == stage:
            if event.get("state") == "start":
                start, end = event.get("time"), None
            elif event.get("state") == "end" and start is not None:
                end = event.get("time")
    return None if start is None or end is None else round(float(end) - float(start), 1)


def fmt_seconds(seconds: float | None) -> str:
    """Seconds as m:ss (h:mm:ss from an hour on); "—" when unknown. The one formatter: `labkit.show.tables` uses it."""
    if seconds is None:
        return "—"
    hours, rest = divmod(int(round(max(0.0, seconds))), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _took(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else f"{fmt_seconds(seconds)} (m:ss)"


def describe(event: dict[str, Any]) -> str:
    """One terminal line for an event: `training: step 6/8 · loss 2.134 · ETA 0:12`, `parameter_check: update
    check: 2 optimiser steps done in 3.1 s`; a warning: its text)."""
    stage = str(event.get("stage", "?"))
    if event.get("warning"):
        return f"    {stage}: warning: {event['warning']}"
    if event.get("phase") == TASK:
        state, label = event.get("state"), str(event.get("label"))
        what = label + (" …" if state == "start" else f" done in {_took(float(event.get('seconds') or 0))}"
                        if state == "end" else f" failed after {_took(float(event.get('seconds') or 0))}")
        return f"    {stage}: {what}"
    count = f"{event.get('done')}/{event.get('total')}"
    what = f"step {count}" if event.get("phase") == "train" else f"{event.get('label') or 'generating'} {count} examples"
    parts = [what if what.startswith(stage + ":") else f"{stage}: {what}"]  # "baseline: generating", not twice
    parts += [f"{key} {event[key]:.4g}" for key in ("loss", "eval_loss") if event.get(key) is not None]
    if event.get("eta_s") is not None:
        parts.append(f"ETA {fmt_seconds(event['eta_s'])}")
    return "    " + " · ".join(parts)


def quiet_seconds() -> float:
    """Seconds without an event before a watcher prints "no update for N min" ($LABKIT_QUIET_MINUTES, default 2)."""
    try:
        return max(1.0, 60 * float(os.environ.get(QUIET_ENV) or 2))
    except ValueError:
        return 120.0


class Follower:
    """Reads new events from a run's progress file and says which to print.

    Each `poll` prints, for every (stage, phase, label, evaluation or not) with new events, its newest one — at most one line per
    `interval` seconds each, except the last of a phase (done == total) and a task's end, which are always printed;
    and, while a stage is under way and its last event is `quiet_seconds` old, one "no update for N min" line (again
    at most every `quiet_seconds`). Stage start and end events (`stage_event`) are not printed.
    """

    def __init__(self, run_dir: Path | None, interval: float | None = None) -> None:
        self.path = Path(run_dir) / FILE if run_dir is not None else None
        self.offset = 0
        env = os.environ.get("LABKIT_PROGRESS_SECONDS")
        self.interval = interval if interval is not None else float(env) if env else 5.0
        self.quiet_after = quiet_seconds()
        self.last: dict[str, Any] | None = None  # the newest event read, stage events included
        self._said_quiet = 0.0
        self._printed: dict[tuple, float] = {}
        self._pending: dict[tuple, dict[str, Any]] = {}

    def _read(self) -> list[dict[str, Any]]:
        if self.path is None or not self.path.exists():
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

    def take(self, events: list[dict[str, Any]]) -> None:
        """Add events (read from the file, or handed over by `emit`'s echo) to those waiting to be printed."""
        for event in events:
            if event.get("time") is not None:
                self.last = event
            if event.get("phase") == STAGE:
                continue
            kind = "eval" if event.get("eval_loss") is not None else ""  # a validation pass does not hide a step
            key = (event.get("stage"), event.get("phase"), event.get("label"), kind)
            self._pending.pop(key, None)  # to the end: `poll` prints in the order the newest events came
            self._pending[key] = event

    def quiet(self, now: float | None = None) -> str | None:
        """The "no update for N min" line when a stage is under way and has said nothing for `quiet_after` seconds
        (None otherwise, and within `quiet_after` of the last such line).

        Args:
            now: the time (default: time.time()).
        """
        last = self.last
        if last is None or (last.get("phase") == STAGE and last.get("state") != "start"):
            return None
        now = time.time() if now is None else now
        since = now - float(last["time"])
        if since < self.quiet_after or now - self._said_quiet < self.quiet_after:
            return None
        self._said_quiet = now
        doing = "" if last.get("phase") == STAGE else describe(last).split(": ", 1)[-1].removesuffix(" …")
        doing = f" · last: {doing[:70]}" + ("…" if len(doing) > 70 else "") if doing else ""
        return f"    {last.get('stage', '?')}: no update for {int(since // 60)} min{doing}"

    def poll(self, flush: bool = False, stage: str | None = None) -> list[str]:
        """The lines to print now.

        Args:
            flush: print every pending update regardless of the interval (the stage or run ended); no quiet line.
            stage: only this stage's updates (the others stay pending).
        Returns:
            the terminal lines, oldest first.
        """
        self.take(self._read())
        now, lines = time.monotonic(), []
        for key, event in list(self._pending.items()):
            if stage is not None and key[0] != stage:
                continue
            final = (event.get("done") is not None and event.get("done") == event.get("total")) or (
                event.get("phase") == TASK and event.get("state") != "start")
            if flush or final or now - self._printed.get(key, -1e9) >= self.interval:
                lines.append(describe(event))
                self._printed[key] = now
                del self._pending[key]
        if not flush and stage is None and not lines and (line := self.quiet()):
            lines.append(line)
        return lines
