"""Benchmark: train/eval leakage detection at 10k and 100k rows, side by side with the usual recipes.

Prints one JSON object. For each size: labkit's exact + near-duplicate search (MinHash/LSH candidates,
verified by exact Jaccard) against exact-hash deduplication (what fine-tuning tools do today) — time
and recall of the planted near duplicates — and, on a 2,000-row sample, against the plain all-pairs
Jaccard loop, which must find the same pairs (the speed ratio is measured there, side by side).

Run: .venv/bin/python bench/leakage.py [--sizes 10000 100000]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
import statistics
import time

from labkit.data.leakage import find_duplicates, normalise_text, shingles


def synthetic(rows: int, seed: int = 0, planted_share: float = 0.01) -> tuple[dict, set, set]:
    """Rows of 40 random words over a 5,000-word vocabulary, with exact and one-word-edit near duplicates planted."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(5000)]
    texts = [" ".join(rng.choices(vocab, k=40)) for _ in range(rows)]
    n_plant = max(1, int(rows * planted_share))
    exact, near = set(), set()
    for k in range(n_plant):
        src = rng.randrange(rows)
        dst = rng.randrange(rows)
        if src == dst or any(dst in p or src in p for p in exact | near):
            continue
        if k % 2:
            texts[dst] = texts[src].upper()  # identical after normalisation
            exact.add(frozenset((src, dst)))
        else:
            words = texts[src].split()
            words[rng.randrange(len(words))] = rng.choice(vocab)
            texts[dst] = " ".join(words)
            near.add(frozenset((src, dst)))
    half = rows // 2
    splits = {"train": [(f"{i:07d}", t) for i, t in enumerate(texts[:half])],
              "validation": [(f"{i + half:07d}", t) for i, t in enumerate(texts[half:])]}
    return splits, exact, near


def exact_hash(splits: dict) -> set:
    """The usual recipe: hash the normalised text, report identical hashes."""
    seen: dict[str, int] = {}
    pairs = set()
    for rows in splits.values():
        for rid, text in rows:
            key = hashlib.sha256(normalise_text(text).encode()).hexdigest()
            if key in seen:
                pairs.add(frozenset((seen[key], int(rid))))
            else:
                seen[key] = int(rid)
    return pairs


def all_pairs(splits: dict, threshold: float) -> set:
    """The plain recipe for near duplicates: shingle every row once, then the Jaccard of every pair."""
    rows = [(int(rid), shingles(text)) for part in splits.values() for rid, text in part]
    return {frozenset((a, b)) for (a, sa), (b, sb) in itertools.combinations(rows, 2)
            if sa and sb and len(sa & sb) / len(sa | sb) >= threshold}


def timed(fn, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--threshold", type=float, default=0.85)
    args = parser.parse_args()
    out: dict = {"threshold": args.threshold, "sizes": {}}
    for n in args.sizes:
        splits, exact, near = synthetic(n)
        repeats = 3 if n <= 20_000 else 1
        t_lab, found = timed(lambda: find_duplicates(splits, threshold=args.threshold), repeats)
        t_hash, hashed = timed(lambda: exact_hash(splits), repeats)
        got = {frozenset((int(p["a_id"]), int(p["b_id"]))) for p in found}
        false_pos = [p for p in found if p["kind"] == "near" and p["similarity"] < args.threshold]
        out["sizes"][str(n)] = {
            "labkit_seconds": round(t_lab, 3), "exact_hash_seconds": round(t_hash, 3),
            "labkit_over_exact_hash_time": round(t_lab / t_hash, 2),
            "planted_exact": len(exact), "planted_near": len(near),
            "labkit_recall_exact": round(len(got & exact) / len(exact), 4) if exact else None,
            "labkit_recall_near": round(len(got & near) / len(near), 4) if near else None,
            "exact_hash_recall_near": round(len(hashed & near) / len(near), 4) if near else None,
            "labkit_pairs": len(found), "labkit_near_below_threshold": len(false_pos),
        }
    sample, _, _ = synthetic(2000, seed=1, planted_share=0.02)
    t_lab, found = timed(lambda: find_duplicates(sample, threshold=args.threshold), 3)
    t_naive, naive = timed(lambda: all_pairs(sample, args.threshold), 1)
    got = {frozenset((int(p["a_id"]), int(p["b_id"]))) for p in found}
    out["all_pairs_2000_rows"] = {"labkit_seconds": round(t_lab, 3), "all_pairs_seconds": round(t_naive, 2),
                                  "speedup": round(t_naive / t_lab, 1), "same_pairs": got == naive,
                                  "pairs": len(naive)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
