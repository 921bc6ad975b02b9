"""Live progress: events written by a stage's process, read back as one terminal line per update."""

from __future__ import annotations

import json
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

