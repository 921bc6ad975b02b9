"""Data sources, field mapping, cleaning rules and the seeded, stratified split.

Rows flow as plain dicts {"id", "input", "target", "category"} (plus "rejected" when the card maps
preference pairs, data.fields.rejected); the file, line or row that a problem comes from is named in
a one-line `DataError`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

from labkit.card.schema import Card
from labkit.card.experiment_and_data import Data, Fields, HubSource, PathSource
from labkit.data import dialogues, tickets
from labkit.data.conversations import is_conversation, read_conversation
from labkit.data.reading import read_file, read_given_splits, read_hub
from labkit.errors import DataError

SPLITS = ("train", "validation", "test")


def sha256_text(text: str) -> str:
    """Hex sha256 of a string."""
    return hashlib.sha256(text.encode()).hexdigest()


def split_sha256(rows: list[dict[str, Any]]) -> str:
    """The sha256 of a prepared split as the data version counts it: every field but the rejected answer.

    The rejected answers are hashed apart (the manifest's `preference` block), so a preference variant
    and an SFT variant of the same rows share one data version and one cached baseline; for rows without
    a rejected answer this is `rows_hash`.
    """
    return rows_hash([{k: v for k, v in row.items() if k != "rejected"} for row in rows])


def rows_hash(rows: list[dict[str, Any]]) -> str:
    """Hex sha256 of rows as canonical JSON lines (the version of a prepared split)."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()


# --------------------------------------------------------------------------- loading
def load_source(data: Data) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Read the card's data source.

    Args:
        data: the card's data section (source: a path source is already absolute; split.from_source).
    Returns:
        (raw rows, identity) where identity records what was read and its hash or revision.
    """
    source = data.source
    if data.split.from_source:
        return read_given_splits(data)
    if isinstance(source, PathSource):
        return read_file(Path(source.path), source.format)
    if isinstance(source, HubSource):
        rows = read_hub(source)
        return rows, {"kind": "hf", "name": source.hf, "revision": source.revision, "config": source.config}

    rows, planted = (dialogues.generate_dialogues(rows=source.rows, seed=source.seed) if source.builtin == "dialogues"
                     else tickets.generate_tickets(rows=source.rows, seed=source.seed, preference=True))
    for number, row in enumerate(rows, 1):
        row["__where__"] = f"builtin:{source.builtin} row {number}"
    return rows, {"kind": "builtin", "name": source.builtin, "rows": source.rows, "seed": source.seed, "planted": planted}


def _same_answer(a: str, b: str) -> bool:
    """Whether two answers are the same: equal text, or equal JSON values (formatting aside)."""
    if a.strip() == b.strip():
        return True
    try:
        return json.loads(a) == json.loads(b)
    except (json.JSONDecodeError, TypeError):
        return False


def map_fields(data: Data, raw: list[dict[str, Any]], origins: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Map raw columns to {"id", "input", "target", "category"} following data.fields (and "rejected"
    when data.fields.rejected names the rejected answer of a preference pair, "group" when data.fields.group names
    the source examples share).

    Args:
        data: the card's data section (fields, split.field).
        raw: the source's rows.
        origins: filled with row id -> `file:line` (or `source row N`) when given.
    Raises:
        DataError: a mapped field is missing, not text or a conversation (a list of role/content turns), or a
            rejected answer equals its chosen answer, naming the row and the card key (data.fields.group included).
    """
    fields = data.fields
    if not raw:
        raise DataError("data.source: the source has no rows")
    keys = ("input", "target", "category") + (("rejected",) if fields.rejected else ())
    out, seen = [], set()
    for number, row in enumerate(raw):
        where = row.get("__where__", f"row {number + 1}")
        mapped: dict[str, Any] = {}
        for key in keys:
            column = getattr(fields, key)
            if column is None:
                mapped[key] = None
                continue
            if column not in row:
                present = ", ".join(k for k in row if k != "__where__")
                raise DataError(f"{where}: no field {column!r} (data.fields.{key}; the row has: {present})")
            value = row[column]
            if key == "input" and data.prompt.conversation:  # the turns before the answer (labkit.data.conversations)
                mapped["input"], answer = read_conversation(value, where, column, column == fields.target,
                                                            bool(data.prompt.system))
                if answer is not None:
                    mapped["target"] = answer
                continue
            if key == "target" and "target" in mapped:  # the conversation's last turn
                continue
            if key != "category" and is_conversation(value):
                fix = ("the answer is text: map a text column, or the input's column to answer with its last turn"
                       if data.prompt.conversation else "set data.prompt.conversation: true to read the turns before "
                       "the answer as the input (docs/cards.md#conversations)")
                raise DataError(f"{where}: field {column!r} (data.fields.{key}) holds a conversation ({len(value)} "
                                f"role/content turns): {fix}")
            if key != "category" and not isinstance(value, str):
                value = json.dumps(value) if isinstance(value, (dict, list)) else value
            if not isinstance(value, str) and not (key == "category" and isinstance(value, (int, bool))):
                raise DataError(f"{where}: field {column!r} must be text, got {type(value).__name__}")
            mapped[key] = str(value) if value is not None else value
        if fields.rejected and mapped["target"].strip() and _same_answer(mapped["target"], mapped["rejected"]):
            raise DataError(f"{where}: the rejected answer ({fields.rejected!r}, data.fields.rejected) equals the chosen "
                            f"answer ({fields.target!r}, data.fields.target): a preference pair needs two different "
                            "answers; fix or remove the row")
        split_field = data.split.field
        if split_field:
            value = str(row.get(split_field, "")).strip().lower()
            if value not in SPLITS:
                raise DataError(f"{where}: field {split_field!r} (data.split.field) is {row.get(split_field)!r}; "
                                f"expected one of {', '.join(SPLITS)}")
            mapped["split"] = value
        elif "__split__" in row:  # data.split.from_source: the source's own split (labkit.data.reading.read_given_splits)
            mapped["split"] = row["__split__"]
        if fields.group:
            if row.get(fields.group) is None:
                present = ", ".join(k for k in row if k != "__where__")
                raise DataError(f"{where}: no field {fields.group!r} (data.fields.group; the row has: {present}): "
                                "name a column every row has, or set data.fields.group: null")
            mapped["group"] = str(row[fields.group])
        row_id = str(row[fields.id]) if fields.id and fields.id in row else f"row-{number + 1}"
        if row_id in seen:
            raise DataError(f"{where}: id {row_id!r} is used twice (ids must be unique, data.fields.id)")
        seen.add(row_id)
        if origins is not None:
            origins[row_id] = where
        out.append({"id": row_id, **mapped})
    return out


# --------------------------------------------------------------------------- cleaning
def _rule_name(rule: Any) -> tuple[str, Any]:
    if isinstance(rule, str):
        return rule, None
    (name, value), = rule.items()
    return name, value


def rule_text(rule: str | dict[str, Any]) -> str:
    """A cleaning rule as the card writes it (`drop_empty`, `{drop_longer_than_tokens: 384}`), from its entry in the
    cleaning report (`apply_cleaning`)."""
    return rule if isinstance(rule, str) else "{" + ", ".join(
        f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in rule.items()) + "}"


def apply_cleaning(data: Data, rows: list[dict[str, Any]],
                   token_length: Callable[[dict[str, Any]], int] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Apply the card's cleaning rules in order.

    Args:
        data: the card's data section (cleaning).
        rows: mapped rows.
        token_length: row -> tokens of the formatted example (needed by drop_longer_than_tokens).
    Returns:
        (kept rows, report) where report lists each rule with the rows it changed or removed.
    """
    report = []
    for rule in data.cleaning:
        name, value = _rule_name(rule)
        before, previous = len(rows), rows
        removed: list[str] = []
        changed = 0
        if name in {"normalise_whitespace", "strip"}:
            new_rows = []
            for row in rows:
                text = " ".join(row["input"].split()) if name == "normalise_whitespace" else row["input"].strip()
                changed += text != row["input"]
                new_rows.append({**row, "input": text})
            rows = new_rows
        elif name == "drop_empty":
            removed = [r["id"] for r in rows if not r["input"].strip() or not r["target"].strip()
                       or ("rejected" in r and not r["rejected"].strip())]
        elif name == "drop_longer_than_chars":
            removed = [r["id"] for r in rows if len(r["input"]) > value]
        elif name == "drop_longer_than_tokens":
            if token_length is None:
                raise DataError("data.cleaning: drop_longer_than_tokens needs the tokenizer")
            removed = [r["id"] for r in rows if token_length(r) > value]
        elif name in {"drop_matching", "keep_matching"}:
            pattern = re.compile(value.pattern)
            keep = name == "keep_matching"
            removed = [r["id"] for r in rows if bool(pattern.search(r[value.field] or "")) != keep]
        elif name == "drop_target_failing_schema":
            removed = [r["id"] for r in rows if not _target_follows(r["target"], value)]
        elif name == "drop_exact_duplicates":
            first: dict[str, str] = {}
            for r in rows:
                key = " ".join(r["input"].split()).casefold()
                if key in first:
                    removed.append(r["id"])
                else:
                    first[key] = r["id"]
        if removed:
            gone = set(removed)
            rows = [r for r in rows if r["id"] not in gone]
        shown = value.model_dump() if hasattr(value, "model_dump") else value
        report.append({"rule": name if value is None else {name: shown}, "rows_before": before,
                       "removed": len(removed), "removed_ids": removed, "changed": changed})
        if before and not rows:  # this rule removed the last rows (token_length caches the lengths it measured)
            raise DataError(f"data.cleaning: {rule_text(report[-1]['rule'])} removed the last {before} rows, so none is left: " + (
                f"the shortest is {min(map(token_length, previous))} tokens; raise N (and data.max_length with it)"
                if name == "drop_longer_than_tokens" else "check the rule and the field mapping"))
    if not rows:
        raise DataError("data.cleaning: no rows left after cleaning (check the rules and the field mapping)")
    for row in rows:
        for key in ("input", "target", "rejected"):
            if key in row and not row[key].strip():
                what = "rejected answer (data.fields.rejected)" if key == "rejected" else key
                raise DataError(f"row id {row['id']!r}: the {what} is empty or whitespace only after cleaning "
                                "(add drop_empty to data.cleaning, or fix the row)")
    return rows, report


def _target_follows(target: str, schema: dict[str, Any]) -> bool:
    """Whether a target parses as JSON and validates against a JSON Schema."""
    import jsonschema  # ~2 s to import (its URI grammar): only cards with a drop_target_failing_schema rule pay it

    try:
        jsonschema.validate(json.loads(target), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


# --------------------------------------------------------------------------- split
def split_rows(data: Data, rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Seeded split into train/validation/test, stratified by category when the card says so.

    The unit of the split is a row, or with `data.fields.group` every row of one group, so that a group stays on one side.
    The units of every stratum (a group's stratum: its most frequent category, ties by name) are ordered by a seeded
    hash of their ids and cut by the card's fractions (rounded, at least one validation unit per stratum of 3+
    units), so the split does not depend on the order of the source rows. With `data.split.field` (a column) or
    `data.split.from_source` (the source's splits) the data's own splits are kept (a group they share is leakage:
    `labkit.data.prepare` applies `data.leakage.policy` to it).

    Returns:
        {"train": [...], "validation": [...], "test": [...]} with rows sorted by id.
    """
    spec = data.split
    if spec.field or spec.from_source:
        given: dict[str, list[dict[str, Any]]] = {
            name: sorted(({k: v for k, v in r.items() if k != "split"} for r in rows if r["split"] == name),
                         key=lambda r: r["id"]) for name in SPLITS}
        return _check_splits(data.fields, given, len(rows))
    stratify = spec.stratify
    if stratify and stratify != "category":
        raise DataError(f"data.split.stratify: {stratify!r}: only 'category' (the mapped category field) or null is supported")
    strata = _split_units(rows, bool(stratify))
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in SPLITS}
    for key in sorted(strata):
        units = sorted(strata[key], key=lambda unit: sha256_text(f"{spec.seed}:{unit[0]}"))
        n = len(units)
        n_val, n_test = round(n * spec.validation), round(n * spec.test)
        if n >= 3:
            n_val = max(n_val, 1)
            n_test = max(n_test, 1) if spec.test > 0 else 0
        for name, chosen in (("validation", units[:n_val]), ("test", units[n_val:n_val + n_test]),
                             ("train", units[n_val + n_test:])):
            out[name] += [row for _, members in chosen for row in members]
    for name in SPLITS:
        out[name].sort(key=lambda r: r["id"])
    return _check_splits(data.fields, out, len(rows), grouped=bool(data.fields.group))


def _split_units(rows: list[dict[str, Any]], stratify: bool) -> dict[str, list[tuple[str, list[dict[str, Any]]]]]:
    """The units of the split by stratum: (row id, [row]), or (group, its rows) for rows carrying a "group"."""
    units: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:  # with data.fields.group every row carries one (map_fields), else none does
        units[row.get("group", row["id"])].append(row)
    strata: dict[str, list[tuple[str, list[dict[str, Any]]]]] = defaultdict(list)
    for key, members in units.items():
        stratum = "all"
        if stratify:
            counts = Counter(str(r.get("category")) for r in members)
            stratum = min(counts, key=lambda c: (-counts[c], c))
        strata[stratum].append((key, members))
    return strata


def groups_across_splits(splits: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The groups (data.fields.group) whose rows lie in more than one split.

    Args:
        splits: split name -> rows (a row carries "group" when the card maps one).
    Returns:
        [{"group": id, "rows": {split: count}}], sorted by group; empty without groups.
    """
    where: dict[str, Counter[str]] = defaultdict(Counter)
    for name, rows in splits.items():
        for row in rows:
            if "group" in row:
                where[row["group"]][name] += 1
    return [{"group": g, "rows": dict(counts)} for g, counts in sorted(where.items()) if len(counts) > 1]


def _check_splits(fields: Fields, out: dict[str, list[dict[str, Any]]], total: int,
                  grouped: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Refuse an empty train or validation split, and a category (`fields.category`) missing from train (`grouped`:
    the seeded split cut whole groups, so the line names the groups that hold it)."""
    for name in ("train", "validation"):
        if not out[name]:
            raise DataError(f"data.split: the {name} split is empty ({total} rows after cleaning; use more data or other fractions)")
    if fields.category:
        train_cats = {r["category"] for r in out["train"]}
        for name in ("validation", "test"):
            missing = sorted({r["category"] for r in out[name]} - train_cats)
            if missing:
                groups = sorted({r["group"] for r in out[name] if r["category"] == missing[0]}) if grouped else []
                held = (f"; its rows lie in {len(groups)} group(s) of data.fields.group (e.g. {groups[0]!r}), and the "
                        "split keeps each group whole, in the stratum of its most frequent category" if groups else "")
                raise DataError(f"data.split: categor{'ies' if len(missing) > 1 else 'y'} {', '.join(map(repr, missing))} "
                                f"in {name} but not in train{held} (add training rows for it or drop it)")
    return out
