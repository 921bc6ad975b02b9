"""A run's trained model loaded back (labkit.model.tuned): the adapter on its base, or the fully trained model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import REPO

from labkit.card.load import load_card
from labkit.card.schema import Full
from labkit.card.update import updated
from labkit.errors import MissingInput
from labkit.model.loading import load_model
from labkit.model.method import apply_method
from labkit.model.tuned import load_tuned


@pytest.fixture
def card():
    return load_card(REPO / "params" / "smoke.yaml").card


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([[1, 5, 9, 14, 3]])).logits


def _trained(model) -> None:
    """Move the trainable weights away from their initial values (LoRA's B starts at zero: a no-op adapter)."""
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.05)


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_the_saved_model_comes_back(card, tiny_model, tmp_path: Path, kind: str) -> None:
    if kind == "full":
        card = updated(card, {"method": Full(kind="full")})
    model = apply_method(load_model(tiny_model, card, "cpu"), card)
    _trained(model)
    model.eval()
    adapter = tmp_path / "training" / "adapter"
    model.save_pretrained(adapter)
    loaded = load_tuned(tiny_model, card, adapter, "cpu")
    assert not loaded.training and (type(loaded).__name__ == "PeftModelForCausalLM") == (kind == "lora")
    assert torch.allclose(_logits(loaded), _logits(model), atol=1e-5)
    assert not torch.allclose(_logits(loaded), _logits(load_model(tiny_model, card, "cpu")), atol=1e-3)


def test_no_adapter_is_a_missing_input(card, tiny_model, tmp_path: Path) -> None:
    with pytest.raises(MissingInput, match="adapter is missing: run the training stage of this run first"):
        load_tuned(tiny_model, card, tmp_path / "training" / "adapter", "cpu")
