"""The Python API end to end on the smoke card: `labkit.run` in this process (as a notebook cell would call it), then
`labkit.runs()`, `labkit.compare()` and `labkit.stage(..., "latest")` on the run it made, which stays unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
from conftest import REPO

import labkit
from labkit.errors import MissingInput

SMOKE = "params/smoke.yaml"


def _files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_run_then_runs_compare_and_the_latest_stage(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("LABKIT_RUNS", str(tmp_path))
    monkeypatch.delenv("LABKIT_BATCH", raising=False)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    made = labkit.run(SMOKE, runs=tmp_path)
    # the kernels' variables are put back: the calling notebook keeps its progress bars and interactive stages
    assert not {"LABKIT_BATCH", "TQDM_DISABLE", "LABKIT_STAGE", "LABKIT_STEP_SECONDS"} & set(os.environ)
    assert isinstance(made, pd.DataFrame) and len(made) == 1
    (row,) = made.to_dict("records")
    assert row["status"] == "completed" and row["stages_done"] == ["baseline", "preprocessing", "parameter_check",
                                                                    "training", "comparison"]
    assert row["metric"] == "field_accuracy" and row["decision"] and Path(row["dir"]).is_dir()
    assert row["result"].startswith("field_accuracy ")
    registry = labkit.runs(runs=tmp_path)
    assert list(registry.index) == [row["run_id"]] and registry.loc[row["run_id"], "tuned"] == row["tuned"]

    comparison = labkit.compare("smoke", runs=tmp_path, resamples=200)
    assert list(comparison.table.index) == [row["run_id"]] and "verdict" in comparison.table
    values = comparison.values.loc[row["run_id"]]
    assert values["primary_metric"] == "field_accuracy" and abs(values["value"] - row["tuned"]) < 1e-3
    assert values["low"] <= values["value"] <= values["high"]
    assert "<table" in comparison._repr_html_()

    before = _files(tmp_path)
    stage = labkit.stage("comparison", SMOKE)  # "latest": the run just made, for review
    assert stage.run.run_id == row["run_id"] and stage.review is not None
    assert stage.read("comparison", "verdict.json")["primary"]["metric"] == "field_accuracy"
    assert _files(tmp_path) == before
    try:
        labkit.stage("comparison", "params/quickstart.yaml")
    except MissingInput as exc:  # no run of that card: the message says how to set run_dir
        assert 'run_dir = "latest"' in str(exc) and "no run of" in str(exc)
    else:
        raise AssertionError("labkit.stage opened a run of a card that has none")
