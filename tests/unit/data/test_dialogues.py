"""labkit.data.dialogues: the built-in dialogue-summary data (deterministic, learnable, planted duplicates) and the
generation length sized from its reference summaries."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from labkit.data.dialogues import TOPICS, generate_dialogues
from labkit.data.leakage import find_duplicates
from labkit.evaluate.length import size_generation


def test_rows_fields_and_determinism() -> None:
    records, planted = generate_dialogues(300, seed=7)
    assert len(records) == 300 and {tuple(r) for r in records} == {("id", "dialogue", "summary", "topic")}
    assert (records, planted) == generate_dialogues(300, seed=7)
    assert generate_dialogues(300, seed=8)[0] != records
    assert len({r["id"] for r in records}) == 300
    counts = Counter(r["topic"] for r in records)
    assert set(counts) == set(TOPICS) and min(counts.values()) >= 300 // len(TOPICS) - 2


def test_two_speakers_and_an_inferable_summary() -> None:
    for record in generate_dialogues(120, seed=3)[0]:
        turns = record["dialogue"].strip().splitlines()
        speakers = [t.split(":", 1)[0].strip() for t in turns]
        assert len(set(s.casefold() for s in speakers)) == 2 and len(turns) >= 6
        first, second = speakers[0], speakers[1]
        summary = record["summary"]
        assert summary.casefold().startswith(first.casefold()) and second.casefold() in summary.casefold()
        days = re.findall(r"Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday", summary)
        assert days and all(d.casefold() in record["dialogue"].casefold() for d in days)  # nothing made up


@pytest.mark.parametrize("rows,seed", [(60, 1), (300, 7), (800, 11)])
def test_find_duplicates_finds_exactly_the_planted_pairs(rows: int, seed: int) -> None:
    records, planted = generate_dialogues(rows, seed=seed)
    pairs = find_duplicates({"all": [(r["id"], r["dialogue"]) for r in records]}, threshold=0.85)
    got = {(p["a_id"], p["b_id"], p["kind"]) for p in pairs}
    want = {(a, b, "exact") for a, b in planted["exact_duplicates"]}
    want |= {(a, b, "near") for a, b in planted["near_duplicates"]}
    assert got == want and planted["exact_duplicates"] and planted["near_duplicates"]
    assert planted["empty"] == [] and planted["overlong"] == []  # the keys stage 02's planted-vs-found check reads
    by_id = {r["id"]: r for r in records}
    for a, b in planted["exact_duplicates"] + planted["near_duplicates"]:
        assert by_id[a]["summary"] == by_id[b]["summary"]


class _Words:
    """A tokenizer stand-in counting one token per word (what size_generation asks of a tokenizer)."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": text.split()}


def test_generation_length_is_the_p95_of_the_references_plus_a_margin() -> None:
    targets = [" ".join(["w"] * n) for n in range(1, 101)]  # 1..100 words: + end of turn → 2..101 tokens
    sized = size_generation(_Words(), targets)
    assert sized["p95_tokens"] == 96 and sized["margin"] == 10 and sized["max_new_tokens"] == 106
    assert sized["longest_tokens"] == 101 and sized["references"] == 100
    short = size_generation(_Words(), ["a b", "c d e"])
    assert short["margin"] == 8 and short["max_new_tokens"] == 4 + 8
    with pytest.raises(ValueError, match="no reference"):
        size_generation(_Words(), [])
