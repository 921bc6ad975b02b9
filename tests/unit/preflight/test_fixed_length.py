"""Stage 03's fixed-length examples on rows whose prompts are longer than the measured length (long documents,
short answers): every example carries an answer token, so the trainer drops none and the arms do not run out of
batches."""

from __future__ import annotations

import pytest

from labkit.card.update import updated
from labkit.data.prompting import IGNORE, encode_rows
from labkit.errors import DataError
from labkit.model.loading import load_tokenizer
from labkit.preflight.measure import fixed_length_dataset


def _long_prompts(rows: list[dict], repeat: int) -> list[dict]:
    return [{**r, "input": " ".join([r["input"]] * repeat)} for r in rows]


def test_windows_inside_long_prompts_are_skipped(card, tiny_model, rows) -> None:
    card = updated(card, {"data.max_length": 1024})
    tokenizer = load_tokenizer(tiny_model, card)
    long_rows = _long_prompts(rows[:8], 12)
    encoded = encode_rows(tokenizer, card, long_rows)
    assert min(sum(x != IGNORE for x in e.labels) for e in encoded) == 0  # some rows lost their answer entirely
    data = fixed_length_dataset(tokenizer, card, long_rows, 32, 16)
    assert len(data) == 16
    assert all(any(x != IGNORE for x in e["labels"]) for e in data)
    assert {len(e["input_ids"]) for e in data} == {31, 32}


def test_rows_without_any_answer_token_are_a_data_error(card, tiny_model, rows) -> None:
    card = updated(card, {"data.max_length": 64})
    tokenizer = load_tokenizer(tiny_model, card)
    with pytest.raises(DataError, match="data.max_length"):
        fixed_length_dataset(tokenizer, card, _long_prompts(rows[:4], 30), 32, 4)
