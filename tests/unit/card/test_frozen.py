"""A validated card is frozen and hashable; `updated` gives a validated changed copy and leaves the card as it was."""

from __future__ import annotations

import pytest
from conftest import REPO
from pydantic import ValidationError

from labkit.card.load import load_card
from labkit.card.schema import Full
from labkit.card.update import updated
from labkit.errors import CardError

SMOKE = REPO / "params" / "smoke.yaml"
HUB = REPO / "params" / "examples" / "dialogsum-phi2-qlora-sft.yaml"  # a hub data set with its own splits


def test_a_card_and_its_sections_are_frozen() -> None:
    loaded = load_card(SMOKE)
    with pytest.raises(ValidationError, match="frozen"):
        loaded.card.train.lr = 0.5  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        loaded.card.method = Full(kind="full")  # type: ignore[misc]
    with pytest.raises(AttributeError):
        loaded.card = loaded.card  # type: ignore[misc]  # LoadedCard is frozen too


def test_equal_cards_hash_alike_and_a_change_changes_the_hash() -> None:
    a, b = load_card(SMOKE).card, load_card(SMOKE).card
    assert a is not b and a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    changed = updated(a, {"train.lr": a.train.lr * 2})
    assert changed != a and hash(changed) != hash(a)
    assert hash(a.data) == hash(b.data) and hash(a.experiment.guardrails[0]) == hash(b.experiment.guardrails[0])


def test_updated_returns_a_validated_copy() -> None:
    card = load_card(SMOKE).card
    lr = card.train.lr
    new = updated(card, {"train.lr": 0.5, "train.max_steps": 3, "method": Full(kind="full"), "eval.batch_size": 2})
    assert (new.train.lr, new.train.max_steps, new.method.kind, new.eval.batch_size) == (0.5, 3, "full", 2)
    assert card.train.lr == lr and card.method.kind != "full"  # the original is untouched
    assert new.data == card.data and new.experiment == card.experiment
    guarded = updated(card, {"experiment.guardrails.0.max_drop": 0.25})
    assert guarded.experiment.guardrails[0].max_drop == 0.25


def test_updated_refuses_what_the_schema_refuses() -> None:
    card = load_card(SMOKE).card
    with pytest.raises(CardError, match=r"^train\.lr: .*greater than 0 \(changing train\.lr\)$"):
        updated(card, {"train.lr": -1})
    with pytest.raises(CardError, match=r"train\.learning_rate"):
        updated(card, {"train.learning_rate": 0.1})
    with pytest.raises(CardError, match="train.beta: applies to train.trainer dpo or orpo only"):
        updated(card, {"train.beta": 0.1})  # a card-level rule, checked again on the copy


def test_updated_keeps_keys_the_card_left_out_unset() -> None:
    card = load_card(HUB).card
    assert "split" not in card.data.source.model_fields_set
    # a hub source with from_source refuses data.source.split only when the card sets it: the copy must not set it
    new = updated(card, {"train.lr": 1e-4})
    assert "split" not in new.data.source.model_fields_set and new.data.source == card.data.source
