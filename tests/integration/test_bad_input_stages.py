"""Issue 13 through the real stage notebooks: bad data fails stage 01 before the baseline, a stage run alone ends
completed or failed (never left running), exit codes agree across commands, the budget stop is a visible status."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from conftest import REPO, labkit

from labkit.core import io


def _bad_card(tmp_path: Path) -> Path:
    """The smoke card on a data file whose validation split holds a reference that is not JSON."""
    rows = []
    for i in range(40):
        cat = ("billing", "login", "shipping", "refund")[i % 4]
        split = "train" if i < 24 else "validation" if i < 32 else "test"
        rows.append({"id": f"r{i:03d}", "text": f"ticket {i} about {cat}", "category": cat, "split": split,
                     "answer": json.dumps({"category": cat, "priority": "low", "product": "P"})})
    rows[25]["answer"] = "login, low, P"
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    card = tmp_path / "bad.yaml"
    raw = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    raw["experiment"]["id"] = "bad-data"
    raw["data"].update(source={"path": "data.jsonl"}, split={"field": "split"})
    card.write_text(yaml.safe_dump(raw))
    return card


def _status(runs: Path, experiment: str) -> dict:
    (run,) = [p for p in (runs / experiment).iterdir() if not p.name.startswith("_")]
    return io.read_json(run / "status.json") | {"dir": run}


def test_item1_bad_reference_fails_stage_01_before_the_baseline_and_item3_statuses(tmp_path: Path) -> None:
    card = _bad_card(tmp_path)
    runs = tmp_path / "runs"
    proc = labkit("stage", "baseline", str(card), runs=runs)
    assert proc.returncode == 2, proc.stderr  # bad input found inside the stage: 2, as for `labkit run`
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("labkit: error:")]
    assert f"DataError: {tmp_path / 'data.jsonl'}:26: row id 'r025' (validation split): reference is not JSON" in line
    status = _status(runs, "bad-data")
    assert status["status"] == "failed" and "row id 'r025'" in status["error"]  # not left `running`
    assert not (status["dir"] / "baseline" / "baseline_predictions.jsonl").exists()  # nothing evaluated
    assert not (status["dir"] / "data_manifest.json").exists()
    listed = labkit("runs", runs=runs)
    assert "interrupted" not in listed.stdout + listed.stderr and "failed" in listed.stdout
    again = labkit("run", str(card), runs=tmp_path / "runs2")
    assert again.returncode == 2, again.stderr  # the same exit code from `labkit run`


def test_every_failed_check_keeps_its_fix_on_the_one_error_line(tmp_path: Path) -> None:
    """Qwen3's template without enable_thinking: false, and a max_length that truncates: three encoding checks fail
    in both splits. Each is named once with its rows per split, and the line the command prints ends with the last
    check's fix (a cut line used to lose it)."""
    raw = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    raw["experiment"]["id"] = "qwen3-no-fix"
    raw["model"]["source"] = "tiny:qwen3"
    raw["data"].update(cleaning=["normalise_whitespace", "drop_empty"], max_length=40)
    card = tmp_path / "qwen3.yaml"
    card.write_text(yaml.safe_dump(raw))
    proc = labkit("stage", "baseline", str(card), runs=tmp_path / "runs")
    assert proc.returncode == 1, proc.stderr  # a failed check (labkit.errors.PreprocessingCheckFailed)
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("labkit: error:")]
    checks = line.split(" | ")
    assert len(checks) == len({c.split('" fails — ')[0].rsplit('"', 1)[-1] for c in checks}) >= 2, line  # one per check
    truncated = next(c for c in checks if "no example truncated by max_length" in c)
    assert '"no example truncated by max_length" fails — train: ' in truncated, truncated
    assert "; validation: " in truncated, truncated
    assert truncated.count("raise max_length") == 1, truncated  # the explanation once, for both splits
    assert line.split(" (executed notebook: ")[0].endswith(
        "set data.prompt.chat_template_kwargs: {enable_thinking: false}, which moves it into the prompt"), line


def test_item3_stage_alone_ends_completed(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    proc = labkit("stage", "baseline", "params/smoke.yaml", runs=runs)
    assert proc.returncode == 0, proc.stderr
    assert _status(runs, "smoke")["status"] == "completed"
    assert "(completed)" in proc.stderr
    listed = labkit("runs", runs=runs).stdout
    assert "completed" in listed and "interrupted" not in listed


def test_item3_budget_stop_is_visible_in_the_cli(tmp_path: Path) -> None:
    card = tmp_path / "budget.yaml"
    card.write_text(yaml.safe_dump({"parent": str(REPO / "params" / "smoke.yaml"), "experiment": {"variant": "budget"},
                                    "budget": {"max_minutes": 0.0001}}))
    runs = tmp_path / "runs"
    proc = labkit("run", str(card), runs=runs)
    assert proc.returncode == 0, proc.stderr
    assert "completed (budget) in" in proc.stdout and "training stopped by budget.max_minutes" in proc.stdout
    assert "completed (budget)" in labkit("runs", runs=runs).stdout
