"""Where in a card an error belongs: a check that runs after the card loaded (the data's preparation, the tokenizer's
template, the method on the model) names the key it is about but not the card; `labkit check` checks several cards
at once, so each such line is given the `file:line` of that key, or the card's path, before it is printed."""

from __future__ import annotations

import re

from pydantic import BaseModel

from labkit.card.load import LoadedCard
from labkit.card.schema import Card

# a line that already opens with a file (the card's own `file:line:`, a data file's `data.jsonl:3:`)
_NAMES_A_FILE = re.compile(r"^[^\s:]+\.(ya?ml|jsonl?|csv|parquet|gguf|txt)(:\d+)?: ")


def is_card_key(dotted: str) -> bool:
    """Whether a dotted name is a key of the card (checked down to where the schema stops being sections: a list, a
    mapping or a choice of sources)."""
    model: type[BaseModel] | None = Card
    for part in dotted.split("."):
        if model is None:
            return True
        if part not in model.model_fields:
            return False
        annotation = model.model_fields[part].annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return True


def locate(message: str, loaded: LoadedCard) -> str:
    """The error line with its place in the card in front.

    Args:
        message: the error's one line.
        loaded: the card it was raised for.
    Returns:
        `file:line: message` when it opens with a card key (`data.prompt.system: …`; the file of the chain that
        writes the key), the message as it is when it opens with a file already, else `card path: message`.
    """
    if _NAMES_A_FILE.match(message) or any(message.startswith(f"{path}:") for path in loaded.chain):
        return message
    key = message.split(":", 1)[0].split(" ", 1)[0]
    return f"{loaded.where(key) if is_card_key(key) else loaded.path}: {message}"
