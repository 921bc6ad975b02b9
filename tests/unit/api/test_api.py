"""The Python API: `import labkit` stays cheap, `labkit.runs()` is the registry as a DataFrame."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
from conftest import REPO

import labkit
from labkit.card.load import load_card
from labkit.core import listing
from labkit.core import runs as R


def test_import_labkit_loads_neither_the_api_nor_a_heavy_library(tmp_path: Path) -> None:
    probe = ("import sys, json, labkit\nbefore = sorted(m for m in sys.modules if m.startswith('labkit.'))\n"
             "frame = labkit.runs()\nheavy = [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]\n"
             "print(json.dumps([before, heavy, len(frame), callable(labkit.compare), 'run' in dir(labkit)]))")
    env = {**os.environ, "PYTHONPATH": str(REPO), "LABKIT_RUNS": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    before, heavy, rows, compare, listed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert before == [] and heavy == [] and rows == 0 and compare and listed


def test_runs_is_the_registry_as_a_dataframe(tmp_path: Path) -> None:
    loaded = load_card(REPO / "params" / "smoke.yaml")
    done = R.new_run(loaded, tmp_path)
    R.record(done, "completed", status="completed", summary={"confirmed": False, "decision": "inconclusive",
                                                              "field_accuracy": {"baseline": 0.2, "tuned": 0.3}})
    failed = R.new_run(loaded, tmp_path)
    R.record(failed, "failed", status="failed", stage="baseline", error="bad data")
    frame = labkit.runs(runs=tmp_path)
    assert isinstance(frame, pd.DataFrame) and list(frame.index) == [done.run_id, failed.run_id]
    assert list(frame.columns) == list(listing.FIELDS)
    assert frame.loc[done.run_id, "status"] == "completed" and frame.loc[done.run_id, "tuned"] == 0.3
    assert frame.loc[done.run_id, "result"] == "field_accuracy 0.200→0.300 inconclusive"
    assert frame.loc[failed.run_id, "error"] == "bad data"
    assert str(frame["updated"].dtype).startswith("datetime64") and frame["updated"].dt.tz is not None
    assert labkit.runs("no-such-experiment", runs=tmp_path).empty
    assert list(labkit.runs("no-such-experiment", runs=tmp_path).columns) == list(listing.FIELDS)
