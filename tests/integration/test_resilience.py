"""Training that survives the real world, through the real `labkit` command and kernel: SIGKILL mid-training
then `labkit run --resume` reproduces the uninterrupted loss curve and predictions; SIGTERM checkpoints and
marks the run interrupted; a run whose process died is shown interrupted; invalidation is kept."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, labkit

from labkit.card.load import load_card
from labkit.core import io
from labkit.core import runs as R
from labkit.train.resilience import last_checkpoint


@pytest.fixture(scope="module")
def reference(smoke_run) -> Path:
    """The uninterrupted smoke run (training checkpoints every 2 of its 8 steps)."""
    return smoke_run[0]


def _rewind_to_training(reference: Path, name: str) -> Path:
    """A copy of the reference run as it was before its training stage (stages 01-03 done)."""
    run = reference.parent / name
    shutil.copytree(reference, run, ignore=shutil.ignore_patterns("training", "comparison", "heartbeat", "04_*", "05_*"))
    status = json.loads((run / "status.json").read_text())
    status.update(run_id=name, status="interrupted", stages={k: v for k, v in status["stages"].items()
                                                             if k in ("baseline", "preprocessing", "parameter_check")})
    (run / "status.json").write_text(json.dumps(status))
    return run


def _curve(run: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (run / "training" / "log_history.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("loss"), r.get("eval_loss")) for r in rows if "loss" in r or "eval_loss" in r]


def _predictions(run: Path) -> list[str]:
    return [json.loads(line)["prediction"] for line in (run / "comparison" / "tuned_predictions.jsonl").read_text().splitlines()]


def _start_resume(run: Path) -> subprocess.Popen:
    env = {**os.environ, "LABKIT_RUNS": str(run.parent.parent)}
    return subprocess.Popen([sys.executable, "-m", "labkit", "run", "--resume", run.name], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for_checkpoint(run: Path, proc: subprocess.Popen, step: int = 2, timeout: float = 300) -> None:
    target = run / "training" / "trainer" / f"checkpoint-{step}" / "trainer_state.json"
    deadline = time.monotonic() + timeout
    while not target.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint written in time"
        time.sleep(0.05)


def test_sigkill_mid_training_then_resume_reproduces_the_run(reference: Path) -> None:
    run = _rewind_to_training(reference, "tiny-lora-killed")
    proc = _start_resume(run)
    _wait_for_checkpoint(run, proc)
    kernel = json.loads((run / "status.json").read_text())["stages"]["training"]["pid"]
    os.kill(kernel, signal.SIGKILL)  # the machine goes away: the training kernel and `labkit run` die at once
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    reached = int(Path(last_checkpoint(run / "training" / "trainer")).name.split("-")[1])
    assert 2 <= reached < 8, "killed mid-run"
    assert json.loads((run / "status.json").read_text())["status"] == "running"  # nobody could record it …
    table = labkit("runs", runs=run.parent.parent)
    assert table.returncode == 0
    row = next(line for line in table.stdout.splitlines() if run.name in line)
    assert "interrupted" in row and "is gone" in row  # … until `labkit runs` sees the process is gone
    resumed = labkit("run", "--resume", run.name, runs=run.parent.parent)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"continuing from {run / 'training' / 'trainer'}" in (run / "notebooks" / "04_training.ipynb").read_text()
    assert _curve(run) == _curve(reference)  # bit for bit, on the CPU
    assert _predictions(run) == _predictions(reference)
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "completed" and set(status["stages"]) == set(R.STAGES)


def test_sigterm_checkpoints_and_marks_interrupted(reference: Path) -> None:
    run = _rewind_to_training(reference, "tiny-lora-terminated")
    proc = _start_resume(run)
    _wait_for_checkpoint(run, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out + err
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "interrupted"
    assert status["stages"]["training"]["status"] == "interrupted"
    message = status["stages"]["training"]["error"]
    assert "TrainingInterrupted: SIGTERM at step" in message and f"labkit run --resume {run.name}" in message
    step = int(message.split("SIGTERM at step ")[1].split(";")[0])
    assert (run / "training" / "trainer" / f"checkpoint-{step}" / "trainer_state.json").exists()  # checkpoint of the last step
    events = [json.loads(line) for line in (run.parent.parent / "registry.jsonl").read_text().splitlines()
              if json.loads(line)["run_id"] == run.name]
    assert events[-1]["event"] == "interrupted"
    resumed = labkit("run", "--resume", run.name, runs=run.parent.parent)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert _curve(run) == _curve(reference)


def test_sigterm_after_the_last_step_stops_the_run_before_the_comparison(reference: Path) -> None:
    """The signal comes once training has written its outcome: nothing is left to checkpoint, but the run must stop
    (recorded interrupted, never failed, never carried on into stage 05) and resume where it stopped."""
    run = _rewind_to_training(reference, "tiny-lora-terminated-late")
    proc = _start_resume(run)
    outcome = run / "training" / "outcome.json"
    deadline = time.monotonic() + 300
    while not outcome.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out + err
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "interrupted" and "comparison" not in status["stages"], status
    assert status["stages"]["training"]["status"] in ("done", "interrupted"), status  # the stage, or its kernel, ended
    assert "SIGTERM during stage training" in status["error"] and f"labkit run --resume {run.name}" in status["error"]
    assert "interrupted: SIGTERM during stage training" in out
    resumed = labkit("run", "--resume", run.name, runs=run.parent.parent)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert _curve(run) == _curve(reference) and _predictions(run) == _predictions(reference)


def test_sigterm_during_labkit_stage_training_checkpoints_and_the_stage_continues(reference: Path) -> None:
    """`labkit stage training` handles the signal as `labkit run` does (it used to die at once, exit -15, and leave
    the run `running` with no checkpoint of the step); the same command then continues from that checkpoint."""
    run = _rewind_to_training(reference, "tiny-lora-stage-terminated")
    command = [sys.executable, "-m", "labkit", "stage", "training", str(run / "card.yaml"), "--run", str(run)]
    proc = subprocess.Popen(command, cwd=REPO, env={**os.environ, "LABKIT_RUNS": str(run.parent.parent)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _wait_for_checkpoint(run, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out + err
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "interrupted" and status["stages"]["training"]["status"] == "interrupted", status
    step = int(status["stages"]["training"]["error"].split("SIGTERM at step ")[1].split(";")[0])
    assert (run / "training" / "trainer" / f"checkpoint-{step}" / "trainer_state.json").exists()
    assert "interrupted: stage training" in err
    again = labkit("stage", "training", str(run / "card.yaml"), "--run", str(run), runs=run.parent.parent)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"continuing from {run / 'training' / 'trainer'}" in (run / "notebooks" / "04_training.ipynb").read_text()
    assert _curve(run) == _curve(reference)
    assert json.loads((run / "status.json").read_text())["status"] == "completed"  # this stage done
    # the rest as `labkit run --resume` continues it (the run, a copy of the reference, is then one like it, which the
    # tests that compare this session's smoke runs read)
    finished = labkit("run", "--resume", run.name, runs=run.parent.parent)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert _predictions(run) == _predictions(reference)


def test_dead_batch_run_is_shown_interrupted_and_live_one_is_not(tmp_path: Path) -> None:
    loaded = load_card(REPO / "params" / "smoke.yaml")
    root = tmp_path / "runs"
    dead = R.new_run(loaded, root)
    gone = subprocess.Popen(["true"])
    gone.wait()
    R.set_owner(dead, gone.pid)
    alive = R.new_run(loaded, root)  # owned by this test process
    table = labkit("runs", runs=root)
    assert table.returncode == 0
    assert f"{dead.run_id} was recorded as running but its process is gone" in table.stderr
    assert io.read_json(dead.status_path)["status"] == "interrupted"
    assert io.read_json(alive.status_path)["status"] == "running"
    assert labkit("run", "--resume", alive.run_id, runs=root).returncode == 2  # still running: not resumed twice


def test_invalidate_keeps_the_run_with_its_reason(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run = R.new_run(load_card(REPO / "params" / "smoke.yaml"), root)
    R.record(run, "failed", status="failed", error="boom")
    assert labkit("invalidate", run.run_id, runs=root).returncode == 2  # --why is required
    proc = labkit("invalidate", run.run_id, "--why", "trained on the wrong data file", runs=root)
    assert proc.returncode == 0, proc.stderr
    status = io.read_json(run.status_path)
    assert status["status"] == "invalid" and status["invalid_reason"] == "trained on the wrong data file"
    table = labkit("runs", runs=root).stdout
    assert "invalid" in table and "wrong data file" in table
    assert labkit("run", "--resume", run.run_id, runs=root).returncode == 2


def test_last_checkpoint_skips_incomplete_ones(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    for step, complete in ((2, True), (10, True), (12, False)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        save_file({"w": torch.zeros(4)}, str(tmp_path / f"checkpoint-{step}" / "adapter_model.safetensors"))
        if complete:  # weights and trainer_state.json (the Trainer writes it last): a valid checkpoint
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
    assert last_checkpoint(tmp_path / "missing") is None
