"""Blind A/B rating of base against tuned answers by a person, as data: the items, the ratings, the human verdict.

Stage 05 offers a few validation examples per category (`ab_items`): the prompt, the reference and two answers,
A and B, where a seeded coin decides for each item which is the base model's and the items are shuffled, so the
rater cannot tell them apart. Each rating is one line of `comparison/human_ratings.jsonl` (`save_rating`) holding
the choice, which model it favours, the seed and the item's order. `human_verdict` counts the preferences and
their agreement with the automatic preference (the per-example score the example tables compare too,
`labkit.scoring.metrics.score_key`: the category right or not, JSON field accuracy, or ROUGE-L for a text target),
with Cohen's kappa (scikit-learn's `cohen_kappa_score`).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from sklearn.metrics import cohen_kappa_score

from labkit.core import io
from labkit.scoring.metrics import score_key

RATINGS = "human_ratings.jsonl"
CHOICES = ("a", "b", "tie")


def automatic_preference(base: dict[str, Any], tuned: dict[str, Any], key: str) -> str:
    """"tuned", "baseline" or "tie" on the per-example value `key`."""
    diff = float(tuned[key]) - float(base[key])
    return "tuned" if diff > 1e-9 else "baseline" if diff < -1e-9 else "tie"


def ab_items(base_rows: list[dict[str, Any]], tuned_rows: list[dict[str, Any]], seed: int,
             per_category: int = 3) -> list[dict[str, Any]]:
    """The blind items: up to `per_category` examples of every category, sides and order randomised by `seed`.

    Args:
        base_rows: the baseline's predictions (stage 01), with id, category, input, target, prediction.
        tuned_rows: the tuned model's predictions on the same rows (stage 05).
        seed: the seed of the random order (recorded with every rating).
        per_category: examples per category (all rows when the data has no category).
    Returns:
        items {"position", "id", "category", "input", "target", "a", "b", "a_is", "automatic"}, in rating order.
    """
    rng = random.Random(seed)
    base = {r["id"]: r for r in base_rows}
    key = score_key(tuned_rows)
    by_category: dict[Any, list[dict[str, Any]]] = {}
    for row in tuned_rows:
        if row["id"] in base:
            by_category.setdefault(row.get("category"), []).append(row)
    chosen = []
    for category in sorted(by_category, key=str):
        rows = by_category[category]
        chosen += rng.sample(rows, min(per_category, len(rows)))
    rng.shuffle(chosen)
    items = []
    for position, row in enumerate(chosen):
        a_is = rng.choice(("baseline", "tuned"))
        answers = {"baseline": base[row["id"]]["prediction"], "tuned": row["prediction"]}
        items.append({"position": position, "id": row["id"], "category": row.get("category"), "input": row["input"],
                      "target": row["target"], "a": answers[a_is],
                      "b": answers["tuned" if a_is == "baseline" else "baseline"], "a_is": a_is,
                      "automatic": automatic_preference(base[row["id"]], row, key)})
    return items


def preferred(item: dict[str, Any], choice: str) -> str:
    """The model a choice favours: "baseline", "tuned" or "tie"."""
    if choice not in CHOICES:
        raise ValueError(f"choice must be one of {CHOICES}, not {choice!r}")
    if choice == "tie":
        return "tie"
    other = "tuned" if item["a_is"] == "baseline" else "baseline"
    return item["a_is"] if choice == "a" else other


def save_rating(path: Path, item: dict[str, Any], choice: str, seed: int, rater: str = "") -> dict[str, Any]:
    """Append one rating to the ratings file (a later rating of the same item replaces it in `human_verdict`).

    Args:
        path: comparison/human_ratings.jsonl of the run.
        item: the rated item (`ab_items`).
        choice: "a", "b" or "tie".
        seed: the seed of the order.
        rater: who rated (free text).
    Returns:
        the line written.
    """
    line = {"time": io.utc_now(), "id": item["id"], "category": item["category"], "position": item["position"],
            "seed": seed, "a_is": item["a_is"], "choice": choice, "preferred": preferred(item, choice),
            "automatic": item["automatic"], "rater": rater}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line, ensure_ascii=False) + "\n")
    return line


def human_verdict(path: Path) -> dict[str, Any] | None:
    """The people's verdict from a ratings file: preferences, and agreement with the automatic metric.

    Args:
        path: comparison/human_ratings.jsonl.
    Returns:
        {"rated", "tuned", "baseline", "tie", "agreement", "kappa", "seed", "verdict"}, or None without ratings.
    """
    if not path.exists():
        return None
    latest = {(r["id"], r.get("rater", "")): r for r in io.read_jsonl(path)}  # the last rating of an item counts
    rows = list(latest.values())
    if not rows:
        return None
    counts = Counter(r["preferred"] for r in rows)
    agree = sum(r["preferred"] == r["automatic"] for r in rows) / len(rows)

    human, auto = [r["preferred"] for r in rows], [r["automatic"] for r in rows]
    kappa = float(cohen_kappa_score(human, auto)) if len(set(human) | set(auto)) > 1 else None
    tuned, base, tie = counts.get("tuned", 0), counts.get("baseline", 0), counts.get("tie", 0)
    lead = "tuned" if tuned > base else "baseline" if base > tuned else "neither"
    verdict = (f"people prefer {lead}: tuned {tuned}, baseline {base}, tie {tie} of {len(rows)} rated; "
               f"agreement with the automatic metric {agree:.0%}")
    return {"rated": len(rows), "tuned": tuned, "baseline": base, "tie": tie, "agreement": agree,
            "kappa": None if kappa != kappa else kappa, "seed": rows[0].get("seed"), "verdict": verdict}
