"""The strongest baseline chosen from recorded metrics, and the verdict naming it (the reference's prompt)."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.core import io
from labkit.errors import CardError
from labkit.evaluate.baseline_prompts import PromptResult, strongest
from labkit.stages.records import BASELINE_PROMPTS, baseline_named, strongest_baseline


def _result(name: str, primary: float | None, skipped: str | None = None) -> PromptResult:
    return {"name": name, "spec": name, "description": f"the {name} prompt", "stop": [], "shots": [],
            "skipped": skipped, "primary": primary, "metrics": None if skipped else {"overall": {"rougeL": primary}}}


def test_the_card_template_beats_a_badly_prompted_training_prompt() -> None:
    results = [_result("training", 0.12), _result("chat_template", None, "the tokenizer has no chat template"),
               _result("phi2", 0.31), _result("few_shot_3", 0.27)]
    assert strongest(results, "rougeL") == "phi2"
    assert strongest(results[:2], "rougeL") == "training"  # skipped prompts are never the reference


def test_ties_keep_the_first_listed_and_a_run_metric_keeps_the_first_measured() -> None:
    assert strongest([_result("training", 0.5), _result("template", 0.5)], "rougeL") == "training"
    assert strongest([_result("training", None), _result("template", None)], "train_seconds") == "training"
    assert strongest([_result("training", None), _result("template", 0.2)], "rougeL") == "template"


def test_no_measured_prompt_is_a_card_error_naming_the_reasons() -> None:
    with pytest.raises(CardError, match="chat_template: the tokenizer has no chat template.*add `training`"):
        strongest([_result("chat_template", None, "the tokenizer has no chat template")], "rougeL")


def test_the_verdict_names_the_strongest_prompt(tmp_path: Path) -> None:
    assert strongest_baseline(tmp_path) == {"name": "training", "description": "the training prompt", "measured": 1}
    decision = {"verdict": "CONFIRMED against the baseline: rougeL 0.310 → 0.420 (gain ≥ 0.05).", "confirmed": True}
    assert baseline_named(decision, strongest_baseline(tmp_path)) == decision  # one prompt: nothing to name
    results = [_result("training", 0.12), _result("phi2", 0.31), _result("chat_template", None, "none")]
    io.write_json(tmp_path / "baseline" / BASELINE_PROMPTS, {"primary_metric": "rougeL", "higher_is_better": True,
                                                             "strongest": "phi2", "prompts": results})
    which = strongest_baseline(tmp_path)
    assert which == {"name": "phi2", "description": "the phi2 prompt", "measured": 2}
    named = baseline_named(decision, which)
    assert named["verdict"] == ("CONFIRMED against the baseline (strongest of 2 prompts: phi2, the phi2 prompt): "
                                "rougeL 0.310 → 0.420 (gain ≥ 0.05).") and named["confirmed"] is True
    other = baseline_named({"verdict": "NOT JUDGED: no reference yet."}, which)["verdict"]
    assert other == "NOT JUDGED: no reference yet. Baseline: strongest of 2 prompts: phi2, the phi2 prompt."
