"""ROUGE-1/2/L/Lsum equal rouge_score's own, stemmed and not; the length ratio; a length guardrail refutes rambling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rouge_score import rouge_scorer

from labkit.card.load import load_card
from labkit.errors import CardError
from labkit.evaluate.verdict import verdict
from labkit.scoring.bootstrap import Columns, metric, paired_intervals
from labkit.scoring.metrics import score_predictions
from labkit.scoring.rouge import length_ratio, rouge_scores, sentences

TEXT = {"kind": "text", "required_keys": [], "category_key": None}
PAIRS = [  # (reference, answer): stemming matters in the first two ("books"/"booked", "running"/"runs")
    ("Anna books a table for two on Friday. Ben confirms it for 7 pm.",
     "Anna booked tables for two on Friday and Ben confirmed 7 pm."),
    ("The runner runs every morning. She was running late today!", "The runners were running late. Every morning she runs."),
    ("Carla needs an oil change on Monday.", "Something else entirely happened here."),
    ("One sentence only", "one sentence only"),
]
CARD = Path(__file__).parents[3] / "params" / "examples" / "dialogue-summary-smollm2.yaml"


@pytest.mark.parametrize("stem", [True, False])
@pytest.mark.parametrize("reference,answer", PAIRS)
def test_rouge_equals_rouge_scores_own(reference: str, answer: str, stem: bool) -> None:
    own = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=stem)
    plain = own.score(reference, answer)
    lsum = own.score(sentences(reference), sentences(answer))["rougeLsum"]  # rouge_score reads sentences as lines
    ours = rouge_scores(answer, reference, use_stemmer=stem)
    for name in ("rouge1", "rouge2", "rougeL"):
        assert ours[name] == plain[name].fmeasure, name
    assert ours["rougeLsum"] == lsum.fmeasure


def test_stemming_changes_the_values_and_is_recorded() -> None:
    reference, answer = PAIRS[0]
    assert rouge_scores(answer, reference, True)["rouge1"] > rouge_scores(answer, reference, False)["rouge1"]
    rows = [{"id": "a", "category": None, "target": reference, "prediction": answer}]
    _, stemmed = score_predictions(rows, TEXT, use_stemmer=True)
    _, raw = score_predictions(rows, TEXT, use_stemmer=False)
    assert stemmed["rouge"]["use_stemmer"] is True and raw["rouge"]["use_stemmer"] is False
    assert stemmed["overall"]["rouge1"] > raw["overall"]["rouge1"]


def test_sentences_one_per_line() -> None:
    assert sentences("Anna wants a room. Ben agrees!  Is it Friday? yes\nNew line.") == \
        "Anna wants a room.\nBen agrees!\nIs it Friday?\nyes\nNew line."
    # Lsum differs from L when the sentence order differs
    reference, answer = PAIRS[1]
    scores = rouge_scores(answer, reference)
    assert scores["rougeLsum"] != scores["rougeL"]


def test_mean_length_ratio_worked_example() -> None:
    rows = [{"id": "a", "category": None, "target": "one two three four", "prediction": "one two"},  # 2/4 = 0.5
            {"id": "b", "category": None, "target": "one two", "prediction": "one two three four five six"},  # 3.0
            {"id": "c", "category": None, "target": "a b c", "prediction": "a b c"}]  # 1.0
    scored, metrics = score_predictions(rows, TEXT)
    assert [r["length_ratio"] for r in scored] == [0.5, 3.0, 1.0]
    assert metrics["overall"]["mean_length_ratio"] == pytest.approx(1.5)
    assert length_ratio("x y", "") == 2.0  # a reference without words counts as one word


def _answers(answers: list[str]) -> tuple[list[dict], dict]:
    refs = ["Anna wants a table for two on Friday. Ben books it for 7 pm.",
            "Carla needs an oil change on Monday. David takes the car at 9 am.",
            "Elena asks to borrow Farid's drill on Sunday. Farid lends it at noon."]
    rows = [{"id": f"r{i}", "category": "x", "target": t, "prediction": a} for i, (t, a) in enumerate(zip(refs, answers))]
    return score_predictions(rows, TEXT)


def test_a_length_guardrail_refutes_a_rambling_model() -> None:
    card = load_card(CARD).card
    base_rows, base = _answers(["Anna calls.", "A car.", "A drill."])
    ramble = " Also the weather was nice and they talked about many other things at great length for a while."
    refs_words = ["Anna wants a table for two on Friday. Ben books it for 7 pm.",
                  "Carla needs an oil change on Monday. David takes the car at 9 am.",
                  "Elena asks to borrow Farid's drill on Sunday. Farid lends it at noon."]
    rambling_rows, rambling = _answers([r + ramble * 2 for r in refs_words])  # every reference word, and much more
    assert rambling["overall"]["rougeL"] - base["overall"]["rougeL"] >= 0.15  # the primary metric alone would pass
    decision = verdict(card, base, rambling, reference_rows=base_rows, tuned_rows=rambling_rows)
    assert decision["primary"]["ok"] and not decision["confirmed"]
    failed = [r for r in decision["guardrails"] if not r["ok"]]
    assert [r["metric"] for r in failed] == ["mean_length_ratio"] and "> max 1.5" in failed[0]["why"]
    concise_rows, concise = _answers(refs_words)
    assert verdict(card, base, concise, reference_rows=base_rows, tuned_rows=concise_rows)["confirmed"]


def test_rouge_bootstrap_reproduces_the_metrics_and_pairs() -> None:
    base_rows, base = _answers(["Anna calls.", "A car.", "A drill."])
    tuned_rows, tuned = _answers(["Anna wants a table on Friday.", "Carla needs an oil change.", "Farid lends a drill."])
    ones = np.ones((1, 3))
    cols = Columns(tuned_rows, ["r0", "r1", "r2"])
    for name in ("rouge1", "rouge2", "rougeL", "rougeLsum", "mean_length_ratio"):
        assert metric(ones, cols, name)[0] == pytest.approx(tuned["overall"][name], abs=1e-12), name
    out = paired_intervals(base_rows, tuned_rows, ["rougeL", "mean_length_ratio"], resamples=200)
    diff = out["overall"]["rougeL"]["diff"]
    assert diff["value"] == pytest.approx(tuned["overall"]["rougeL"] - base["overall"]["rougeL"])
    assert diff["low"] <= diff["value"] <= diff["high"]


def test_mean_length_ratio_is_a_guardrail_with_bounds_only(tmp_path: Path) -> None:
    text = CARD.read_text()
    primary = tmp_path / "primary.yaml"
    primary.write_text(text.replace("primary_metric: rougeL", "primary_metric: mean_length_ratio"))
    with pytest.raises(CardError, match="no good direction"):
        load_card(primary)
    drop = tmp_path / "drop.yaml"
    drop.write_text(text.replace("{metric: mean_length_ratio, min: 0.5, max: 1.5}", "{metric: mean_length_ratio, max_drop: 0.1}"))
    with pytest.raises(CardError, match="max_drop"):
        load_card(drop)
    for name in ("rouge1", "rouge2", "rougeLsum"):  # every ROUGE is a primary metric
        other = tmp_path / f"{name}.yaml"
        other.write_text(text.replace("primary_metric: rougeL", f"primary_metric: {name}"))
        assert load_card(other).card.experiment.target.primary_metric == name
