"""Run folders, the registry and the interactive session."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import REPO

from labkit.card.load import load_card
from labkit.core import runs as R


@pytest.fixture
def loaded():
    return load_card(REPO / "params" / "smoke.yaml")


def test_new_run_layout_and_registry(loaded, tmp_path: Path) -> None:
    run = R.new_run(loaded, tmp_path)
    assert run.dir.parent == tmp_path / "smoke"
    assert run.run_id.startswith("tiny-lora-") and run.run_id.endswith(loaded.hash)
    assert (run.dir / "card.yaml").is_file() and (run.dir / "card.diff.yaml").is_file()
    assert load_card(run.card_path).hash == loaded.hash  # the archived card is the resolved card
    R.record(run, "stage_done", stage="baseline", seconds=1.0)
    R.record(run, "failed", status="failed", stage="training", error="boom")
    status = run.status()
    assert status["status"] == "failed" and status["stages"]["baseline"]["status"] == "done"
    assert status["error"] == "boom"
    events = R.read_registry(tmp_path)
    assert [e["event"] for e in events] == ["started", "stage_done", "failed"]
    (row,) = R.summarise(events)
    assert row["status"] == "failed" and row["stage"] == "training" and row["error"] == "boom"


def test_two_runs_same_second_do_not_collide(loaded, tmp_path: Path) -> None:
    a, b = R.new_run(loaded, tmp_path), R.new_run(loaded, tmp_path)
    assert a.dir != b.dir


def test_registry_skips_a_torn_last_line(loaded, tmp_path: Path) -> None:
    run = R.new_run(loaded, tmp_path)
    with open(run.registry, "a") as handle:
        handle.write('{"time": "x", "run_id": "half')
    assert [e["event"] for e in R.read_registry(tmp_path)] == ["started"]


def test_interactive_session_reuses_its_run(loaded, tmp_path: Path, monkeypatch) -> None:
    from labkit.stages.context import open_stage

    monkeypatch.setenv("LABKIT_RUNS", str(tmp_path))
    first = open_stage("baseline", str(REPO / "params" / "smoke.yaml"))
    second = open_stage("preprocessing", str(REPO / "params" / "smoke.yaml"))
    assert first.run.dir == second.run.dir and first.interactive
    assert first.run.status()["mode"] == "interactive"
    env = json.loads((first.run.dir / "env.json").read_text())
    assert env["packages"]["torch"] and env["pip_freeze"]
    first.done(note="x")
    assert json.loads((first.out / "summary.json").read_text())["note"] == "x"


def test_env_capture_has_no_secrets(monkeypatch) -> None:
    from labkit.core.environment import capture

    monkeypatch.setenv("HF_TOKEN", "hf_fake_secret_value_123")
    monkeypatch.setenv("WANDB_API_KEY", "fake_wandb_key_456")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    text = json.dumps(capture())
    assert "hf_fake_secret_value_123" not in text and "fake_wandb_key_456" not in text
    assert '"OMP_NUM_THREADS": "2"' in text


def test_locked_test_split(tmp_path: Path, loaded) -> None:
    from labkit.data.prepare import load_split

    run = R.new_run(loaded, tmp_path)
    with pytest.raises(PermissionError, match="locked"):
        load_split(run, "test")


def test_importing_labkit_turns_hub_telemetry_off_unless_the_user_chose() -> None:
    import subprocess
    import sys

    probe = "import labkit, huggingface_hub.constants as c; print(c.HF_HUB_DISABLE_TELEMETRY)"
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_TELEMETRY"}
    off = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    chosen = subprocess.run([sys.executable, "-c", probe], env={**env, "HF_HUB_DISABLE_TELEMETRY": "0"},
                            capture_output=True, text=True, check=True)
    assert off.stdout.strip() == "True" and chosen.stdout.strip() == "False"
