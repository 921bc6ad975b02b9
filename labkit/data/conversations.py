"""Conversations as a row's input: a column of `{role, content}` turns (the `messages` column of chat data sets) read
when the card sets `data.prompt.conversation: true`.

A row stays one input and one answer. The input is the turns before the answer, kept in the row as their JSON text
(so cleaning, splits, hashes and the archived splits treat it as any input); the answer is `data.fields.target`, or,
when that names the conversation's column too, the conversation's last turn, which must be the assistant's. The
turns are checked where they are read, with the row's place: roles `system`, `user` and `assistant` only, a system
turn first if at all, then user and assistant in turn, the input ending with the user's. `labkit.data.prompting`
renders them through the chat template, the card's `instruction` wrapping the last user turn.
"""

from __future__ import annotations

import json
from typing import Any

from labkit.errors import DataError

ROLES = ("system", "user", "assistant")


def is_conversation(value: Any) -> bool:
    """Whether a column's value is a chat conversation: a non-empty list of {"role", "content"} turns."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(turn, dict) and {"role", "content"} <= turn.keys() for turn in value)


def read_conversation(value: Any, where: str, column: str, answer_last: bool,
                      card_system: bool) -> tuple[str, str | None]:
    """One row's conversation, checked, as the input's JSON text and (with `answer_last`) the answer.

    Args:
        value: the column's value.
        where: the row's place (`file:line`, `source row N`).
        column: the column's name (data.fields.input).
        answer_last: data.fields.target names the same column: the last turn is the answer.
        card_system: the card sets data.prompt.system.
    Returns:
        (the turns before the answer as JSON text, the answer's text or None).
    Raises:
        DataError: not a conversation, an unknown role, turns out of order, a system turn beside the card's.
    """
    at = f"{where}: field {column!r} (data.fields.input, data.prompt.conversation: true)"
    if not is_conversation(value):
        raise DataError(f"{at} is not a conversation (a list of {{role, content}} turns): got "
                        f"{type(value).__name__}; map a conversation column, or set data.prompt.conversation: false")
    turns = [{"role": turn["role"], "content": turn["content"]} for turn in value]
    for number, turn in enumerate(turns, 1):
        if turn["role"] not in ROLES:
            raise DataError(f"{at}: turn {number} has role {turn['role']!r}; labkit reads {', '.join(ROLES)} turns: "
                            "drop or rewrite the others")
        if not isinstance(turn["content"], str):
            raise DataError(f"{at}: turn {number}'s content is {type(turn['content']).__name__}, not text")
    if turns[0]["role"] == "system" and card_system:
        raise DataError(f"{at}: the conversation opens with its own system turn and data.prompt.system is set too; "
                        "remove data.prompt.system (or the data's system turns)")
    if answer_last:
        if turns[-1]["role"] != "assistant":
            raise DataError(f"{at}: the last turn is the {turns[-1]['role']}'s, and data.fields.target names this "
                            "column too, so the last turn is the answer: it must be the assistant's")
        turns, answer = turns[:-1], turns[-1]["content"]
    else:
        answer = None
    opening = 1 if turns and turns[0]["role"] == "system" else 0
    for number, turn in enumerate(turns[opening:]):
        expected = ("user", "assistant")[number % 2]
        if turn["role"] != expected:
            raise DataError(f"{at}: turn {number + 1 + opening} is the {turn['role']}'s where the {expected}'s comes "
                            "(after an optional system turn, user and assistant take turns)")
    if len(turns) == opening or turns[-1]["role"] != "user":
        last = f"the {turns[-1]['role']}'s" if len(turns) > opening else "no user turn"
        raise DataError(f"{at}: the turns before the answer must end with the user's (they end with {last})")
    return json.dumps(turns, ensure_ascii=False), answer


def turns(text: str) -> list[dict[str, str]]:
    """The turns of an input written by `read_conversation` (its JSON text)."""
    return json.loads(text)


def one_turn(text: str) -> str:
    """The input of a conversation of one user turn (what `read_conversation` writes for it)."""
    return json.dumps([{"role": "user", "content": text}], ensure_ascii=False)


def _lines(said: list[dict[str, str]]) -> str:
    return "\n".join(f"{turn['role']}: {turn['content']}" for turn in said)


def transcript(text: str) -> str:
    """The turns as plain text, `role: content` per turn (a completion template's {input}, a page's input)."""
    return _lines(turns(text))


def readable(text: str) -> str:
    """An input as a person reads it: a conversation's turns as `transcript` lines, any other text as it is."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return _lines(value) if is_conversation(value) else text


def spoken(text: str) -> str:
    """The turns' contents, one per line: the text the near-duplicate search compares (no JSON keys or roles, which
    every conversation shares)."""
    return "\n".join(turn["content"] for turn in turns(text))
