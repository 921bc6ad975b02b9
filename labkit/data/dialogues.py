"""Built-in dialogue-summary dataset: two speakers, a topic, a reference summary (the shape of DialogSum, offline).

Each dialogue is between two named speakers: the first wants something (a table, a repair, a ticket, a favour) on a
day, the second agrees at a time, offers another day and time, or refuses; the reference summary says who wants
what and the outcome, all of it inferable from the dialogue. Rows are `{"id", "dialogue", "summary", "topic"}`
with eight topics (:data:`TOPICS`). Generation is seeded and deterministic; ordinary dialogues are kept pairwise
below 0.7 word-3-gram Jaccard, and duplicates are planted on purpose for the leakage search: exact copies (case and
whitespace only) and near copies (one closing line added: Jaccard ≥ 0.9, same summary).
"""

from __future__ import annotations

import random
from collections import Counter

from labkit.data import dialogue_phrases as P
from labkit.data.leakage import jaccard, shingles
from labkit.data.tickets import _DiversityIndex, _exact_copy, _planted_counts

__all__ = ["TOPICS", "generate_dialogues"]

TOPICS: tuple[str, ...] = tuple(P.TOPICS)
OUTCOMES = ("agree", "alternative", "decline")
_DIVERSE_MAX, _NEAR_MIN = 0.7, 0.9


def _owned(thing: str, owner: str) -> str:
    """'your drill' as the summary says it: "Ben's drill"."""
    return thing.replace("your ", f"{owner}'s ", 1)


def _compose(topic: str, outcome: str, rng: random.Random) -> tuple[str, str]:
    """One dialogue and its reference summary."""
    spec = P.TOPICS[topic]
    a, b = rng.sample(P.NAMES, 2)
    day, time = rng.choice(P.DAYS), rng.choice(P.TIMES)
    day2 = rng.choice([d for d in P.DAYS if d != day])
    thing = rng.choice(spec["things"])
    slots = {"a": a, "b": b, "day": day, "day2": day2, "time": time, "thing": thing, "cannot": spec["cannot"]}
    lines = [(a, rng.choice(P.GREETINGS)), (b, rng.choice(P.REPLIES))]
    small = rng.choice(P.SMALL_TALK)
    ask = rng.choice(spec["asks"])
    lines.append((a, f"{small} {ask}".strip()))
    want = f"{a} {spec['want'].format(**{**slots, 'thing': _owned(thing, b)})}"
    if outcome == "agree":
        lines.append((b, rng.choice(spec["agree"])))
        lines.append((a, rng.choice(P.ACCEPT)))
        result = f"{b} {spec['agreed'].format(**slots)}."
    elif outcome == "alternative":
        lines.append((b, f"{rng.choice(P.SORRY)} {rng.choice(P.OFFER)}"))
        lines.append((a, rng.choice(P.ACCEPT)))
        result = f"{b} cannot on {day} because {spec['cannot']} and offers {day2} at {time}, which {a} accepts."
    else:
        lines.append((b, rng.choice(P.SORRY)))
        lines.append((a, rng.choice(P.GIVE_UP)))
        result = f"{b} cannot help because {spec['cannot']}, so {a} will look elsewhere."
    lines.append((b, rng.choice(P.CLOSINGS)))
    dialogue = "\n".join(f"{who}: {text.format(**slots)}" for who, text in lines)
    return dialogue, f"{want}. {result}"


def _near_copy(dialogue: str, rng: random.Random) -> str | None:
    """The dialogue with one more closing line by its first speaker (the summary stays true), or None when that is
    not a near duplicate (Jaccard < 0.9)."""
    first = dialogue.split(":", 1)[0]
    new = f"{dialogue}\n{first}: {rng.choice(P.CLOSINGS)}"
    return new if jaccard(dialogue, new) >= _NEAR_MIN else None


def generate_dialogues(rows: int = 300, seed: int = 7) -> tuple[list[dict], dict]:
    """Generate the dialogue-summary dataset.

    Args:
        rows: total rows, planted duplicates included (at least 10).
        seed: seed for ``random.Random``; the same (rows, seed) gives identical output.
    Returns:
        ``(records, planted)``: records are ``{"id", "dialogue", "summary", "topic"}``; ``planted`` maps
        ``"exact_duplicates"`` and ``"near_duplicates"`` to ``[original_id, copy_id]`` pairs, and ``"empty"`` and
        ``"overlong"`` to empty lists (none planted: the keys stage 02 compares with the ticket generator's).
    """
    if rows < 10:
        raise ValueError("rows must be >= 10")
    rng = random.Random(f"dialogues:{seed}")
    k = _planted_counts(rows)
    n_ord = rows - 2 * k
    topics = [TOPICS[i % len(TOPICS)] for i in range(n_ord)]
    rng.shuffle(topics)
    pilot: Counter = Counter()  # shingle frequencies of a pilot sample: only orders the prefix filter
    for _ in range(min(n_ord // 4, 500)):
        pilot.update(shingles(_compose(rng.choice(TOPICS), rng.choice(OUTCOMES), rng)[0]))
    index = _DiversityIndex(pilot, _DIVERSE_MAX)
    items: list[dict] = []
    for topic in topics:
        for _ in range(500):
            dialogue, summary = _compose(topic, rng.choices(OUTCOMES, (5, 3, 2))[0], rng)
            if index.add_if_distinct(shingles(dialogue)):
                break
        else:
            raise RuntimeError("could not generate a sufficiently distinct dialogue")
        items.append({"dialogue": dialogue, "summary": summary, "topic": topic, "kind": "ordinary"})

    order = list(range(n_ord))
    rng.shuffle(order)
    near = []
    for i in order:
        new = _near_copy(items[i]["dialogue"], rng)
        if new is not None:
            near.append({**items[i], "dialogue": new, "kind": "near", "of": i})
            if len(near) == k:
                break
    else:
        raise RuntimeError("could not plant the near duplicates")
    used = {item["of"] for item in near}
    exact = [{**items[i], "dialogue": _exact_copy(items[i]["dialogue"], rng), "kind": "exact", "of": i}
             for i in [i for i in order if i not in used][:k]]

    sequence = list(range(n_ord))
    for j, item in enumerate(exact + near, start=n_ord):
        items.append(item)
        sequence.insert(rng.randint(sequence.index(item["of"]) + 1, len(sequence)), j)
    width = max(4, len(str(rows)))
    ids = {j: f"dlg-{pos + 1:0{width}d}" for pos, j in enumerate(sequence)}
    records, planted = [], {"exact_duplicates": [], "near_duplicates": [], "empty": [], "overlong": []}
    for j in sequence:
        item = items[j]
        records.append({"id": ids[j], "dialogue": item["dialogue"], "summary": item["summary"], "topic": item["topic"]})
        if item["kind"] != "ordinary":
            planted[f"{item['kind']}_duplicates"].append([ids[item["of"]], ids[j]])
    return records, planted
