"""A changed copy of a frozen card: `updated(card, {"train.lr": 0.5})`.

A validated card is never changed in place (`labkit.card.experiment_and_data.Strict` is frozen): what a run
resolves later — absolute data and model paths, hub commits (`labkit.core.protocol.pinned`), the recorded generation length
(`labkit.core.run_card`) — and what a test or a bench varies is a new card, validated again like a loaded one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from labkit.errors import CardError

M = TypeVar("M", bound=BaseModel)


def _plain(value: Any) -> Any:
    """A section given as a model becomes its data (keys it leaves at their defaults stay unset)."""
    return value.model_dump(exclude_unset=True, by_alias=True) if isinstance(value, BaseModel) else value


def updated(model: M, changes: Mapping[str, Any]) -> M:
    """Return a validated copy of a card (or one of its sections) with some keys changed.

    Args:
        model: the card or section; it is left as it is.
        changes: {dotted key: new value}, e.g. {"train.max_steps": 4, "method": Full(kind="full"),
            "experiment.guardrails.0.max": 0.2}; a value may be a section model or its data.
    Returns:
        a new model of the same type, validated as `labkit.card.load` validates a card (keys the card left out stay
        left out, so checks that depend on what a card sets see the same card).
    Raises:
        CardError: a change the card's schema refuses, naming the key.
    """
    data = model.model_dump(exclude_unset=True, by_alias=True)
    for key, value in changes.items():
        *path, last = key.split(".")
        node: Any = data
        for part in path:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        if isinstance(node, list):
            node[int(last)] = _plain(value)
        else:
            node[last] = _plain(value)
    try:
        return type(model).model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or ", ".join(changes)
        raise CardError(f"{where}: {first['msg']} (changing {', '.join(changes)})") from None
