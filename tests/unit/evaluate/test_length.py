"""The generation length: sized once from the train and validation references, recorded in the run, used by every
later reader; the card's own value wins; generation refuses an unsized card."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO

from labkit.card.load import load_card
from labkit.core.run_card import resolved_card
from labkit.evaluate import length
from labkit.evaluate.generation import generate_answers
from labkit.model.loading import load_tokenizer


def test_sized_recorded_once_and_read_back(tiny_model, tmp_path) -> None:
    card = load_card(REPO / "params" / "examples" / "dialogue-summary-smollm2.yaml").card
    assert card.eval.max_new_tokens is None
    tokenizer = load_tokenizer(tiny_model, card)
    train = [{"target": "Anna wants a table on Friday. Ben books it for 7 pm."}] * 19
    validation = [{"target": " ".join(["word"] * 60)}]
    assert resolved_card(card, tmp_path) is card  # nothing recorded yet
    found = length.record(tmp_path, tokenizer, train, validation)
    expected = length.size_generation(tokenizer, [r["target"] for r in train + validation])
    assert found == expected and (tmp_path / length.FILE).exists()
    assert found["references"] == 20 and found["p95_tokens"] < found["longest_tokens"]  # the one long answer is the 5 %
    assert length.record(tmp_path, tokenizer, train[:1], []) == found  # recorded once: a second call reads it back
    sized = resolved_card(card, tmp_path)
    assert sized.eval.max_new_tokens == found["max_new_tokens"] and card.eval.max_new_tokens is None
    assert f"**{found['max_new_tokens']}**" in length.statement(card, tmp_path)
    run = tmp_path / "run"  # a run folder: its archived card.yaml leaves the length out, as the card does
    run.mkdir()
    (run / length.FILE).write_text((tmp_path / length.FILE).read_text())
    (run / "card.yaml").write_text(yaml.safe_dump({"eval": {"max_new_tokens": None}}))
    assert length.statement(sized, run) == length.statement(card, run)  # the run's resolved card says it was sized
    assert "sized from the data" in length.statement(sized, run)
    fixed = load_card(REPO / "params" / "quickstart.yaml").card
    assert resolved_card(fixed, tmp_path).eval.max_new_tokens == 40  # the card's value wins
    assert "set by the card" in length.statement(fixed, tmp_path)


def test_generation_refuses_an_unsized_card(tiny_model) -> None:
    card = load_card(REPO / "params" / "examples" / "dialogue-summary-smollm2.yaml").card
    with pytest.raises(ValueError, match="eval.max_new_tokens is unset"):
        generate_answers(object(), object(), card, [])
