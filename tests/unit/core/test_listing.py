"""The registry's runs as rows (`labkit runs`, `--json`, `labkit.runs()`), interactive runs whose kernel is gone, and
the runs a notebook's run_dir resolves against."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from labkit.card.load import load_card
from labkit.cli.main import main
from labkit.core import listing
from labkit.core import runs as R
from labkit.core.heartbeat import beat

SMOKE = REPO / "params" / "smoke.yaml"


@pytest.fixture
def loaded():
    return load_card(SMOKE)


def _completed(loaded, root: Path, stages: tuple[str, ...] = R.STAGES) -> R.Run:
    run = R.new_run(loaded, root)
    for stage in stages:
        R.record(run, "stage_done", stage=stage, seconds=1.0)
    R.record(run, "completed", status="completed", summary={"confirmed": True, "decision": "confirmed",
                                                             "field_accuracy": {"baseline": 0.25, "tuned": 0.83}})
    return run


def _interactive_in_a_process_that_exits(root: Path) -> R.Run:
    """An interactive run opened by a real process (as a notebook kernel does: a run, a heartbeat), which then exits."""
    code = ("import sys; from pathlib import Path; from labkit.card.load import load_card; "
            "from labkit.core import runs as R; from labkit.core.heartbeat import beat; "
            f"run = R.new_run(load_card({str(SMOKE)!r}), Path({str(root)!r}), mode='interactive'); "
            "R.record(run, 'stage_done', stage='baseline', seconds=1.0); beat(run.dir); print(run.dir)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return R.Run(Path(proc.stdout.strip().splitlines()[-1]))


def test_an_interactive_run_whose_kernel_exited_is_shown_abandoned(loaded, tmp_path: Path, capsys) -> None:
    gone = _interactive_in_a_process_that_exits(tmp_path)
    live = R.new_run(loaded, tmp_path, mode="interactive")  # this process: its kernel is alive
    beat(live.dir)
    rows = {r["run_id"]: r for r in listing.rows(tmp_path)}
    assert rows[gone.run_id]["status"] == "abandoned (kernel gone)"
    assert rows[gone.run_id]["state"] == "running" and "is gone" in rows[gone.run_id]["abandoned"]
    assert rows[live.run_id]["status"] == "running" and rows[live.run_id]["abandoned"] is None
    assert gone.status()["status"] == "running"  # shown, not recorded: a new kernel on the run shows it running again
    assert main(["--runs", str(tmp_path), "runs"]) == 0
    table = capsys.readouterr().out
    line = next(x for x in table.splitlines() if gone.run_id in x)
    assert "abandoned (kernel gone)" in line and "abandoned: kernel" in line
    assert next(x for x in table.splitlines() if live.run_id in x).split()[1] == "running"


def test_runs_json_is_one_document_with_the_tables_columns(loaded, tmp_path: Path, capsys) -> None:
    done = _completed(loaded, tmp_path)
    failed = R.new_run(loaded, tmp_path)
    R.record(failed, "failed", status="failed", stage="training", error="boom")
    assert main(["--runs", str(tmp_path), "runs", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in rows] == [done.run_id, failed.run_id]
    assert all(list(r) == list(listing.FIELDS) for r in rows)
    assert set(listing.COLUMNS) <= set(rows[0])
    first, second = rows
    assert first["status"] == "completed" and first["result"] == "field_accuracy 0.250→0.830 confirmed"
    assert (first["metric"], first["baseline"], first["tuned"]) == ("field_accuracy", 0.25, 0.83)
    assert first["confirmed"] is True and first["decision"] == "confirmed"
    assert first["stages_done"] == list(R.STAGES) and first["mode"] == "batch" and first["dir"] == str(done.dir)
    assert second["status"] == "failed" and second["error"] == "boom" and second["stage"] == "training"
    assert main(["--runs", str(tmp_path), "runs", "other-experiment", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_latest_is_the_cards_newest_completed_run_with_the_stage_done(loaded, tmp_path: Path) -> None:
    older = _completed(loaded, tmp_path)
    newer = _completed(loaded, tmp_path)
    partial = _completed(loaded, tmp_path, stages=("baseline",))  # `labkit stage baseline`: completed, one stage
    R.new_run(loaded, tmp_path, mode="interactive")  # unfinished
    invalid = _completed(loaded, tmp_path)
    R.record(invalid, "invalidated", status="invalid", why="wrong data")
    assert listing.latest_completed(loaded, tmp_path, "comparison") == newer != older
    assert listing.latest_completed(loaded, tmp_path, "baseline") == partial
    edited_path = tmp_path / "edited.yaml"  # another version of the card (same variant): none of these runs is its
    edited_path.write_text(f"parent: {SMOKE}\nmethod: {{r: 8}}\n")
    edited = load_card(edited_path)
    assert edited.card.experiment.variant == loaded.card.experiment.variant and edited.hash != loaded.hash
    assert listing.latest_completed(edited, tmp_path, "comparison") is None
    assert "another version of the card" in listing.openable_text(edited, tmp_path, "comparison", "x")


def test_the_error_lists_the_runs_a_notebook_could_open(loaded, tmp_path: Path) -> None:
    done = _completed(loaded, tmp_path)
    mine = R.new_run(loaded, tmp_path, mode="interactive")
    R.record(mine, "stage_done", stage="baseline", seconds=1.0)
    text = listing.openable_text(loaded, tmp_path, "comparison", "stage comparison needs stage training done")
    assert text.startswith("stage comparison needs stage training done; runs of smoke/tiny-lora under")
    assert f"{done.run_id} (completed, batch; stages done: {', '.join(R.STAGES)})" in text
    assert f"{mine.run_id} (running, interactive; stages done: baseline)" in text
    assert 'run_dir = "latest"' in text and f'run_dir = "{tmp_path / "smoke"}/<run_id>"' in text
    empty = listing.openable_text(loaded, tmp_path / "none", "comparison", "x")
    assert "no run of smoke/tiny-lora under" in empty and 'run_dir = "latest"' in empty
