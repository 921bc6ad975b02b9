"""Live progress: events written by a stage's process, read back as one terminal line per update."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from labkit.core import progress


def test_emit_writes_only_under_labkit_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(progress.ENV, raising=False)
    progress.emit(phase="train", done=1, total=8)  # a notebook opened by hand: nothing written anywhere
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv(progress.ENV, str(tmp_path / progress.FILE))
    monkeypatch.setenv("LABKIT_STAGE", "training")
    progress.emit(phase="train", done=1, total=8, loss=2.5)
    (event,) = [json.loads(line) for line in (tmp_path / progress.FILE).read_text().splitlines()]
    assert event["stage"] == "training" and event["done"] == 1 and event["loss"] == 2.5


def test_follower_prints_the_newest_update_per_phase_and_always_the_last(tmp_path: Path) -> None:
    path = tmp_path / progress.FILE
    events = [{"stage": "training", "phase": "train", "done": i, "total": 8, "loss": 3.0 - i / 10, "eta_s": 70 - i}
              for i in range(1, 5)]
    path.write_text("".join(json.dumps(e) + "\n" for e in events) + '{"stage": "tra')  # a line still being written
    follower = progress.Follower(tmp_path, interval=3600)
    assert follower.poll() == ["    training: step 4/8 · loss 2.6 · ETA 1:06"]
    with open(path, "a") as handle:  # the half line completes; more steps come within the interval
        handle.write('ining", "phase": "train", "done": 5, "total": 8}\n')
        handle.write(json.dumps({"stage": "training", "phase": "train", "done": 6, "total": 8}) + "\n")
    assert follower.poll() == []  # throttled
    with open(path, "a") as handle:
        handle.write(json.dumps({"stage": "comparison", "phase": "generate", "label": "tuned: generating",
                                 "done": 12, "total": 12}) + "\n")
    assert follower.poll() == ["    comparison: tuned: generating 12/12 examples"]  # a phase's end always shows
    assert follower.poll(flush=True) == ["    training: step 6/8"]
    with open(path, "a") as handle:  # the last step and the validation pass after it: both shown
        for event in ({"done": 8, "loss": 2.0}, {"done": 8, "eval_loss": 2.5}):
            handle.write(json.dumps({"stage": "training", "phase": "train", "total": 8, **event}) + "\n")
    assert follower.poll() == ["    training: step 8/8 · loss 2", "    training: step 8/8 · eval_loss 2.5"]


def test_updates_print_oldest_first(tmp_path: Path) -> None:
    path = tmp_path / progress.FILE
    follower = progress.Follower(tmp_path, interval=3600)
    train = {"stage": "training", "phase": "train", "total": 8}
    steps = [{"done": 2, "loss": 3.0}, {"done": 2, "eval_loss": 3.2}, {"done": 4, "loss": 2.5}]
    path.write_text("".join(json.dumps({**train, **e}) + "\n" for e in steps))
    assert follower.poll(flush=True) == ["    training: step 2/8 · eval_loss 3.2", "    training: step 4/8 · loss 2.5"]



def test_a_task_reports_its_start_and_its_end_with_the_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(progress.ENV, str(tmp_path / progress.FILE))
    monkeypatch.setenv("LABKIT_STAGE", "parameter_check")
    with progress.task("update check: 2 optimiser steps"):
        pass
    with pytest.raises(ValueError), progress.task("memory: full step (length 2/2)"):
        raise ValueError("out of memory")
    lines = progress.Follower(tmp_path, interval=0).poll()
    assert lines[0] == "    parameter_check: update check: 2 optimiser steps done in 0.0 s"  # start and end: the end
    assert lines[1] == "    parameter_check: memory: full step (length 2/2) failed after 0.0 s"


def test_a_task_start_shows_while_it_runs_and_its_end_always(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(progress.ENV, str(tmp_path / progress.FILE))
    monkeypatch.setenv("LABKIT_STAGE", "baseline")
    follower = progress.Follower(tmp_path, interval=3600)
    with progress.task("converting model.gguf: GGUF → safetensors"):
        assert follower.poll() == ["    baseline: converting model.gguf: GGUF → safetensors …"]
    (line,) = follower.poll()  # within the interval, yet printed: a task's end is never held back
    assert line.startswith("    baseline: converting model.gguf: GGUF → safetensors done in ")


def _write(path: Path, events: list[dict]) -> None:
    with open(path, "a") as handle:
        handle.writelines(json.dumps(e) + "\n" for e in events)


def test_a_quiet_stage_gets_one_line_per_quiet_period(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(progress.QUIET_ENV, "2")
    now = time.time()
    path = tmp_path / progress.FILE
    _write(path, [{"time": now - 400, "stage": "parameter_check", "phase": "stage", "state": "start"},
                  {"time": now - 300, "stage": "parameter_check", "phase": "task", "state": "start",
                   "label": "memory: measuring a full step at 512 tokens (length 1/2)"}])
    follower = progress.Follower(tmp_path, interval=3600)
    assert follower.poll() == ["    parameter_check: memory: measuring a full step at 512 tokens (length 1/2) …"]
    assert follower.poll() == ["    parameter_check: no update for 5 min · last: memory: measuring a full step at 512 "
                               "tokens (length 1/2)"]
    assert follower.poll() == []  # at most once per quiet period
    assert follower.quiet(now + 60) is None
    assert follower.quiet(now + 121) == ("    parameter_check: no update for 7 min · last: memory: measuring a full "
                                         "step at 512 tokens (length 1/2)")
    assert follower.poll(flush=True) == []  # a stage or run that ended: no quiet line
    _write(path, [{"time": now, "stage": "parameter_check", "phase": "task", "state": "end", "seconds": 300,
                   "label": "memory: measuring a full step at 512 tokens (length 1/2)"}])
    assert follower.poll() == ["    parameter_check: memory: measuring a full step at 512 tokens (length 1/2) done in "
                               "5:00 (m:ss)"]
    assert follower.quiet(now + 60) is None  # the stage spoke: quiet again only after the period
    _write(path, [{"time": now - 200, "stage": "parameter_check", "phase": "stage", "state": "end"}])
    assert follower.poll() == []
    assert follower.quiet(now + 1000) is None  # between stages the runner is not a quiet stage


def test_stage_seconds_reads_the_last_start_and_its_end(tmp_path: Path) -> None:
    assert progress.stage_seconds(tmp_path, "training") is None  # no file
    progress.stage_event(tmp_path, "training", "start")
    assert progress.stage_seconds(tmp_path, "training") is None  # under way
    _write(tmp_path / progress.FILE, [
        {"time": 100.0, "stage": "training", "phase": "stage", "state": "start"},
        {"time": 112.34, "stage": "training", "phase": "stage", "state": "end"},
        {"time": 90.0, "stage": "baseline", "phase": "stage", "state": "end"}])
    assert progress.stage_seconds(tmp_path, "training") == 12.3
    assert progress.stage_seconds(tmp_path, "baseline") is None  # an end without its start


def test_echo_prints_a_process_events_without_a_progress_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(progress.ENV, raising=False)
    monkeypatch.setenv("LABKIT_STAGE", "export")
    lines: list[str] = []
    progress.echo_to(lines.append)
    try:
        with progress.task("reload check: resolving the base model"):
            progress.emit(phase="generate", label="reload check: generating", done=1, total=3)
            progress.emit(phase="generate", label="reload check: generating", done=2, total=3)  # throttled
            progress.emit(phase="generate", label="reload check: generating", done=3, total=3)
    finally:
        progress.echo_to(None)
    assert lines[:3] == ["    export: reload check: resolving the base model …",
                         "    export: reload check: generating 1/3 examples",
                         "    export: reload check: generating 3/3 examples"]
    assert lines[3].startswith("    export: reload check: resolving the base model done in ")
