"""Built-in quickstart dataset: synthetic customer-support tickets.

Tickets are written to a fictional hardware company ("Halcyon"). Each row has
a category label and a JSON target ``{"category", "priority", "product"}``.
The priority is learnable from cue phrases (:data:`PRIORITY_CUES`; medium rows
have none). Generation is seeded and deterministic; ordinary rows are kept
pairwise dissimilar (word 3-gram Jaccard < 0.5) and a few data problems are
planted on purpose (exact/near duplicates, an empty row, an overlong row).
With ``preference=True`` every row also gets a ``rejected`` answer: the same
JSON shape with one field plausibly wrong (:func:`rejected_answer`), for DPO
and ORPO on the quickstart data.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter

from labkit.data import ticket_phrases as P
from labkit.data.leakage import jaccard, normalise_text, shingles

__all__ = ["CATEGORIES", "PRIORITIES", "PRODUCTS", "PRIORITY_CUES", "generate_tickets", "rejected_answer"]

CATEGORIES: tuple[str, ...] = ("billing", "technical", "account", "shipping", "feedback")
PRIORITIES: tuple[str, ...] = ("low", "medium", "high", "urgent")
PRODUCTS: tuple[str, ...] = ("Nimbus Router", "Orbit Phone", "Atlas Laptop", "Pulse Earbuds",
                             "Beacon Smart Hub", "Quill Tablet", "Vesta Watch")
PRIORITY_CUES: dict[str, tuple[str, ...]] = {
    "urgent": ("urgent", "asap", "right now", "emergency", "immediately", "as soon as possible",
               "business is down", "losing money", "critical"),
    "high": ("can't use it at all", "completely unusable", "really frustrating", "fixed today",
             "third time", "very disappointed", "fed up"),
    "medium": (),
    "low": ("no rush", "whenever you have time", "when you get a chance", "not a big deal",
            "low priority", "no hurry", "at your convenience", "take your time"),
}
_ORDER_RE = re.compile(r"(HX-|#|A)(\d{5,7})")
_NEAR_MIN, _DIVERSE_MAX = 0.9, 0.5


def _product_variant(product: str, rng: random.Random) -> str:
    first, rest = product.split(" ", 1)
    return rng.choices([product, product.lower(), first, f"{first} {rest.lower()}"], [50, 20, 15, 15])[0]


class _Slots(dict):
    """Slot values for one ticket, drawn lazily on first use."""

    def __init__(self, rng: random.Random, product: str) -> None:
        super().__init__(p=_product_variant(product, rng), first=rng.choice(P.FIRST), last=rng.choice(P.LAST))
        self.rng = rng

    def __missing__(self, key: str) -> str:
        r = self.rng
        cents = lambda: r.choice(["00", "99", "49", f"{r.randint(0, 99):02d}"])
        money = lambda: f"{r.choice('$€£')}{r.randint(5, 1500)}.{cents()}"
        date = lambda: r.choice([f"on {r.choice(P.MONTHS)} {r.randint(1, 28)}", f"on the {r.randint(4, 20)}th",
                                 f"{r.randint(3, 12)} days ago", r.choice(P.DATES)])
        ver = lambda: f"{r.randint(1, 6)}.{r.randint(0, 12)}.{r.randint(0, 30)}"
        makers = {
            "amount": money, "amount2": money, "date": date,
            "date2": lambda: f"{r.choice(P.MONTHS)} {r.randint(1, 28)}",
            "ver": ver, "ver2": ver, "n": lambda: str(r.randint(2, 11)), "pct": lambda: str(r.randint(2, 19) * 5),
            "order": lambda: r.choice([f"HX-{r.randint(100000, 999999)}", f"#{r.randint(1000000, 9999999)}",
                                       f"A{r.randint(10000, 99999)}"]),
            "inv": lambda: f"INV-{r.randint(10000, 99999)}", "last4": lambda: f"{r.randint(0, 9999):04d}",
            "err": lambda: r.choice([f"E-{r.randint(100, 999)}", f"0x{r.randint(4096, 65535):04X}",
                                     f"ERR_{r.choice(['NET', 'PWR', 'AUTH', 'SYNC', 'IO'])}_{r.randint(10, 99)}"]),
            "track": lambda: "1Z" + "".join(r.choice("ABCDEFGHJKLMNPRSTUVWXYZ0123456789") for _ in range(10)),
            "email": lambda: (f"{self['first'].lower()}.{self['last'].lower()}{r.randint(1, 99)}@"
                              f"{r.choice(['mailbox.net', 'example.com', 'inbox.org'])}"),
            "user": lambda: f"{self['first'].lower()}{r.randint(1, 999)}", "relative": lambda: r.choice(P.RELATIVES),
            "serial": lambda: f"HS{r.randint(10 ** 7, 10 ** 8 - 1)}", "city": lambda: r.choice(P.CITIES),
            "street": lambda: f"{r.randint(1, 240)} {r.choice(P.LAST)} {r.choice(['Street', 'Road', 'Lane'])}",
            "courier": lambda: r.choice(P.COURIERS),
        }
        value = makers[key]()
        self[key] = value
        return value


def _casual(sentence: str, rng: random.Random, product: str) -> str:
    """Casual style for a non-cue sentence: abbreviations and at most one letter swap."""
    for pattern, repl in P.CASUAL:
        if rng.random() < 0.6:
            sentence = re.sub(pattern, repl, sentence, flags=re.IGNORECASE)
    words = sentence.split(" ")
    keep = {w.lower() for w in product.split()}
    long_ids = [i for i, w in enumerate(words) if len(w) >= 6 and w.isalpha() and w.lower() not in keep]
    if long_ids and rng.random() < 0.5:
        i = rng.choice(long_ids)
        j = rng.randrange(1, len(words[i]) - 2)
        w = words[i]
        words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
    return " ".join(words)


def _compose(category: str, priority: str, product: str, rng: random.Random) -> str:
    """Write one ordinary ticket (2-5 body sentences, optional greeting/sign-off)."""
    slots = _Slots(rng, product)
    body = rng.sample(P.DETAILS[category], rng.choice([1, 2, 2, 3]))
    if rng.random() < 0.35:
        body.insert(rng.randrange(len(body) + 1), rng.choice(P.CONTEXT))
    body = [s.format_map(slots) for s in [rng.choice(P.OPENINGS[category])] + body[:3]]
    casual = rng.random() < 0.25
    if casual:
        body = [_casual(s, rng, product) for s in body]
    if priority != "medium":
        body.insert(rng.randrange(1, len(body) + 1), rng.choice(P.CUE_SENTENCES[priority]))
    parts = [rng.choice(P.GREETINGS)] if rng.random() < 0.65 else []
    parts.append(" ".join(body))
    if rng.random() < 0.6:
        parts.append(rng.choice(P.SIGNOFFS).format_map(slots))
    text = rng.choice([" ", "\n"]).join(parts)
    return text.lower() if casual and rng.random() < 0.4 else text


def _overlong(category: str, priority: str, product: str, rng: random.Random) -> str:
    """A rambling ticket well over 4000 characters."""
    parts = [rng.choice(P.GREETINGS), rng.choice(P.OPENINGS[category]).format_map(_Slots(rng, product))]
    while sum(len(p) + 1 for p in parts) < 4300:
        pool = rng.choice([P.DETAILS[category], P.DETAILS[category], P.RAMBLES, P.CONTEXT])
        sentence = rng.choice(pool).format_map(_Slots(rng, product))
        if rng.random() < 0.4:
            head = sentence if re.match(r"I\b", sentence) else sentence[0].lower() + sentence[1:]
            sentence = f"{rng.choice(P.CONNECTORS)} {head}"
        parts.append(sentence)
    if priority != "medium":
        parts.insert(rng.randrange(2, len(parts)), rng.choice(P.CUE_SENTENCES[priority]))
    return " ".join(parts) + "\n" + rng.choice(P.SIGNOFFS).format_map(_Slots(rng, product))


def _cues_found(text: str) -> frozenset[str]:
    padded = f" {normalise_text(text)} "
    return frozenset(p for p, cues in PRIORITY_CUES.items() if any(f" {c} " in padded for c in cues))


def _near_copy(text: str, rng: random.Random) -> str | None:
    """A small edit of ``text`` (order number, greeting, sign-off name or an appended thanks), or None.

    None when the edit is not a near duplicate (Jaccard < 0.9 or identical after
    normalisation) or changes the priority cues.
    """
    pieces = re.split(r"(\s+)", text)
    words = [i for i, p in enumerate(pieces) if p and not p.isspace()]
    edit = rng.choice(["order", "first", "last", "append"])
    signed = pieces[words[-1]].strip(".!") in P.FIRST
    new = text if signed else text.rstrip() + rng.choice([" Thanks.", " Thank you!", " Cheers."])
    if edit == "order" and _ORDER_RE.search(text):
        new = _ORDER_RE.sub(lambda m: m.group(1) + str(rng.randint(10 ** (len(m.group(2)) - 1),
                                                                  10 ** len(m.group(2)) - 1)), text, count=1)
    elif edit == "first":
        greeting = next((g for g in P.GREETINGS if text.startswith(g)), "")
        rest = text[len(greeting):] if greeting else " " + text
        new = rng.choice([g for g in P.GREETINGS if g != greeting]) + rest
    elif edit == "last" and signed:  # change the sign-off name
        pieces[words[-1]] = rng.choice(P.FIRST) + rng.choice(["", ".", "!"])
        new = "".join(pieces)
    same_cues = _cues_found(new) == _cues_found(text)
    if normalise_text(new) == normalise_text(text) or not same_cues or jaccard(text, new) < _NEAR_MIN:
        return None
    return new


def _exact_copy(text: str, rng: random.Random) -> str:
    """Same text after normalisation: different case and whitespace only."""
    new = rng.choice([str.lower, str.upper, str.swapcase, lambda s: s])(text)
    new = re.sub(r" ", lambda m: rng.choice([" ", " ", "  ", "\t"]), new)
    return rng.choice(["", " ", "\n"]) + new + rng.choice([" ", "\n", "  \n"])


class _DiversityIndex:
    """Exact incremental check that a shingle set has Jaccard < ``limit`` with every accepted set.

    Uses prefix filtering: under one fixed global order (rarest shingles first,
    by pilot frequency, ties by value), two sets with Jaccard >= limit must share
    an element of their prefixes of length ``|A| - ceil(limit * |A|) + 1``. Only
    prefixes are indexed; candidates are verified with the exact Jaccard.
    """

    def __init__(self, frequency: Counter, limit: float) -> None:
        self.frequency, self.limit = frequency, limit
        self.postings: dict[int, list[int]] = {}
        self.sets: list[frozenset[int]] = []
        self.verified = 0  # exact Jaccard computations: what the prefix filter saves against all pairs

    def add_if_distinct(self, sh: set[int]) -> bool:
        """Add ``sh`` and return True unless it is too similar to an accepted set."""
        ranked = sorted(sh, key=lambda x: (self.frequency.get(x, 0), x))
        prefix = ranked[:len(ranked) - math.ceil(self.limit * len(ranked)) + 1]
        postings, sets, limit, size = self.postings, self.sets, self.limit, len(sh)
        for j in set().union(*[postings[x] for x in prefix if x in postings]):
            self.verified += 1
            inter = len(sh & sets[j])
            if inter >= limit * (size + len(sets[j]) - inter):
                return False
        for x in prefix:
            self.postings.setdefault(x, []).append(len(self.sets))
        self.sets.append(frozenset(sh))
        return True


def _planted_counts(rows: int) -> int:
    """How many exact (and near) duplicates to plant for ``rows`` rows."""
    return max(3, round(rows * 3 / 400)) if rows >= 200 else max(1, rows // 70)


# which field a rejected answer gets wrong: the category and the priority are the usual confusions
_WRONG_FIELD = {"category": 0.4, "priority": 0.4, "product": 0.2}


def rejected_answer(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: the same JSON object with one field wrong.

    The category becomes another category, the priority a neighbouring level (low↔medium↔high↔urgent),
    or the product another product; keys, their order and the formatting are kept, so the pair differs
    only where the answer is wrong.

    Args:
        answer: a reference answer ``json.dumps({"category", "priority", "product"})``.
        rng: the random source (seeded by the caller).
    Returns:
        the rejected answer, never equal to ``answer``.
    """
    obj = json.loads(answer)
    field = rng.choices(list(_WRONG_FIELD), list(_WRONG_FIELD.values()))[0]
    if field == "priority":
        level = PRIORITIES.index(obj["priority"])
        obj["priority"] = PRIORITIES[rng.choice([i for i in (level - 1, level + 1) if 0 <= i < len(PRIORITIES)])]
    else:
        pool = CATEGORIES if field == "category" else PRODUCTS
        obj[field] = rng.choice([v for v in pool if v != obj[field]])
    return json.dumps(obj)


def generate_tickets(rows: int = 400, seed: int = 7, preference: bool = False) -> tuple[list[dict], dict]:
    """Generate the support-ticket dataset.

    Args:
        rows: Total rows, planted problem rows included (at least 10).
        seed: Seed for ``random.Random``; same (rows, seed) gives identical output.
        preference: also give every row a ``rejected`` answer (:func:`rejected_answer`), drawn from
            a second generator seeded by ``seed``, so the other columns are the same either way.

    Returns:
        ``(records, planted)``. Records are ``{"id", "text", "category",
        "answer"}`` with ``answer = json.dumps({"category", "priority",
        "product"})`` (and ``"rejected"`` with ``preference``). ``planted`` maps ``"exact_duplicates"`` and
        ``"near_duplicates"`` to ``[original_id, copy_id]`` pairs and
        ``"empty"`` / ``"overlong"`` to lists of ids.
    """
    if rows < 10:
        raise ValueError("rows must be >= 10")
    rng = random.Random(seed)
    k = _planted_counts(rows)
    n_ord = rows - 2 * k - 2
    cats = [CATEGORIES[i % len(CATEGORIES)] for i in range(n_ord)]
    rng.shuffle(cats)

    pilot = Counter()  # shingle frequencies in a pilot sample: only orders the prefix filter
    for _ in range(min(n_ord // 4, 1000)):
        cat = rng.choice(CATEGORIES)
        pilot.update(shingles(_compose(cat, rng.choice(PRIORITIES), rng.choice(PRODUCTS), rng)))
    index = _DiversityIndex(pilot, _DIVERSE_MAX)
    items: list[dict] = []  # {"text", "category", "priority", "product", "kind", "of"}
    for cat in cats:
        for _ in range(500):
            pri = rng.choices(PRIORITIES, P.PRIORITY_WEIGHTS[cat])[0]
            prod = rng.choice(PRODUCTS)
            text = _compose(cat, pri, prod, rng)
            if index.add_if_distinct(shingles(text)):
                break
        else:
            raise RuntimeError("could not generate a sufficiently distinct ticket")
        items.append({"text": text, "category": cat, "priority": pri, "product": prod, "kind": "ordinary"})

    order = list(range(n_ord))
    rng.shuffle(order)
    near: list[dict] = []
    for i in sorted(order, key=lambda i: len(items[i]["text"].split()) < 30):  # longer originals first
        edits = (_near_copy(items[i]["text"], rng) for _ in range(20))
        new = next((e for e in edits if e is not None), None)
        if new is not None:
            near.append({**items[i], "text": new, "kind": "near", "of": i})
            if len(near) == k:
                break
    else:
        raise RuntimeError("could not plant the near duplicates")
    used = {item["of"] for item in near}
    exact_from = [i for i in order if i not in used][:k]
    planted_items = [{**items[i], "text": _exact_copy(items[i]["text"], rng), "kind": "exact", "of": i}
                     for i in exact_from] + near
    cat, prod = rng.choice(CATEGORIES), rng.choice(PRODUCTS)
    pri = rng.choices(PRIORITIES, P.PRIORITY_WEIGHTS[cat])[0]
    planted_items.append({"text": _overlong(cat, pri, prod, rng), "category": cat, "priority": pri,
                          "product": prod, "kind": "overlong"})
    planted_items.append({"text": rng.choice(["   \n", " ", "\n\n", " \t \n"]), "category": rng.choice(CATEGORIES),
                          "priority": "medium", "product": rng.choice(PRODUCTS), "kind": "empty"})

    sequence = list(range(n_ord))
    for j, item in enumerate(planted_items, start=n_ord):
        items.append(item)
        lo = sequence.index(item["of"]) + 1 if "of" in item else 0
        sequence.insert(rng.randint(lo, len(sequence)), j)

    width = max(4, len(str(rows)))
    ids = {j: f"tk-{pos + 1:0{width}d}" for pos, j in enumerate(sequence)}
    records, planted = [], {"exact_duplicates": [], "near_duplicates": [], "empty": [], "overlong": []}
    for j in sequence:
        item = items[j]
        answer = json.dumps({"category": item["category"], "priority": item["priority"], "product": item["product"]})
        records.append({"id": ids[j], "text": item["text"], "category": item["category"], "answer": answer})
        kind = item["kind"]
        if kind in ("exact", "near"):
            planted[f"{kind}_duplicates"].append([ids[item["of"]], ids[j]])
        elif kind != "ordinary":
            planted[kind].append(ids[j])
    if preference:
        wrong = random.Random(f"tickets-rejected:{seed}")
        for record in records:
            record["rejected"] = rejected_answer(record["answer"], wrong)
    return records, planted
