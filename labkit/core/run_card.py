"""The card one run uses: the validated card, the hub commits the run recorded, its recorded generation length and a
replicate's training seed (`labkit.core.replicates`).

A run resolves its card once and never changes it: `labkit.core.protocol.pin_card` records the exact commits of
`hf:` sources in `pins.json` when the run opens, and stage 01 sizes `eval.max_new_tokens` from the data when the
card leaves it out (`labkit.evaluate.length.record`, written to `generation_length.json`). Every stage, `labkit
final` and the export read both from the run folder through `resolved_card`, so they all see one frozen card.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labkit.card.schema import Card
from labkit.card.update import updated
from labkit.core import io
from labkit.core.protocol import pinned, read_pins
from labkit.core.replicates import with_replicate_seed

GENERATION_LENGTH = "generation_length.json"


def recorded_length(run_dir: Path | str) -> dict[str, Any] | None:
    """The generation length a run recorded (None before stage 01 sized it, or when the card sets it).

    Args:
        run_dir: the run folder.
    Returns:
        what `labkit.evaluate.length.size_generation` returned ({"max_new_tokens", "p95_tokens", …}), or None.
    """
    path = Path(run_dir) / GENERATION_LENGTH
    return io.read_json(path) if path.exists() else None


def with_length(card: Card, run_dir: Path | str) -> Card:
    """The card with `eval.max_new_tokens` filled from the run's record when the card leaves it out.

    Args:
        card: the validated card.
        run_dir: its run folder.
    Returns:
        the card itself when it sets `eval.max_new_tokens` or the run has not sized it yet, else a copy with the
        recorded value.
    """
    found = recorded_length(run_dir) if card.eval.max_new_tokens is None else None
    if found is None:
        return card
    return updated(card, {"eval.max_new_tokens": found["max_new_tokens"]})


def resolved_card(card: Card, run_dir: Path | str) -> Card:
    """The card a run uses: its recorded hub commits (pins.json), generation length and, for a replicate, its training
    seed (replicate.json, `labkit.core.replicates`) put into the card.

    Args:
        card: the validated card (the run's archived card.yaml, loaded).
        run_dir: the run folder.
    Returns:
        the resolved card; `eval.max_new_tokens` stays None while the run has not sized it (before stage 01).
    """
    return with_replicate_seed(with_length(pinned(card, read_pins(Path(run_dir))), run_dir), run_dir)


def complete(card: Card) -> bool:
    """Whether a resolved card is final: nothing is left for the run to record into it (the generation length)."""
    return card.eval.max_new_tokens is not None
