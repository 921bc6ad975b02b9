"""Blind A/B between two variants' answers (two run folders of one experiment, scored with the quickstart card's own
JSON target format), driven through the real widget's buttons: the rater never sees the reference nor which run is
A before rating; every rating records the blind order, the seed and the answers' sources (run ids); the verdict
counts wins, losses and ties with an interval; the references are revealed once every item is rated."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from labkit.card.load import load_card
from labkit.core import io
from labkit.errors import MissingInput, UsageError
from labkit.evaluate.ab_session import ab_files, ab_session, human_verdicts
from labkit.evaluate.human import ab_items, human_verdict
from labkit.scoring.metrics import score_predictions
from labkit.show.widgets import ABRating, ab_rating

CATEGORIES = ("billing", "shipping", "login")


def _run(root: Path, variant: str, right: bool, stamp: str = "220000") -> Path:
    """A completed-looking run folder: its archived card's variant and stage 05's scored answers. The right answers
    are the reference with its keys in another order (right on every field, never the reference's own text)."""
    fmt = load_card(REPO / "params" / "quickstart.yaml").card.data.target_format.model_dump()
    rows = []
    for i in range(12):
        cat = CATEGORIES[i % 3]
        target = {"category": cat, "priority": "high", "product": f"Orbit {i}"}
        answer = dict(reversed(list(target.items()))) if right else {"category": "other", "priority": "low"}
        rows.append({"id": f"t{i}", "category": cat, "input": f"ticket {i}: my {cat} is broken",
                     "target": json.dumps(target), "prediction": json.dumps(answer)})
    scored, _ = score_predictions(rows, fmt)
    run = root / "ticket-triage" / f"{variant}-20261202T{stamp}Z-0000{len(variant):04d}"
    (run / "comparison").mkdir(parents=True)
    (run / "card.yaml").write_text(yaml.safe_dump({"experiment": {"id": "ticket-triage", "variant": variant}}))
    io.write_jsonl(run / "comparison" / "tuned_predictions.jsonl", scored)
    return run


def test_two_variants_rated_blind_with_the_order_and_sources_recorded(tmp_path: Path) -> None:
    r4, r16 = _run(tmp_path, "lora-r4", right=False), _run(tmp_path, "lora-r16", right=True)
    rating = ABRating(r16, rater="tester", per_category=2, against=r4)
    items = rating.session["items"]
    assert rating.session["sides"] == ["lora-r4", "lora-r16"]
    assert rating.session["sources"] == {"lora-r4": {"run": r4.name, "answers": "comparison/tuned_predictions.jsonl"},
                                         "lora-r16": {"run": r16.name, "answers": "comparison/tuned_predictions.jsonl"}}
    # the recorded (fresh) seed reproduces the blind order and sides; with 6 items, one side only is a 1-in-32 draw
    first, second = (io.read_jsonl(r / "comparison" / "tuned_predictions.jsonl") for r in (r4, r16))
    assert items == ab_items(first, second, rating.session["seed"], 2, ("lora-r4", "lora-r16"))
    assert len(items) == 6 and all({it["a_is"], it["b_is"]} == {"lora-r4", "lora-r16"} for it in items)
    assert all(it["automatic"] == "lora-r16" for it in items)
    written = []
    for i, item in enumerate(items):
        seen = rating.view.value
        assert f"item {i + 1} of 6" in seen and item["input"] in seen
        assert item["target"] not in seen and "reference" not in seen.lower()  # graded blind, not against the reference
        assert not re.search(r"r4|r16|ticket-triage/", seen), seen  # nor told which run is A
        choice = "tie" if i == 0 else ("a" if item["a_is"] == "lora-r16" else "b")
        rating.buttons[("a", "b", "tie").index(choice)].click()  # the widget's own callback
        written.append(io.read_jsonl(rating.path)[-1])
    assert rating.path == r16 / "comparison" / f"human_ratings_vs_{r4.name}.jsonl"
    assert [(w["id"], w["position"], w["a_is"], w["b_is"]) for w in written] == [
        (it["id"], it["position"], it["a_is"], it["b_is"]) for it in items]
    assert all(w["seed"] == rating.session["seed"] and w["sources"] == rating.session["sources"]
               and w["sides"] == ["lora-r4", "lora-r16"] for w in written)
    assert [w["preferred"] for w in written] == ["tie"] + ["lora-r16"] * 5
    verdict = human_verdict(rating.path)
    assert (verdict["wins"], verdict["losses"], verdict["ties"], verdict["rated"]) == (5, 0, 1, 6)
    assert verdict["lora-r16"] == 5 and verdict["counts"] == {"lora-r4": 0, "lora-r16": 5, "tie": 1}
    share = verdict["share"]
    assert share["value"] == 1.0 and 0.4 < share["low"] < 0.7 and share["high"] == pytest.approx(1.0)  # Wilson, n = 5
    assert verdict["verdict"].startswith("people prefer lora-r16: lora-r16 5, lora-r4 0, tie 1 of 6 rated")
    assert "[95% CI" in verdict["verdict"] and verdict["agreement"] == pytest.approx(5 / 6)
    done = rating.view.value  # finished: the references and the sources may be seen now
    assert "All 6 items rated" in done and all(it["target"] in done.replace("&quot;", '"') for it in items)
    assert "lora-r4" in done and all(b.disabled for b in rating.buttons)
    again = ABRating(r16, against=r4)  # reopened: the same items and seed, nothing left to rate
    assert again.session == rating.session and again.rate("a") is None
    assert [v["file"] for v in human_verdicts(r16)] == [rating.path.name]
    static = ab_rating(r16, against=r4)  # outside a live notebook: the verdict as a table, by variant
    assert static.loc[0, "lora-r16"] == 5 and static.loc[0, "lora-r4"] == 0 and static.loc[0, "seed"] == verdict["seed"]
    for path in ab_files(r16, r4):  # the session and ratings name runs, never a machine path
        assert str(tmp_path) not in path.read_text()


def test_runs_of_one_variant_are_named_by_run_and_missing_answers_are_named(tmp_path: Path) -> None:
    first, second = _run(tmp_path / "a", "lora-r16", right=False), _run(tmp_path / "b", "lora-r16", right=True, stamp="230000")
    session = ab_session(second, per_category=1, against=first)
    assert session["sides"] == [first.name, second.name]
    assert {it["automatic"] for it in session["items"]} == {second.name}
    empty = tmp_path / "ticket-triage" / "failed-run"
    empty.mkdir(parents=True)
    with pytest.raises(MissingInput, match="failed-run: no comparison/tuned_predictions.jsonl"):
        ab_session(second, against=empty)
    with pytest.raises(MissingInput, match="no baseline/baseline_predictions.jsonl"):
        ab_session(second)  # base against tuned needs stage 01's answers
    with pytest.raises(UsageError, match="against itself"):
        ab_session(second, against=second)
