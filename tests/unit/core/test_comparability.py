"""`labkit.core.comparability`: whether two runs trained comparably, read from the files stage 04 writes."""

from __future__ import annotations

from pathlib import Path

import yaml

from labkit.core import io
from labkit.core.comparability import budget_note, comparable, marked, training_steps


def _run(tmp_path: Path, name: str, steps: int, planned: int, stopped: bool, is_protocol: bool | None = None) -> Path:
    folder = tmp_path / name
    budget = {"max_minutes": 20} | ({} if is_protocol is None else {"is_protocol": is_protocol})
    (folder / "training").mkdir(parents=True)
    (folder / "card.yaml").write_text(yaml.safe_dump({"budget": budget}))
    io.write_json(folder / "training" / "outcome.json", {"steps": steps, "planned_steps": planned,
                                                         "budget_exhausted": stopped})
    return folder


def test_a_budget_stopped_run_is_not_comparable_with_a_run_of_other_steps(tmp_path: Path) -> None:
    short, full = _run(tmp_path, "r4", 8, 24, True), _run(tmp_path, "r16", 24, 24, False)
    got = comparable(short, full)
    assert got["comparable"] is False and got["why"].startswith("8/24 steps vs 24/24 (budget-stopped")
    assert (got["a"], got["b"]) == ("8/24", "24/24")
    assert comparable(full, short)["why"].startswith("24/24 steps vs 8/24")
    assert budget_note(training_steps(short)) == "budget-stopped at 8/24 steps"
    assert budget_note(training_steps(full)) == ""


def test_planned_differences_and_the_budget_as_protocol_stay_comparable(tmp_path: Path) -> None:
    one, two = _run(tmp_path, "e1", 12, 12, False), _run(tmp_path, "e2", 24, 24, False)
    assert comparable(one, two) == {"comparable": True, "why": "", "a": "12/12", "b": "24/24"}  # by design
    same = _run(tmp_path, "same", 8, 24, True), _run(tmp_path, "same2", 8, 16, True)
    assert comparable(*same)["comparable"] is True  # both stopped at the same step
    protocol = _run(tmp_path, "p1", 8, 24, True, True), _run(tmp_path, "p2", 24, 24, False, True)
    assert comparable(*protocol)["comparable"] is True
    half = _run(tmp_path, "h1", 8, 24, True, True), _run(tmp_path, "h2", 24, 24, False, False)
    assert comparable(*half)["comparable"] is False  # only when both cards say so


def test_old_runs_take_the_planned_steps_from_stage_03(tmp_path: Path) -> None:
    folder = tmp_path / "old"
    (folder / "training").mkdir(parents=True)
    (folder / "parameter_check").mkdir()
    io.write_json(folder / "training" / "outcome.json", {"steps": 3, "budget_exhausted": True})
    io.write_json(folder / "parameter_check" / "fit.json", {"plan": {"steps": 9}})
    assert training_steps(folder) == {"steps": 3, "planned": 9, "budget_stopped": True, "budget_is_protocol": False}
    assert training_steps(tmp_path / "never-trained")["steps"] is None


def test_a_verdict_says_its_budget_stop_and_its_step_mismatch(tmp_path: Path) -> None:
    short, full = _run(tmp_path, "r4", 8, 24, True), _run(tmp_path, "r16", 24, 24, False)
    decision = {"decision": "not confirmed", "confirmed": False, "verdict": "NOT CONFIRMED against variant r16: x."}
    text = marked(decision, short, full)["verdict"]
    assert "Budget-stopped at 8/24 steps (budget.max_minutes)" in text
    assert "Not comparable with its reference run: 8/24 steps vs 24/24" in text
    assert marked(decision, full) is decision  # nothing to say
    assert set(marked(decision, short)) == set(decision)  # verdict.json keeps the Verdict's keys
