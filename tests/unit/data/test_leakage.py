"""Tests for labkit.data.leakage: normalisation, shingles, Jaccard and duplicate search."""

import os
import random
import subprocess
import sys

import pytest
from conftest import REPO

from labkit.data.leakage import (
    emptied_train,
    find_duplicates,
    jaccard,
    normalise_text,
    shingles,
    summarise,
)

WORDS = [f"w{i}" for i in range(5000)]


def _text(rng: random.Random, k: int = 40) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(k))


def _change_one_word(text: str, pos: int) -> str:
    words = text.split()
    words[pos] = "changed"
    return " ".join(words)


def test_normalise_text_folds_case_unicode_whitespace_and_edge_punctuation():
    assert normalise_text("  Hello,\tWORLD!!\n\n“Don't”  stop. ") == "hello world don't stop"
    assert normalise_text("ＦＵＬＬ ﬁne Straße") == "full fine strasse"  # NFKC + casefold
    assert normalise_text("v1.5 e-mail") == "v1.5 e-mail"  # inner punctuation kept
    assert normalise_text(" ... -- \n") == ""


def test_shingles_counts_and_short_texts():
    assert len(shingles("one two three four five")) == 3
    assert len(shingles("one two three four five", n=2)) == 4
    assert len(shingles("just two")) == 1
    assert shingles("just two") != shingles("just three")
    assert shingles("") == set() and shingles("  !! ") == set()
    assert shingles("A b C d") == shingles("a  B, c d.")
    assert all(0 <= h < 2**64 for h in shingles("some words to hash here"))


def test_shingles_are_order_sensitive():
    assert shingles("a b c") != shingles("c b a")


def test_shingles_stable_across_processes_with_different_hash_seeds():
    code = "from labkit.data.leakage import shingles; print(sorted(shingles('the quick brown fox jumps')))"
    root = str(REPO)
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": root}
        outs.append(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                   text=True, check=True).stdout)
    assert outs[0] == outs[1] == str(sorted(shingles("the quick brown fox jumps"))) + "\n"


def test_jaccard_values():
    rng = random.Random(0)
    t = _text(rng)
    assert jaccard(t, t.upper()) == 1.0
    assert jaccard("", "") == 0.0 and jaccard(t, "") == 0.0
    assert jaccard(t, _change_one_word(t, 20)) == pytest.approx(35 / 41)
    assert jaccard(t, _text(rng)) < 0.05


def test_exact_duplicates_after_case_and_whitespace_changes():
    rows = [("r1", "The Router keeps   dropping WiFi."), ("r2", "the router keeps dropping wifi"),
            ("r3", "  THE ROUTER\nkeeps dropping wifi!  "), ("r4", "Something else entirely here.")]
    pairs = find_duplicates({"train": rows})
    assert [(p["a_id"], p["b_id"], p["kind"], p["similarity"]) for p in pairs] == [
        ("r1", "r2", "exact", 1.0), ("r1", "r3", "exact", 1.0), ("r2", "r3", "exact", 1.0)]


def test_near_duplicate_one_word_changed_is_found_and_unrelated_is_not():
    rng = random.Random(1)
    base = _text(rng)
    rows = [("a", base), ("b", _change_one_word(base, 17)), ("c", _text(rng)), ("d", _text(rng))]
    pairs = find_duplicates({"train": rows})
    assert len(pairs) == 1
    p = pairs[0]
    assert (p["a_id"], p["b_id"], p["kind"]) == ("a", "b", "near")
    assert p["similarity"] == round(35 / 41, 4)
    assert find_duplicates({"train": rows}, threshold=0.9) == []


def test_cross_split_and_within_split_names_and_order():
    rng = random.Random(2)
    t1, t2, t3 = _text(rng), _text(rng), _text(rng)
    splits = {
        "train": [("t1", t1), ("t2", t2), ("t3", t3.upper())],
        "validation": [("v1", _change_one_word(t2, 39))],
        "test": [("x1", t1 + "  "), ("x2", t3)],
    }
    pairs = find_duplicates(splits)
    got = [(p["a_split"], p["a_id"], p["b_split"], p["b_id"], p["kind"]) for p in pairs]
    assert got == [("train", "t1", "test", "x1", "exact"),
                   ("train", "t2", "validation", "v1", "near"),
                   ("train", "t3", "test", "x2", "exact")]
    # Same texts inside one split are reported as within-split pairs.
    within = find_duplicates({"test": splits["train"] + splits["test"]})
    assert {p["a_split"] for p in within} == {p["b_split"] for p in within} == {"test"}
    assert len(within) == 2  # the near pair needs validation's row, absent here


def test_split_order_follows_dict_order():
    splits = {"test": [("z", "same text here ok")], "train": [("a", "Same text here, ok.")]}
    [p] = find_duplicates(splits)
    assert (p["a_split"], p["a_id"], p["b_split"], p["b_id"]) == ("test", "z", "train", "a")


def test_empty_rows_are_skipped():
    pairs = find_duplicates({"train": [("a", ""), ("b", "   \n"), ("c", "..."), ("d", "real words here")]})
    assert pairs == []


def test_no_false_positives_and_full_recall_around_threshold():
    rng = random.Random(3)
    rows, truth = [], {}
    for k in range(150):
        base = _text(rng, 50)
        words = base.split()
        for pos in rng.sample(range(50), rng.randint(1, 5)):  # Jaccard from ~0.6 to ~0.96
            words[pos] = f"x{k}_{pos}"
        rows += [(f"a{k:03d}", base), (f"b{k:03d}", " ".join(words))]
        truth[(f"a{k:03d}", f"b{k:03d}")] = jaccard(base, " ".join(words))
    threshold = 0.8
    pairs = find_duplicates({"train": rows}, threshold=threshold)
    texts = dict(rows)
    for p in pairs:
        assert p["kind"] == "near"
        assert jaccard(texts[p["a_id"]], texts[p["b_id"]]) >= threshold
    expected = {k for k, v in truth.items() if v >= threshold}
    assert 0 < len(expected) < len(truth)
    assert {(p["a_id"], p["b_id"]) for p in pairs} == expected


def test_exact_group_expands_near_pairs():
    rng = random.Random(4)
    base = _text(rng)
    rows = [("a", base), ("b", base.upper()), ("c", _change_one_word(base, 39))]
    pairs = find_duplicates({"train": rows})
    assert [(p["a_id"], p["b_id"], p["kind"]) for p in pairs] == [
        ("a", "b", "exact"), ("a", "c", "near"), ("b", "c", "near")]


def test_deterministic_sorted_and_each_pair_once():
    rng = random.Random(5)
    base = [(f"r{i:04d}", _text(rng)) for i in range(300)]
    extra = [(f"d{i:04d}", _change_one_word(base[i * 7][1], 39)) for i in range(20)]
    extra += [(f"e{i:04d}", base[i * 11][1].upper()) for i in range(20)]
    splits = {"train": base[:200] + extra, "test": base[200:]}
    first = find_duplicates(splits)
    assert first == find_duplicates(splits) == find_duplicates(splits, seed=0)
    assert len(first) >= 40
    rank = {"train": 0, "test": 1}
    keys = [((rank[p["a_split"]], p["a_id"]), (rank[p["b_split"]], p["b_id"])) for p in first]
    assert keys == sorted(keys)
    assert all(a < b for a, b in keys)
    assert len({frozenset(k) for k in keys}) == len(keys)
    # A different MinHash seed still finds the same verified pairs.
    assert find_duplicates(splits, seed=123) == first


def test_threshold_validation():
    with pytest.raises(ValueError):
        find_duplicates({"train": []}, threshold=0.0)
    with pytest.raises(ValueError):
        find_duplicates({"train": []}, threshold=1.5)


def test_summarise_counts_per_split_pair_and_kind():
    rng = random.Random(6)
    t1, t2, t3 = _text(rng), _text(rng), _text(rng)
    splits = {"train": [("a", t1), ("b", t1.upper()), ("c", t2)],
              "validation": [("v", _change_one_word(t2, 0))],
              "test": [("x", t3), ("y", t1)]}
    pairs = find_duplicates(splits)
    summary = summarise(pairs, split_order=list(splits))
    assert summary == {"train~train": {"exact": 1, "near": 0},
                       "train~validation": {"exact": 0, "near": 1},
                       "train~test": {"exact": 2, "near": 0}}
    assert list(summary) == ["train~train", "train~validation", "train~test"]
    assert summarise([]) == {}
    assert sum(sum(v.values()) for v in summarise(pairs).values()) == len(pairs)


def test_the_emptied_training_split_names_each_cause_and_only_a_fix_that_can_work() -> None:
    def pair(a: str, b: str, similarity: float) -> dict:
        return {"a_split": a, "b_split": b, "similarity": similarity}

    cross = [pair("train", "validation", 0.9), pair("test", "train", 0.95), pair("validation", "test", 0.99)]
    line = emptied_train(0.85, cross, train_rows=5, by_group=2)
    assert line.startswith("data.leakage: policy drop_from_train dropped all 5 training rows, 3 as duplicates of "
                           "validation/test rows at similarity 0.900–0.950; 2 for sharing a group (data.fields.group) "
                           "with one, so nothing is left to train on (threshold 0.85); if they are different examples")
    assert "above 0.950, or set data.leakage.policy: report" in line  # the validation~test pair is not counted
    exact = emptied_train(0.85, [pair("train", "test", 1.0)], train_rows=1, by_group=0)
    assert "threshold above" not in exact and exact.endswith("nothing is left to train on (threshold 0.85); set "
                                                             "data.leakage.policy: report to keep them and see the "
                                                             "pairs in stage 02 (preprocessing/leakage.json)")
    grouped = emptied_train(0.85, [], train_rows=4, by_group=4)
    assert "dropped all 4 training rows, 4 for sharing a group" in grouped and "similarity" not in grouped
