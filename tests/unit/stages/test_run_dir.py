"""A stage notebook's run_dir meets batch runs: "latest" opens the card's newest completed run for review (nothing in
it changes), stage 05's default opens it when the interactive run has no trained adapter, and a notebook with no run
to open names the runs it could open and how to set run_dir."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import MISTRAL3_REFUSAL, REPO, mistral3_card

import labkit
from labkit.card.load import load_card
from labkit.core import io
from labkit.core import runs as R
from labkit.errors import MissingInput, ModelSourceError
from labkit.stages.context import open_stage

SMOKE = str(REPO / "params" / "smoke.yaml")


def _completed(root: Path) -> R.Run:
    run = R.new_run(load_card(SMOKE), root)
    for stage in R.STAGES:
        R.record(run, "stage_done", stage=stage, seconds=1.0)
    io.write_json(run.dir / "comparison" / "verdict.json", {"confirmed": False, "decision": "not confirmed"})
    R.record(run, "completed", status="completed")
    return run


def _files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_latest_opens_the_newest_completed_run_for_review_and_changes_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LABKIT_RUNS", str(tmp_path))
    monkeypatch.delenv("LABKIT_BATCH", raising=False)
    _completed(tmp_path)
    newest = _completed(tmp_path)
    before = _files(tmp_path)
    stage = open_stage("comparison", SMOKE, "latest")
    assert stage.run.dir == newest.dir and stage.review is not None and not stage.out.is_relative_to(tmp_path)
    assert stage.read("comparison", "verdict.json")["decision"] == "not confirmed"  # the archived file
    stage.save_json("verdict.json", {"decision": "rewritten"})  # a cell re-running: written to the scratch folder
    assert stage.read("comparison", "verdict.json")["decision"] == "rewritten"
    stage.done(note="review")
    assert _files(tmp_path) == before  # a completed run is a record: no file, no registry line changed
    # a completed run's folder given by hand opens for review too (it used to be refused as complete)
    assert open_stage("comparison", SMOKE, str(newest.dir)).review is not None
    # the Python API: a run id as `labkit runs` lists it, "latest" by default
    assert labkit.stage("comparison", SMOKE).run.dir == newest.dir
    assert labkit.stage("comparison", SMOKE, newest.run_id).run.dir == newest.dir
    assert _files(tmp_path) == before


def test_stage_05_by_default_opens_the_latest_completed_run_when_the_interactive_one_has_no_adapter(
        tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("LABKIT_RUNS", str(tmp_path))
    monkeypatch.delenv("LABKIT_BATCH", raising=False)
    mine = open_stage("baseline", SMOKE).run  # an interactive run, stage 01 only
    with pytest.raises(MissingInput) as raised:  # nothing to open yet: the runs it could open, and how
        open_stage("comparison", SMOKE)
    text = str(raised.value)
    assert "stage comparison needs stage training done" in text and f"{mine.run_id} (running, interactive" in text
    assert 'run_dir = "latest"' in text and "labkit run" in text
    with pytest.raises(MissingInput, match='run_dir "latest": no completed run of this card'):
        open_stage("comparison", SMOKE, "latest")
    done = _completed(tmp_path)
    stage = open_stage("comparison", SMOKE)
    assert stage.run.dir == done.dir and stage.review is not None
    assert f"opening the card's newest completed run {done.run_id} for review" in capsys.readouterr().out
    assert open_stage("preprocessing", SMOKE).run.dir == mine.dir  # other stages continue the interactive run
    with pytest.raises(MissingInput) as missing:  # a file missing in the opened run: the runs, and run_dir
        stage.read("training", "outcome.json")
    assert "outcome.json is missing" in str(missing.value) and done.run_id in str(missing.value)


def test_a_notebook_opened_by_hand_makes_the_checks_labkit_run_makes_before_its_run(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """A card whose model transformers does not load as a causal LM: the notebook's first cell fails in the line
    `labkit run` prints, and no interactive run is created."""
    monkeypatch.setenv("LABKIT_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("LABKIT_BATCH", raising=False)
    card = mistral3_card(tmp_path)
    with pytest.raises(ModelSourceError) as refused:
        open_stage("baseline", str(card))
    assert str(refused.value) == f"{card}:3: model.source {tmp_path / 'mistral3'}: {MISTRAL3_REFUSAL}"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("status.json"))
