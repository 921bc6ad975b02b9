"""Budget honesty end to end: two real variants under one time budget, one of them stopped by it.

`full` trains its 2 steps well inside budget.max_minutes; `long` plans 3000 steps and is stopped by the same budget.
The stopped run warns as soon as its ETA exceeds the budget left (terminal, progress file, notebook 04), ends its
`labkit run` output with its verdict line saying where it stopped, and `labkit compare` and the report flag the two
runs not comparable (their completed steps differ).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from conftest import REPO, labkit

from labkit.core.io import read_jsonl


def _card(tmp_path: Path, variant: str, max_steps: int, every: int) -> Path:
    path = tmp_path / f"{variant}.yaml"
    path.write_text(yaml.safe_dump({"parent": str(REPO / "params" / "smoke.yaml"),
                                    "experiment": {"id": "budget", "variant": variant},
                                    "train": {"max_steps": max_steps, "save_steps": every, "eval_steps": every},
                                    "budget": {"max_minutes": 0.5}}))
    return path


def test_a_budget_stopped_variant_warns_says_so_and_is_not_comparable(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    full = labkit("run", str(_card(tmp_path, "full", 2, 2)), runs=runs)
    assert full.returncode == 0, full.stdout[-3000:] + full.stderr[-3000:]
    last = full.stdout.strip().splitlines()[-1]
    assert last.startswith("verdict budget/full: ") and "budget-stopped" not in last
    assert re.search(r": (CONFIRMED|INCONCLUSIVE|NOT CONFIRMED|NOT JUDGED) · ", last), last

    long = labkit("run", str(_card(tmp_path, "long", 3000, 1000)), runs=runs)
    assert long.returncode == 0, long.stdout[-3000:] + long.stderr[-3000:]
    (run,) = (runs / "budget").glob("long-*")
    outcome = json.loads((run / "training" / "outcome.json").read_text())
    steps = outcome["steps"]
    assert outcome["budget_exhausted"] and outcome["planned_steps"] == 3000 and 0 < steps < 3000
    assert "budget.max_minutes 0.5" in outcome["budget_warning"] and "budget.is_protocol" in outcome["budget_warning"]
    # the warning as a progress event (what `labkit runs --follow` prints), on the terminal, in notebook 04
    warnings = [e for e in read_jsonl(run / "progress.jsonl") if e.get("phase") == "budget"]
    assert len(warnings) == 1 and warnings[0]["stage"] == "training" and "exceeds" in warnings[0]["warning"]
    assert "training: warning: ETA" in long.stdout and "raise budget.max_minutes" in long.stdout
    assert "labkit: warning: ETA" in (run / "notebooks" / "04_training.ipynb").read_text()
    assert "completed (budget)" in long.stdout
    last = long.stdout.strip().splitlines()[-1]
    assert last.startswith("verdict budget/long: ") and last.endswith(f"budget-stopped at {steps}/3000 steps"), last
    assert "completed (budget)" in labkit("runs", runs=runs).stdout

    compared = labkit("compare", "budget", "--resamples", "200", runs=runs)
    assert compared.returncode == 0, compared.stderr[-3000:]
    lines = compared.stdout.splitlines()
    assert max(len(line) for line in lines[:-2]) <= 120, compared.stdout  # the table; then the two file paths
    assert f"NO: 2/2 vs {steps}/3000 steps" in compared.stdout and "completed (budget)" in compared.stdout
    assert f"budget-stopped at {steps}/3000 steps" in compared.stdout
    comparison = json.loads((runs / "budget" / "_report" / "comparison.json").read_text())
    by_variant = {r["variant"]: r for r in comparison["runs"]}
    assert by_variant["long"]["budget_note"] == f"budget-stopped at {steps}/3000 steps"
    assert by_variant["full"]["budget_note"] == "" and by_variant["long"]["comparable"] is True  # same protocol
    assert f"Budget-stopped at {steps}/3000 steps" in by_variant["long"]["verdict"]
    (pair,) = comparison["pairs"]
    assert pair["steps"]["comparable"] is False and pair["steps"]["why"].startswith(f"2/2 steps vs {steps}/3000")
    index = (runs / "budget" / "_report" / "index.html").read_text()
    assert f"NOT COMPARABLE: 2/2 steps vs {steps}/3000" in index and f"Budget-stopped at {steps}/3000" in index
