"""params/examples/own-data.yaml: the "my data, my model" card inherits nothing from the tickets and its data prepares."""

from __future__ import annotations

from pathlib import Path

from labkit.card.load import load_card
from labkit.data.prepare import checked_splits
from labkit.model.loading import load_tokenizer

CARD = Path(__file__).resolve().parents[3] / "params" / "examples" / "own-data.yaml"


def test_own_data_card_stands_alone() -> None:
    loaded = load_card(CARD)
    card = loaded.card
    assert loaded.chain == [CARD] and "parent" not in CARD.read_text()
    assert card.model.source.startswith("hf:") and card.model.source.endswith("@" + card.model.revision)
    assert card.data.source.path == str(CARD.parent / "own-data.jsonl") and card.data.target_format.kind == "label"
    assert "ticket" not in CARD.read_text().lower() and "json" not in card.data.prompt.system.lower()


def test_own_data_prepares_with_every_check(tiny_model) -> None:
    card = load_card(CARD).card
    derived, _ = checked_splits(card, load_tokenizer(tiny_model, card))
    assert derived.rows_loaded == 45
    assert {row["category"] for row in derived.splits["validation"]} == {"positive", "negative", "neutral"}


def test_the_support_chat_example_prepares_its_conversations(tiny_model) -> None:
    import json

    card = load_card(CARD.parent / "support-chat.yaml").card
    assert card.data.prompt.conversation and card.data.fields.input == card.data.fields.target == "messages"
    derived, encoded = checked_splits(card, load_tokenizer(tiny_model, card))
    assert derived.rows_loaded == 100 and derived.leakage["cross_split_pairs"] == 0
    rows = [row for rows in derived.splits.values() for row in rows]
    assert all(json.loads(row["input"])[-1]["role"] == "user" and "order" in row["target"] for row in rows)
    assert {row["category"] for row in derived.splits["validation"]} == {"delivery", "return", "warranty"}
    assert all(e.loss_tokens < len(e.input_ids) / 2 for e in encoded["train"])  # the loss on the last answer alone
