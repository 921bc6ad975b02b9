"""The widgets where a person decides, driven through their callbacks (real ipywidgets objects, no front end)."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.card.load import load_card
from labkit.core import io
from labkit.data.checks import run_checks
from labkit.evaluate.human import RATINGS, ab_items, human_verdict
from labkit.model.loading import load_tokenizer
from labkit.show import widgets

REPO = Path(__file__).resolve().parents[3]
CATEGORIES = ("billing", "shipping", "login")


def _rows(n: int = 12) -> list[dict]:
    return [{"id": f"r{i}", "category": CATEGORIES[i % 3], "input": f"ticket {i}",
             "target": f'{{"category": "{CATEGORIES[i % 3]}"}}'} for i in range(n)]


def _predictions(tuned_right: set[int]) -> tuple[list[dict], list[dict]]:
    base = [{**r, "prediction": "no idea", "field_accuracy": 0.0} for r in _rows()]
    tuned = [{**r, "prediction": r["target"] if i in tuned_right else "wrong", "field_accuracy": float(i in tuned_right)}
             for i, r in enumerate(_rows())]
    return base, tuned


def test_ab_items_are_blind_and_seeded() -> None:
    base, tuned = _predictions(set(range(12)))
    items = ab_items(base, tuned, seed=5, per_category=2)
    assert len(items) == 6 and sorted(it["category"] for it in items) == sorted(CATEGORIES * 2)
    assert ab_items(base, tuned, seed=5, per_category=2) == items  # the recorded seed reproduces the order
    assert {it["a_is"] for it in items} == {"baseline", "tuned"}  # sides vary
    for it in items:
        assert {it["a"], it["b"]} == {"no idea", it["target"]} and "tuned" not in it["a"] + it["b"]
    orders = {tuple(it["id"] for it in ab_items(base, tuned, seed=s, per_category=2)) for s in range(6)}
    assert len(orders) > 1


def test_ab_rating_callbacks_record_ratings_and_the_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base, tuned = _predictions(tuned_right={0, 1, 2, 3, 4, 5})
    io.write_jsonl(tmp_path / "baseline" / "baseline_predictions.jsonl", base)
    io.write_jsonl(tmp_path / "comparison" / "tuned_predictions.jsonl", tuned)
    rating = widgets.ABRating(tmp_path, rater="tester", per_category=2)
    items = rating.session["items"]
    assert "item 1 of 6" in rating.view.value
    written = []
    for it in items:  # the person prefers the tuned answer whenever it is right, else calls a tie
        want = "tie" if it["automatic"] == "tie" else ("a" if it["a_is"] == "tuned" else "b")
        button = rating.buttons[("a", "b", "tie").index(want)]
        button.click()  # the widget's own callback
        written.append(io.read_jsonl(tmp_path / "comparison" / RATINGS)[-1])
    assert [w["id"] for w in written] == [it["id"] for it in items]
    assert all(w["seed"] == rating.session["seed"] and w["rater"] == "tester" for w in written)
    assert [w["a_is"] for w in written] == [it["a_is"] for it in items]
    assert all(b.disabled for b in rating.buttons) and "All 6 items rated" in rating.view.value
    verdict = human_verdict(tmp_path / "comparison" / RATINGS)
    automatic = [it["automatic"] for it in items]
    assert verdict["tuned"] == automatic.count("tuned") and verdict["tie"] == automatic.count("tie")
    assert verdict["agreement"] == 1.0 and verdict["rated"] == 6
    again = widgets.ABRating(tmp_path)  # reopened: same items and seed, nothing left to rate
    assert again.session == rating.session and again.rate("a") is None
    monkeypatch.setenv("LABKIT_BATCH", "1")  # under `labkit run`: the verdict as a static table
    assert not widgets.interactive()
    static = widgets.ab_rating(tmp_path)
    assert static.loc[0, "agreement"] == 1.0 and static.loc[0, "seed"] == rating.session["seed"]


def test_a_conversation_is_shown_to_the_rater_as_its_turns(tmp_path: Path) -> None:
    import json

    base, tuned = _predictions(tuned_right={0})
    turns = [{"role": "user", "content": "My lamp <b>broke</b>"}, {"role": "assistant", "content": "Which one?"},
             {"role": "user", "content": "The red one."}]
    for rows in (base, tuned):
        for row in rows:
            row["input"] = json.dumps(turns)
    io.write_jsonl(tmp_path / "baseline" / "baseline_predictions.jsonl", base)
    io.write_jsonl(tmp_path / "comparison" / "tuned_predictions.jsonl", tuned)
    shown = widgets.ABRating(tmp_path, per_category=1).view.value
    assert "user: My lamp &lt;b&gt;broke&lt;/b&gt;\nassistant: Which one?\nuser: The red one." in shown
    assert "&quot;role&quot;" not in shown


def test_a_rater_who_disagrees_lowers_the_agreement(tmp_path: Path) -> None:
    base, tuned = _predictions(tuned_right=set(range(12)))
    io.write_jsonl(tmp_path / "baseline" / "baseline_predictions.jsonl", base)
    io.write_jsonl(tmp_path / "comparison" / "tuned_predictions.jsonl", tuned)
    rating = widgets.ABRating(tmp_path, per_category=1)
    for it in rating.session["items"]:
        rating.rate("a" if it["a_is"] == "baseline" else "b")  # always the base model
    verdict = human_verdict(tmp_path / "comparison" / RATINGS)
    assert verdict["baseline"] == 3 and verdict["agreement"] == 0.0 and "people prefer baseline" in verdict["verdict"]


def test_sample_explorer_renders_the_chosen_row(tiny_model, tmp_path: Path) -> None:
    loaded = load_card(REPO / "params" / "smoke.yaml")
    tokenizer = load_tokenizer(tiny_model, loaded.card)
    rows = [{**r, "target": r["target"]} for r in _rows(9)]
    splits = {"train": rows[:6], "validation": rows[6:]}
    encoded, _ = run_checks(tokenizer, loaded.card, splits)
    explorer = widgets.SampleExplorer(tokenizer, splits, encoded)
    page = explorer.show("train", "shipping", 1)
    assert "r4 · train · category shipping · row 2 of 2" in page and "lk-loss" in page and "lk-mask" in page
    explorer.split.value = "validation"  # the control's own callback: back to the first row of that split
    assert explorer.row.value == 0 and "r7 · validation" in explorer.view.value and explorer.row.max == 0
    explorer.category.value = "billing"
    assert "r6 · validation · category billing" in explorer.view.value
    static = widgets.sample_explorer(tokenizer, splits, encoded)  # not in a live kernel: rows per split and category
    assert static[static["split"] == "train"]["rows"].tolist() == [2, 2, 2]
