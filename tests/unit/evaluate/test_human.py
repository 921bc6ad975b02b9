"""The blind A/B items work on the rows every kind of card scores: a label card, a JSON card (with and without a
category to predict) and a ROUGE (text) card, with the one per-example score key (`labkit.scoring.metrics.score_key`)
the example tables use too."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.card.load import load_card
from labkit.evaluate.human import ab_items
from labkit.scoring.metrics import score_key, score_predictions
from labkit.stages import comparison

REPO = Path(__file__).resolve().parents[3]
CARDS = {  # card → (kind, score key, {category: (reference, a right answer, a wrong answer)})
    "examples/own-data.yaml": ("label", "correct", {"positive": ("positive", "positive", "negative"),
                                                    "negative": ("negative", "negative", "neutral")}),
    "quickstart.yaml": ("json", "correct", {  # a category key: whether the category is right comes first
        "billing": ('{"category": "billing", "priority": "high", "product": "Orbit Phone"}',
                    '{"category": "billing", "priority": "high", "product": "Orbit Phone"}',
                    '{"category": "shipping", "priority": "low", "product": "Nova Tab"}'),
        "shipping": ('{"category": "shipping", "priority": "low", "product": "Nova Tab"}',
                     '{"category": "shipping", "priority": "low", "product": "Nova Tab"}', "no idea")}),
    "examples/dialogue-summary-smollm2.yaml": ("text", "rougeL", {
        "travel": ("Ana books a train to Porto for Friday.", "Ana books a train to Porto for Friday.",
                   "Bo asks about the weather."),
        "work": ("Sam moves the meeting to Monday.", "Sam moves the meeting to Monday.", "They talk.")}),
}
CARDS["quickstart.yaml#no-category"] = ("json", "field_accuracy", CARDS["quickstart.yaml"][2])


def _scored(card: str, tuned_right: bool) -> tuple[list[dict], list[dict]]:
    """(base rows, tuned rows) scored with the card's own target format: the base model is wrong on every row, the
    tuned one right (or wrong too)."""
    fmt = load_card(REPO / "params" / card.split("#")[0]).card.data.target_format.model_dump()
    rows = [{"id": f"{cat}-{i}", "category": None if "#no-category" in card else cat, "input": f"example {i} of {cat}",
             "target": target} for cat, (target, _, _) in CARDS[card][2].items() for i in range(4)]
    answers = {target: (right, wrong) for target, right, wrong in CARDS[card][2].values()}
    base, _ = score_predictions([{**r, "prediction": answers[r["target"]][1]} for r in rows], fmt)
    tuned, _ = score_predictions([{**r, "prediction": answers[r["target"]][0 if tuned_right else 1]}
                                  for r in rows], fmt)
    return base, tuned


@pytest.mark.parametrize("card", sorted(CARDS))
def test_ab_items_on_the_rows_of_each_kind_of_card(card: str) -> None:
    kind, key, _ = CARDS[card]
    base, tuned = _scored(card, tuned_right=True)
    assert score_key(tuned) == key  # the per-example score of this kind of target
    items = ab_items(base, tuned, seed=3, per_category=2)
    categories = {None} if "#no-category" in card else set(CARDS[card][2])
    assert len(items) == 2 * len(categories) and {it["category"] for it in items} == categories
    assert all(it["automatic"] == "tuned" for it in items), kind  # right beats wrong on that score
    assert {it["a_is"] for it in items} <= {"baseline", "tuned"}
    same_base, same = _scored(card, tuned_right=False)
    assert {it["automatic"] for it in ab_items(same_base, same, seed=3, per_category=2)} == {"tie"}


@pytest.mark.parametrize("card", sorted(CARDS))
def test_the_example_tables_use_the_same_score(card: str) -> None:
    base, tuned = _scored(card, tuned_right=True)
    key = CARDS[card][1]
    table = comparison.examples_table(base, tuned, n=3)
    assert len(table) == 3 and all(f"{key} (base→tuned)" in row for row in table)


def test_rows_without_a_score_are_refused() -> None:
    with pytest.raises(KeyError, match="no per-example score"):
        score_key([{"id": "a", "prediction": "x", "rouge_l": 1.0}])
