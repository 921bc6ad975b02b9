"""Tests for labkit.data.tickets: the built-in support-ticket dataset."""

import itertools
import json
import math
import re
from collections import Counter

import pytest

from labkit.data import tickets
from labkit.data.leakage import find_duplicates, jaccard, normalise_text, shingles
from labkit.data.tickets import (
    CATEGORIES,
    PRIORITIES,
    PRIORITY_CUES,
    PRODUCTS,
    generate_tickets,
)


@pytest.fixture(scope="module")
def data400():
    return generate_tickets(400, seed=7)


def _planted_ids(planted: dict) -> set[str]:
    copies = {c for _, c in planted["exact_duplicates"] + planted["near_duplicates"]}
    return copies | set(planted["empty"]) | set(planted["overlong"])


def _cues_in(text: str) -> set[str]:
    padded = f" {normalise_text(text)} "
    return {p for p, cues in PRIORITY_CUES.items() if any(f" {normalise_text(c)} " in padded for c in cues)}


def test_constants():
    assert len(CATEGORIES) == 5 and PRIORITIES == ("low", "medium", "high", "urgent")
    assert 5 <= len(PRODUCTS) <= 7
    assert len({p.split()[0].lower() for p in PRODUCTS}) == len(PRODUCTS)
    assert PRIORITY_CUES["medium"] == ()


def test_deterministic_and_seed_sensitive(data400):
    assert generate_tickets(400, seed=7) == data400
    other, _ = generate_tickets(400, seed=8)
    assert [r["text"] for r in other] != [r["text"] for r in data400[0]]
    small_a, small_b = generate_tickets(40, seed=1), generate_tickets(40, seed=1)
    assert small_a == small_b


def test_record_schema(data400):
    records, _ = data400
    assert len(records) == 400
    assert [r["id"] for r in records] == [f"tk-{i:04d}" for i in range(1, 401)]
    for r in records:
        assert list(r) == ["id", "text", "category", "answer"]
        answer = json.loads(r["answer"])
        assert list(answer) == ["category", "priority", "product"]
        assert r["answer"] == json.dumps(answer)
        assert answer["category"] == r["category"] in CATEGORIES
        assert answer["priority"] in PRIORITIES and answer["product"] in PRODUCTS
        assert isinstance(r["text"], str)


def test_category_balance_and_priority_mix(data400):
    records, _ = data400
    cats = Counter(r["category"] for r in records)
    assert set(cats) == set(CATEGORIES)
    assert max(cats.values()) - min(cats.values()) <= 10
    pris = Counter(json.loads(r["answer"])["priority"] for r in records)
    assert set(pris) == set(PRIORITIES)
    assert pris.most_common(1)[0][0] == "medium"
    assert pris["medium"] < 0.6 * len(records)


def test_priority_cues_are_learnable(data400):
    records, planted = data400
    for r in records:
        if r["id"] in planted["empty"]:
            continue
        priority = json.loads(r["answer"])["priority"]
        expected = set() if priority == "medium" else {priority}
        assert _cues_in(r["text"]) == expected, (r["id"], priority, r["text"])


def test_product_is_mentioned_and_unambiguous(data400):
    records, planted = data400
    keywords = {p: p.split()[0].lower() for p in PRODUCTS}
    for r in records:
        if r["id"] in planted["empty"]:
            continue
        words = set(normalise_text(r["text"]).split())
        product = json.loads(r["answer"])["product"]
        assert {p for p, k in keywords.items() if k in words} == {product}, r["text"]


def test_text_length_and_variety(data400):
    records, planted = data400
    skip = _planted_ids(planted)
    counts = [len(r["text"].split()) for r in records if r["id"] not in skip]
    assert 25 <= sorted(counts)[len(counts) // 2] <= 70
    assert sum(20 <= c <= 80 for c in counts) >= 0.95 * len(counts)
    assert len({r["text"].split(".")[0][:30] for r in records}) > 100
    assert any(r["text"] == r["text"].lower() and r["text"].strip() for r in records)  # casual rows exist


def test_category_is_learnable_from_text():
    """A tiny naive Bayes on word unigrams transfers from one seed to another."""
    train, _ = generate_tickets(400, seed=7)
    test, planted = generate_tickets(200, seed=99)
    counts = {c: Counter() for c in CATEGORIES}
    for r in train:
        counts[r["category"]].update(normalise_text(r["text"]).split())
    vocab = set().union(*counts.values())
    totals = {c: sum(v.values()) + len(vocab) for c, v in counts.items()}

    def predict(text: str) -> str:
        words = normalise_text(text).split()
        return max(CATEGORIES, key=lambda c: sum(math.log((counts[c][w] + 1) / totals[c]) for w in words))

    scored = [r for r in test if r["id"] not in planted["empty"]]
    accuracy = sum(predict(r["text"]) == r["category"] for r in scored) / len(scored)
    assert accuracy >= 0.9


def test_planted_problems_400(data400):
    records, planted = data400
    by_id = {r["id"]: r for r in records}
    position = {r["id"]: i for i, r in enumerate(records)}
    assert len(planted["exact_duplicates"]) == 3 and len(planted["near_duplicates"]) == 3
    assert len(planted["empty"]) == 1 and len(planted["overlong"]) == 1
    for orig, copy in planted["exact_duplicates"]:
        a, b = by_id[orig]["text"], by_id[copy]["text"]
        assert a != b and normalise_text(a) == normalise_text(b)
        assert re.sub(r"\s+", " ", a.lower()).strip() == re.sub(r"\s+", " ", b.lower()).strip()
    for orig, copy in planted["near_duplicates"]:
        a, b = by_id[orig]["text"], by_id[copy]["text"]
        assert normalise_text(a) != normalise_text(b) and jaccard(a, b) >= 0.9
    for orig, copy in planted["exact_duplicates"] + planted["near_duplicates"]:
        assert by_id[orig]["answer"] == by_id[copy]["answer"]
        assert position[orig] < position[copy]
    originals = [o for o, _ in planted["exact_duplicates"] + planted["near_duplicates"]]
    assert len(set(originals)) == len(originals) and not set(originals) & _planted_ids(planted)
    [empty] = planted["empty"]
    assert by_id[empty]["text"].strip() == ""
    [overlong] = planted["overlong"]
    assert len(by_id[overlong]["text"]) > 4000
    planted_positions = sorted(position[i] for i in _planted_ids(planted))
    assert planted_positions[0] < 300  # spread out, not all appended at the end


@pytest.mark.parametrize("rows,seed", [(400, 7), (40, 7), (40, 3), (250, 11)])
def test_find_duplicates_finds_exactly_the_planted_pairs(rows, seed):
    records, planted = generate_tickets(rows, seed=seed)
    pairs = find_duplicates({"all": [(r["id"], r["text"]) for r in records]}, threshold=0.85)
    got = {(p["a_id"], p["b_id"], p["kind"]) for p in pairs}
    want = {(a, b, "exact") for a, b in planted["exact_duplicates"]}
    want |= {(a, b, "near") for a, b in planted["near_duplicates"]}
    assert got == want
    assert len(planted["exact_duplicates"]) >= 1 and len(planted["near_duplicates"]) >= 1
    assert len(planted["empty"]) == 1 and len(planted["overlong"]) == 1
    assert len(records) == rows


def test_ordinary_rows_are_pairwise_diverse(data400):
    records, planted = data400
    skip = _planted_ids(planted)
    sets = [shingles(r["text"]) for r in records if r["id"] not in skip]
    worst = max(len(a & b) / len(a | b) for a, b in itertools.combinations(sets, 2))
    assert worst < 0.5


def test_small_and_invalid_sizes():
    records, planted = generate_tickets(10, seed=0)
    assert len(records) == 10 and len(planted["exact_duplicates"]) == 1
    with pytest.raises(ValueError):
        generate_tickets(9)


def test_generation_work_is_far_below_all_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A count, not a clock: the diversity check verifies few candidate pairs (its prefix filter) and a ticket is
    rarely drawn again."""
    indexes, composed = [], []
    init, compose = tickets._DiversityIndex.__init__, tickets._compose
    monkeypatch.setattr(tickets._DiversityIndex, "__init__", lambda self, *a: (init(self, *a), indexes.append(self))[0])
    monkeypatch.setattr(tickets, "_compose", lambda *a, **k: (composed.append(1), compose(*a, **k))[1])
    generate_tickets(400, seed=123)
    (index,) = indexes
    pairs = len(index.sets) * (len(index.sets) - 1) / 2
    assert 0 < index.verified < 0.1 * pairs  # measured: 2,925 of 76,636 pairs
    assert len(composed) <= 1.3 * 400  # a pilot sample of a quarter of the rows, then ~1 draw per ticket (measured 492)
