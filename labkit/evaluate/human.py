"""Blind A/B rating by a person, as data: the items, the ratings, the human verdict.

Two sources of answers to the same validation examples are compared: the base model against the tuned one of a
run (sides "baseline" and "tuned"), or two runs' tuned answers, one variant against another
(`labkit.evaluate.ab_session`). A few examples per category are offered (`ab_items`): the prompt and two answers,
A and B, where a seeded coin decides for each item which source is A, and the items are shuffled. What the rater sees
(`rater_view`) holds neither the reference nor the sources; both may be revealed once every item is rated. Each
rating is one line of a ratings file (`save_rating`): the choice, the source it favours, which side was A and which
B, the seed of the shuffle, the item's position and the answers' sources (run ids). `human_verdict` counts the
preferences (the second source's wins, losses and ties against the first, with a Wilson 95% interval of its share of
the decided items, scipy's `binomtest`) and their agreement with the automatic preference (the per-example score
the example tables compare too, `labkit.scoring.metrics.score_key`), with Cohen's kappa (scikit-learn).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from scipy.stats import binomtest
from sklearn.metrics import cohen_kappa_score

from labkit.core import io
from labkit.scoring.metrics import score_key

RATINGS = "human_ratings.jsonl"
CHOICES = ("a", "b", "tie")
SIDES = ("baseline", "tuned")  # the default pair: the base model's answers, then the run's tuned answers


def automatic_preference(first: dict[str, Any], second: dict[str, Any], key: str,
                         names: tuple[str, str] = SIDES) -> str:
    """The source the per-example value `key` favours (names[0] for `first`, names[1] for `second`) or "tie"."""
    diff = float(second[key]) - float(first[key])
    return names[1] if diff > 1e-9 else names[0] if diff < -1e-9 else "tie"


def ab_items(first_rows: list[dict[str, Any]], second_rows: list[dict[str, Any]], seed: int,
             per_category: int = 3, names: tuple[str, str] = SIDES) -> list[dict[str, Any]]:
    """The blind items: up to `per_category` examples of every category, sides and order randomised by `seed`.

    Args:
        first_rows: the first source's scored predictions (the baseline's, stage 01, by default), with id, category,
            input, target, prediction.
        second_rows: the second source's predictions on the same rows (the tuned model's, stage 05).
        seed: the seed of the random order (recorded with every rating).
        per_category: examples per category (all rows when the data has no category).
        names: the two sources' names, in the order of the rows given.
    Returns:
        items {"position", "id", "category", "input", "target", "a", "b", "a_is", "b_is", "automatic"}, in rating
        order; "a_is"/"b_is" name the source shown as A/B.
    """
    if names[0] == names[1]:
        raise ValueError(f"the two sources need different names, not {names!r}")
    rng = random.Random(seed)
    first = {r["id"]: r for r in first_rows}
    key = score_key(second_rows)
    by_category: dict[Any, list[dict[str, Any]]] = {}
    for row in second_rows:
        if row["id"] in first:
            by_category.setdefault(row.get("category"), []).append(row)
    chosen = []
    for category in sorted(by_category, key=str):
        rows = by_category[category]
        chosen += rng.sample(rows, min(per_category, len(rows)))
    rng.shuffle(chosen)
    items = []
    for position, row in enumerate(chosen):
        a_is = rng.choice(names)
        b_is = names[1] if a_is == names[0] else names[0]
        answers = {names[0]: first[row["id"]]["prediction"], names[1]: row["prediction"]}
        items.append({"position": position, "id": row["id"], "category": row.get("category"), "input": row["input"],
                      "target": row["target"], "a": answers[a_is], "b": answers[b_is], "a_is": a_is, "b_is": b_is,
                      "automatic": automatic_preference(first[row["id"]], row, key, names)})
    return items


def rater_view(item: dict[str, Any]) -> dict[str, Any]:
    """What the rater sees of an item before rating it: its position, category, prompt and the answers A and B
    (never the reference, nor which source is A)."""
    return {k: item[k] for k in ("position", "category", "input", "a", "b")}


def _b_is(item: dict[str, Any]) -> str:
    """The source shown as B (items and ratings written before "b_is" was recorded compared baseline and tuned)."""
    return item.get("b_is") or ("tuned" if item["a_is"] == "baseline" else "baseline")


def preferred(item: dict[str, Any], choice: str) -> str:
    """The source a choice favours (its name: "baseline"/"tuned" or a variant's), or "tie"."""
    if choice not in CHOICES:
        raise ValueError(f"choice must be one of {CHOICES}, not {choice!r}")
    if choice == "tie":
        return "tie"
    return item["a_is"] if choice == "a" else _b_is(item)


def save_rating(path: Path, item: dict[str, Any], choice: str, seed: int, rater: str = "",
                sides: tuple[str, str] | list[str] = SIDES, sources: dict[str, Any] | None = None) -> dict[str, Any]:
    """Append one rating to the ratings file (a later rating of the same item replaces it in `human_verdict`).

    Args:
        path: the ratings file (comparison/human_ratings.jsonl of the run, or its `…_vs_<run>.jsonl`).
        item: the rated item (`ab_items`).
        choice: "a", "b" or "tie".
        seed: the seed of the order.
        rater: who rated (free text).
        sides: the two sources' names, first then second (the second's wins are counted against the first).
        sources: where each source's answers come from ({name: {"run", "answers"}}: run ids, paths in the run).
    Returns:
        the line written.
    """
    line = {"time": io.utc_now(), "id": item["id"], "category": item["category"], "position": item["position"],
            "seed": seed, "a_is": item["a_is"], "b_is": _b_is(item), "choice": choice,
            "preferred": preferred(item, choice), "automatic": item["automatic"], "rater": rater,
            "sides": list(sides), "sources": sources or {}}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line, ensure_ascii=False) + "\n")
    return line


def _share(wins: int, losses: int) -> dict[str, float | None]:
    """The second source's share of the decided items with its Wilson 95% interval (None without decided items)."""
    if wins + losses == 0:
        return {"value": None, "low": None, "high": None}
    ci = binomtest(wins, wins + losses).proportion_ci(confidence_level=0.95, method="wilson")
    return {"value": wins / (wins + losses), "low": float(ci.low), "high": float(ci.high)}


def human_verdict(path: Path) -> dict[str, Any] | None:
    """The people's verdict from a ratings file: preferences, and agreement with the automatic metric.

    Args:
        path: a ratings file (`save_rating`).
    Returns:
        {"rated", "sides" [first, second], "counts" {name: n}, "wins", "losses", "ties" (the second source against
        the first), "share" (the second's share of decided items, {value, low, high}: Wilson 95%), "agreement",
        "kappa", "seed", "sources", "verdict"}, plus each source's count under its name ("tuned", "baseline") and
        "tie"; None without ratings.
    """
    if not path.exists():
        return None
    latest = {(r["id"], r.get("rater", "")): r for r in io.read_jsonl(path)}  # the last rating of an item counts
    rows = list(latest.values())
    if not rows:
        return None
    first, second = rows[-1].get("sides") or SIDES
    counts = Counter(r["preferred"] for r in rows)
    agree = sum(r["preferred"] == r["automatic"] for r in rows) / len(rows)
    human, auto = [r["preferred"] for r in rows], [r["automatic"] for r in rows]
    kappa = float(cohen_kappa_score(human, auto)) if len(set(human) | set(auto)) > 1 else None
    wins, losses, tie = counts.get(second, 0), counts.get(first, 0), counts.get("tie", 0)
    share = _share(wins, losses)
    lead = second if wins > losses else first if losses > wins else "neither"
    interval = "" if share["value"] is None else (
        f"; {second} preferred in {share['value']:.0%} of the {wins + losses} decided "
        f"[95% CI {share['low']:.0%}–{share['high']:.0%}]")
    verdict = (f"people prefer {lead}: {second} {wins}, {first} {losses}, tie {tie} of {len(rows)} rated{interval}; "
               f"agreement with the automatic metric {agree:.0%}")
    out = {"rated": len(rows), "sides": [first, second], "counts": {first: losses, second: wins, "tie": tie},
           "wins": wins, "losses": losses, "ties": tie, "share": share, "agreement": agree,
           "kappa": None if kappa != kappa else kappa, "seed": rows[0].get("seed"),
           "sources": rows[-1].get("sources") or {}, "verdict": verdict}
    return {**{first: losses, second: wins, "tie": tie}, **out}
