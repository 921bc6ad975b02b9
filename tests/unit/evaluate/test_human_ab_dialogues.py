"""The whole blind A/B rating (stage 05's widget: the session, every item rated, the human verdict with Cohen's kappa
from scikit-learn) on the rows of the dialogue-summary card: a text target scored by ROUGE, whose rows carry
`rougeL` (the A/B items once looked for `rouge_l` and crashed on every ROUGE card)."""

from __future__ import annotations

from pathlib import Path

from conftest import REPO

from labkit.card.load import load_card
from labkit.core import io
from labkit.data.dialogues import generate_dialogues
from labkit.evaluate.human import RATINGS, human_verdict
from labkit.scoring.metrics import score_key, score_predictions
from labkit.show.widgets import ABRating, ab_rating

CARD = REPO / "params" / "examples" / "dialogue-summary-smollm2.yaml"


def _run_dir(tmp_path: Path) -> Path:
    """A run folder with stage 01's and stage 05's predictions on the card's own rows: the base model answers with
    the dialogue's first line, the tuned model with the reference summary (a better ROUGE-L on every row)."""
    card = load_card(CARD).card
    fields, source = card.data.fields, card.data.source
    records, _ = generate_dialogues(rows=40, seed=source.seed)
    rows = [{"id": r[fields.id], "category": r[fields.category], "input": r[fields.input], "target": r[fields.target]}
            for r in records]
    fmt = card.data.target_format.model_dump()
    stem = card.eval.rouge.use_stemmer
    base, _ = score_predictions([{**r, "prediction": r["input"].splitlines()[0]} for r in rows], fmt, stem)
    tuned, _ = score_predictions([{**r, "prediction": r["target"]} for r in rows], fmt, stem)
    run = tmp_path / "run"
    io.write_jsonl(run / "baseline" / "baseline_predictions.jsonl", base)
    io.write_jsonl(run / "comparison" / "tuned_predictions.jsonl", tuned)
    return run


def test_the_ab_rating_runs_on_the_dialogue_summary_rows(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    assert score_key(io.read_jsonl(run / "comparison" / "tuned_predictions.jsonl")) == "rougeL"
    rating = ABRating(run, rater="tester", per_category=2)
    items = rating.session["items"]
    categories = {r["category"] for r in io.read_jsonl(run / "comparison" / "tuned_predictions.jsonl")}
    assert len(items) == 2 * len(categories) and all(it["automatic"] == "tuned" for it in items)
    for i, item in enumerate(items):  # the rater picks the tuned answer, except on the last item: a tie
        choice = "tie" if i == len(items) - 1 else ("a" if item["a_is"] == "tuned" else "b")
        assert rating.rate(choice)["preferred"] == ("tie" if choice == "tie" else "tuned")
    assert rating.rate("a") is None and "All" in rating.view.value  # every item rated
    verdict = human_verdict(run / "comparison" / RATINGS)
    assert verdict["rated"] == len(items) and verdict["tuned"] == len(items) - 1 and verdict["tie"] == 1
    assert verdict["agreement"] == (len(items) - 1) / len(items)
    assert verdict["kappa"] == 0.0  # the automatic metric always says tuned: agreement no better than chance
    assert ab_rating(run).__class__.__name__ != "VBox"  # outside a live notebook: the verdict table
