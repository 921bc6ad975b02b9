"""The report's stopping line of a run, from its baseline and tuned metrics and its generation length."""

from __future__ import annotations

import json
from pathlib import Path

from labkit.experiment.report import _stopping


def _run(tmp_path: Path, card_limit: int | None, recorded: int | None) -> Path:
    run = tmp_path / "run"
    (run / "baseline").mkdir(parents=True)
    (run / "comparison").mkdir()
    (run / "baseline" / "baseline_metrics.json").write_text(json.dumps(
        {"n": 4, "overall": {"stop_rate": 0.25, "mean_answer_tokens": 30.5}}))
    (run / "comparison" / "tuned_metrics.json").write_text(json.dumps(
        {"n": 4, "overall": {"stop_rate": 1.0, "mean_answer_tokens": 12.0}}))
    (run / "card.yaml").write_text(f"eval: {{max_new_tokens: {'null' if card_limit is None else card_limit}}}\n")
    if recorded is not None:
        (run / "generation_length.json").write_text(json.dumps({"max_new_tokens": recorded}))
    return run


def test_the_line_names_both_models_and_the_limit(tmp_path: Path) -> None:
    assert _stopping(_run(tmp_path, 40, None)) == (
        "Stopped before max_new_tokens (40): baseline 0.25 (3 of 4 ran to the limit, 30.5 tokens on average); "
        "tuned 1.00 (0 of 4 ran to the limit, 12.0 tokens on average).")


def test_a_sized_generation_length_is_read_from_the_run(tmp_path: Path) -> None:
    assert _stopping(_run(tmp_path, None, 33)).startswith("Stopped before max_new_tokens (33): ")
