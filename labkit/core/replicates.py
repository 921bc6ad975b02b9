"""Replicates of a variant: the same card trained k times with different training seeds (`experiment.replicates`).

Replicate i (1 … k) of a card trains with seed `train.seed + i - 1`, so replicate 1 is the run a card without
replicates makes. The archived card.yaml keeps the card's own `train.seed` — the protocol-fixed seed every variant of
the experiment shares (`labkit.core.protocol`) — and the replicate's seed is recorded beside it in the run folder
(`replicate.json`: index, count, seed) and in the registry's `started` event; `labkit.core.run_card.resolved_card`
puts it into the card every stage reads, like the run's hub commits. Data, split and evaluation are the card's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from labkit.card.schema import Card
from labkit.card.update import updated
from labkit.core import io

REPLICATE = "replicate.json"


class Replicate(TypedDict):
    """One replicate of a variant (replicate.json)."""

    index: int  # 1 … of
    of: int  # the card's experiment.replicates
    seed: int  # the training seed this run uses: card_seed + index - 1
    card_seed: int  # the card's train.seed (the protocol's)


def replicates(card: Card) -> list[Replicate]:
    """The replicates a card asks for, in order.

    Args:
        card: the validated card.
    Returns:
        one Replicate per run `labkit run` makes of the card (one, index 1 with the card's seed, without replicates).
    """
    k, seed = card.experiment.replicates, card.train.seed
    return [{"index": i, "of": k, "seed": seed + i - 1, "card_seed": seed} for i in range(1, k + 1)]


def record_replicate(run_dir: Path, replicate: Replicate) -> None:
    """Write a run's replicate.json (once, when the run folder is created)."""
    io.write_json(Path(run_dir) / REPLICATE, dict(replicate))


def read_replicate(run_dir: Path | str) -> Replicate | None:
    """A run's replicate record, or None for a run made without replicates."""
    path = Path(run_dir) / REPLICATE
    return io.read_json(path) if path.exists() else None  # type: ignore[return-value]


def run_seed(run_dir: Path | str, card: dict[str, Any]) -> int | None:
    """The training seed a run used: its replicate's, else its archived card's train.seed.

    Args:
        run_dir: the run folder.
        card: the run's archived card.yaml as a dict.
    Returns:
        the seed (None when the card has no train section).
    """
    found = read_replicate(run_dir)
    return found["seed"] if found else (card.get("train") or {}).get("seed")


def with_replicate_seed(card: Card, run_dir: Path | str) -> Card:
    """The card with the run's replicate seed as train.seed (the card itself for a run without replicates).

    Args:
        card: the validated card (the run's archived card).
        run_dir: the run folder.
    Returns:
        the card a replicate trains with.
    """
    found = read_replicate(run_dir)
    if found is None or found["seed"] == card.train.seed:
        return card
    return updated(card, {"train.seed": found["seed"]})
