"""A record nothing can bend: torn registry writes, final invalidations, run ids as names, archived cards, archived
stages (issue: the record)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from labkit.card.load import load_card
from labkit.cli.runner import resume_run, stage_into
from labkit.core import runs as R
from labkit.core.registry import lost_events_note
from labkit.errors import MissingInput, RunStateError, UsageError


@pytest.fixture
def loaded():
    return load_card(REPO / "params" / "smoke.yaml")


# --------------------------------------------------------------------------- the registry survives a torn write
def test_an_event_after_a_torn_line_is_readable_and_the_torn_bytes_are_kept(loaded, tmp_path: Path, capsys) -> None:
    run = R.new_run(loaded, tmp_path)
    torn = b'{"time": "2026-12-01T00:00:00Z", "run_id": "x", "event": "test_op'
    with open(run.registry, "ab") as handle:  # a crash or a full disk mid-write: no newline
        handle.write(torn)
    R.record(run, "invalidated", status="invalid", why="wrong data")
    lines = run.registry.read_bytes().split(b"\n")
    assert lines[1] == torn, "the torn line is ended, never merged with the new event"
    events = R.read_registry(tmp_path)
    assert [e["event"] for e in events] == ["started", "invalidated"]
    (kept,) = (tmp_path / "registry.torn").iterdir()
    assert kept.read_bytes() == torn and kept.name.startswith("line-2-")
    warning = capsys.readouterr().err
    assert "registry.jsonl:2" in warning and str(kept) in warning
    note = lost_events_note(tmp_path)
    assert note and "line 2" in note and "test opening" in note
    assert lost_events_note(tmp_path.parent / "empty") is None


def test_strict_reading_names_what_a_lost_line_means(loaded, tmp_path: Path) -> None:
    run = R.new_run(loaded, tmp_path)
    with open(run.registry, "a") as handle:
        handle.write("garbage\n")
    with pytest.raises(Exception, match="test opening"):
        R.read_registry(tmp_path, strict=True)


# --------------------------------------------------------------------------- an invalidation is final
def test_an_invalidation_during_a_run_survives_its_end(loaded, tmp_path: Path) -> None:
    run = R.new_run(loaded, tmp_path)
    R.record(run, "stage_done", stage="baseline", seconds=1.0)
    R.record(run, "invalidated", status="invalid", why="leaked data")  # `labkit invalidate` while it runs
    R.record(run, "stage_done", stage="preprocessing", seconds=1.0)
    R.record(run, "completed", status="completed")  # the run's own end
    assert run.status()["status"] == "invalid" and run.status()["invalid_reason"] == "leaked data"
    (row,) = R.summarise(R.read_registry(tmp_path))
    assert row["status"] == "invalid" and "leaked data" in row["error"]
    with pytest.raises(RunStateError, match="invalid"):
        R.check_stage_may_run(run, "training")


# --------------------------------------------------------------------------- run ids are names, not patterns
@pytest.mark.parametrize("bad", ["*", "*-*", "[v]1*", "tiny-lora-?", "../smoke/x", ""])
def test_run_ids_are_not_patterns(loaded, tmp_path: Path, bad: str) -> None:
    R.new_run(loaded, tmp_path)
    with pytest.raises(UsageError):
        R.find_run(bad, tmp_path)


def test_run_ids_exact_unique_prefix_and_paths_inside_the_root(loaded, tmp_path: Path) -> None:
    a = R.new_run(loaded, tmp_path / "runs")
    b = R.new_run(loaded, tmp_path / "runs")
    assert R.find_run(a.run_id, tmp_path / "runs").dir == a.dir
    child = tmp_path / "other.yaml"
    child.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\nexperiment: {{variant: other-variant}}\n")
    c = R.new_run(load_card(child), tmp_path / "runs")
    assert R.find_run("other-var", tmp_path / "runs").dir == c.dir  # a unique prefix
    assert R.find_run(str(a.dir), tmp_path / "runs").dir == a.dir
    with pytest.raises(UsageError, match="matches 2 runs"):
        R.find_run("tiny-lora-", tmp_path / "runs")
    with pytest.raises(MissingInput):
        R.find_run("nothing-like-it", tmp_path / "runs")
    other = R.new_run(loaded, tmp_path / "elsewhere")
    with pytest.raises(UsageError, match="not a run folder of the runs root"):
        R.find_run(str(other.dir), tmp_path / "runs")


# --------------------------------------------------------------------------- the archived card is the run's card
def _edit_card(run: R.Run, **train: object) -> None:
    card = yaml.safe_load(run.card_path.read_text())
    card["train"].update(train)
    run.card_path.write_text(yaml.safe_dump(card))


def test_the_archived_card_reloads_to_its_recorded_hash(loaded, tmp_path: Path) -> None:
    run = R.new_run(loaded, tmp_path)
    R.check_archived_card(run, load_card(run.card_path))  # nothing changed: no error


def test_a_resume_under_an_edited_card_is_refused_with_the_keys(loaded, tmp_path: Path) -> None:
    run = R.new_run(loaded, tmp_path)
    R.record(run, "stage_done", stage="baseline", seconds=1.0)
    R.record(run, "failed", status="failed", stage="preprocessing", error="boom")
    _edit_card(run, max_steps=120)
    before = run.status_path.read_bytes(), run.registry.read_bytes()
    with pytest.raises(RunStateError, match=r"train\.max_steps .*→ 120"):
        resume_run(run.run_id, tmp_path, REPO / "notebooks")
    assert (run.status_path.read_bytes(), run.registry.read_bytes()) == before, "a refusal writes nothing"


# --------------------------------------------------------------------------- archived stages are not re-executed
def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_stage_of_a_complete_run_is_refused_and_no_file_changes(loaded, tmp_path: Path) -> None:
    run = R.new_run(loaded, tmp_path)
    for stage in R.STAGES:
        R.record(run, "stage_done", stage=stage, seconds=1.0)
    R.record(run, "completed", status="completed")
    (run.dir / "comparison").mkdir()
    (run.dir / "comparison" / "verdict.json").write_text(json.dumps({"confirmed": True}))
    before = _files(tmp_path)
    with pytest.raises(RunStateError, match="complete"):
        stage_into(load_card(run.card_path), "comparison", str(run.dir), tmp_path, REPO / "notebooks")
    assert _files(tmp_path) == before


def test_a_done_stage_is_refused_but_the_next_one_may_run(loaded, tmp_path: Path) -> None:
    run = R.new_run(loaded, tmp_path)
    R.record(run, "stage_done", stage="baseline", seconds=1.0)
    R.record(run, "completed", status="completed", stage="baseline")  # `labkit stage baseline CARD`
    with pytest.raises(RunStateError, match="stage baseline .* is done"):
        R.check_stage_may_run(run, "baseline")
    R.check_stage_may_run(run, "preprocessing")  # building a run stage by stage stays possible
    R.check_stage_may_run(run, "baseline", rerun_done=True)  # an unfinished interactive run's notebook


def test_a_finalised_run_is_refused(loaded, tmp_path: Path) -> None:
    run = R.new_run(loaded, tmp_path)
    R.record(run, "stage_done", stage="baseline", seconds=1.0)
    R.record(run, "test_opened", opening=1)
    with pytest.raises(RunStateError, match="finalised"):
        R.check_stage_may_run(run, "preprocessing")


# --------------------------------------------------------------------------- a resume that lost its checkpoints
def test_a_resume_without_a_usable_checkpoint_refuses_unless_told_to_start_over(loaded, tmp_path: Path) -> None:
    from labkit.cli.runner import check_training_restart

    run = R.new_run(loaded, tmp_path)
    for stage in ("baseline", "preprocessing", "parameter_check"):
        R.record(run, "stage_done", stage=stage, seconds=1.0)
    R.record(run, "interrupted", status="interrupted", stage="training")
    training = run.dir / "training"
    (training / "trainer" / "checkpoint-4").mkdir(parents=True)  # torn: no trainer_state.json
    (training / "log_history.jsonl").write_text('{"step": 2, "loss": 3.1}\n{"step": 4, "loss": 2.7}\n')
    before = _files(tmp_path)
    with pytest.raises(RunStateError, match="no usable checkpoint .*--restart-training"):
        resume_run(run.run_id, tmp_path, REPO / "notebooks")
    assert _files(tmp_path) == before, "a refusal writes nothing"
    check_training_restart(run, restart=True)
    kept = sorted(p.name for p in training.iterdir())
    assert len(kept) == 2 and all(".before-" in name for name in kept)  # the earlier history and checkpoints stay
    history = next(p for p in training.iterdir() if p.name.startswith("log_history.before-"))
    assert "2.7" in history.read_text()
    (training / "trainer" / "checkpoint-6").mkdir(parents=True)
    (training / "trainer" / "checkpoint-6" / "trainer_state.json").write_text("{}")
    from safetensors.torch import save_file  # the weights: a checkpoint that passes resilience.checkpoint_problem
    import torch

    save_file({"w": torch.zeros(4)}, str(training / "trainer" / "checkpoint-6" / "adapter_model.safetensors"))
    check_training_restart(run, restart=False)  # a usable checkpoint: training continues from it, no question asked
