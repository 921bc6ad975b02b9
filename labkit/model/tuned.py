"""A run's trained model: the base model with the run's adapter on top, or the fully trained model (method full).

Stage 05 and `labkit final` load it the same way, so the test split measures the model the validation split did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from peft import PeftModel

from labkit.card.schema import Card
from labkit.errors import MissingInput
from labkit.model.loading import load_model
from labkit.model.sources import ResolvedModel

# peft takes seconds to import (and loads torch and bitsandbytes): imported inside load_tuned while `labkit` commands
# import the library at start; it moves to the top once the command line imports each command lazily


def load_tuned(base: ResolvedModel, card: Card, adapter: Path, device: str) -> Any:
    """Load the trained model in eval mode.

    Args:
        base: the resolved base model the run trained.
        card: the run's card (method, dtype, quantisation, prompt format).
        adapter: the folder training saved (the run's training/adapter): a PEFT adapter, or the whole model for
            method full.
        device: where to load it (cuda, mps or cpu).
    Returns:
        the model.
    Raises:
        MissingInput: the folder is missing (training has not run).
    """
    if not adapter.exists():
        raise MissingInput(f"{adapter} is missing: run the training stage of this run first")
    if card.method.kind == "full":
        return load_model(ResolvedModel(base.source, "local", str(adapter), base.revision), card, device)
    model = PeftModel.from_pretrained(load_model(base, card, device), str(adapter))
    model.eval()
    return model
