"""Checks on prepared data that need only the data and the tokenizer, run by stage 01 before any compute (the data
section's checks that need only the card: `labkit.data.card_checks`).

On the prepared rows:
  * references (`check_references`): every row's reference answer, in every split (the test split too, by
    validity only: its content is never shown or recorded), against the card's `data.target_format`;
  * the category key (`check_category_key`): a JSON card judged by a category metric needs evaluation references
    that hold `data.target_format.category_key`, or the metric reads 0 for every model;
  * encodings (`run_checks`, `raise_on_failed`): every example encoded as training encodes it, checked for
    loss positions, a trained EOS, the prompt-prefix property and truncation. Stage 02 shows the same checks;
    stage 01 runs them first, so a truncation fails before the baseline spends compute, with the same message.
"""

from __future__ import annotations

import json
from typing import Any

from labkit.card.consistency import category_metrics
from labkit.card.schema import Card
from labkit.card.experiment_and_data import Data
from labkit.data.pairs import check_pairs, encode_pairs
from labkit.data.prompting import Encoded, check_encoded, encode_rows
from labkit.errors import DataError, PreprocessingCheckFailed


def _problem(data: Data, row: dict[str, Any], labels: set[str] | None) -> str | None:
    """What is wrong with one row's reference under the card's target format (None when it is fine)."""
    spec, fields = data.target_format, data.fields
    target = row["target"]
    if spec.kind == "label":
        if labels is not None and target.strip() not in labels:
            known = ", ".join(sorted(labels)[:8]) + (" …" if len(labels) > 8 else "")
            return (f"reference label is not in the known label set ({known}); fix the {fields.target!r} value, or "
                    "list the label in data.target_format.labels")
        return None
    if spec.kind != "json":
        return None
    try:
        value = json.loads(target)
    except json.JSONDecodeError:
        return (f"reference is not JSON (data.target_format.kind is json); fix the {fields.target!r} value or "
                "remove the row")
    if not isinstance(value, dict):
        return (f"reference is a JSON {type(value).__name__}, not a JSON object (data.target_format.kind is json); fix "
                f"the {fields.target!r} value or remove the row")
    missing = [k for k in spec.required_keys if k not in value]
    if missing:
        return (f"reference lacks required key(s) {', '.join(map(repr, missing))} (data.target_format.required_keys); "
                f"add them to the {fields.target!r} value or remove the row")
    key = spec.category_key
    if fields.category and key and key in value and row.get("category") is not None \
            and str(value[key]) != str(row["category"]):
        return (f"the {fields.category!r} column (data.fields.category) disagrees with {key!r} inside the reference "
                f"(data.target_format.category_key); make them agree or remove the row")
    return None


def check_references(data: Data, splits: dict[str, list[dict[str, Any]]], where: dict[str, str]) -> dict[str, int]:
    """Check every reference answer of every split against `data.target_format`.

    Args:
        data: the card's data section (target_format, fields).
        splits: {"train", "validation", "test"} -> rows.
        where: row id -> `file:line` (or `source row N`) it was read from.
    Returns:
        rows checked per split (counts only: nothing of the test rows is kept).
    Raises:
        DataError: one line naming the file, line, row id, split and the fix (never the test row's content).
    """
    spec = data.target_format
    labels: set[str] | None = None
    if spec.kind == "label":
        labels = set(spec.labels) if spec.labels is not None else {r["target"].strip() for r in splits.get("train", [])}
    for name, rows in splits.items():
        for row in rows:
            problem = _problem(data, row, labels)
            if problem:
                origin = where.get(row["id"], "data.source")
                raise DataError(f"{origin}: row id {row['id']!r} ({name} split): {problem}")
    return {name: len(rows) for name, rows in splits.items()}


def check_category_key(card: Card, splits: dict[str, list[dict[str, Any]]]) -> None:
    """Refuse a JSON card judged by a category metric whose evaluation references never hold the category key.

    accuracy, macro_f1 and per_category_f1 compare the answer's `data.target_format.category_key` with the category
    column; when no reference of the evaluated split holds that key (the category is a column only), no answer
    trained on them will either, and the metric reads 0 for the base model and every run alike (a guardrail on it
    could never fail).

    Args:
        card: the card (target format, fields, metrics, eval.split).
        splits: rows per split (references already checked by `check_references`).
    Raises:
        DataError: one line naming the metric's key, the category key and the fix.
    """
    fmt, uses = card.data.target_format, category_metrics(card)
    rows = splits.get(card.eval.split) or []
    if fmt.kind != "json" or not fmt.category_key or not uses or not rows:
        return
    if any(fmt.category_key in json.loads(row["target"]) for row in rows):
        return
    key, name = uses[0]
    raise DataError(f"{key}: {name} compares the answer's {fmt.category_key!r} key (data.target_format.category_key) "
                    f"with the {card.data.fields.category!r} column, and no reference answer of the {card.eval.split} "
                    f"split holds that key: {name} would read 0 for every model; set category_key to the JSON key "
                    f"that holds the category (and list it in data.target_format.required_keys), or judge "
                    "field_accuracy instead")


def check_special_tokens(tokenizer: Any, splits: dict[str, list[dict[str, Any]]], where: dict[str, str]) -> None:
    """Refuse an answer that holds the text of a special token (the EOS, an end-of-turn, a pad or BOS token): trained
    on, it teaches a stop, or a turn boundary, in the middle of the answer.

    Args:
        tokenizer: the model's tokenizer (its special and added special tokens).
        splits: rows per split ("target", and "rejected" for preference pairs).
        where: row id → `file:line` of the row.
    Raises:
        DataError: one line naming the row, its split, the token and the fix (never a test row's content).
    """
    special = sorted({t for t in [*tokenizer.all_special_tokens,
                                  *(a.content for a in getattr(tokenizer, "added_tokens_decoder", {}).values()
                                    if getattr(a, "special", False))] if t and t.strip()}, key=len, reverse=True)
    for name, rows in splits.items():
        for row in rows:
            for field in ("target", "rejected"):
                token = next((t for t in special if t in (row.get(field) or "")), None)
                if token:
                    raise DataError(f"{where.get(row['id'], 'data.source')}: row id {row['id']!r} ({name} split): the "
                                    f"{'reference' if field == 'target' else 'rejected answer'} holds the special token "
                                    f"{token!r} (the model would learn to stop or end its turn there); remove it from "
                                    "the data, or drop the row with a cleaning rule")


def run_checks(tokenizer: Any, card: Card, splits: dict[str, list[dict[str, Any]]]) -> tuple[dict[str, list[Encoded]], list[dict[str, Any]]]:
    """Encode every split as training does and run the template/mask checks on each.

    For dpo/orpo cards every row is a preference pair (`labkit.data.pairs.EncodedPair`): both sequences
    are checked, and the two answers must differ.

    Returns:
        (encodings per split, check rows with split, check, ok, failed_ids, explanation).
    """
    encode, check_all = encode_rows, check_encoded
    if card.train.trainer != "sft":
        encode, check_all = encode_pairs, check_pairs
    encoded = {name: encode(tokenizer, card, rows) for name, rows in splits.items()}
    checks = []
    for name, rows in splits.items():
        for check in check_all(tokenizer, rows, encoded[name]):
            checks.append({"split": name, **check, "failed": len(check["failed_ids"]),
                           "failed_ids": check["failed_ids"][:20]})
    return encoded, checks


def raise_on_failed(checks: list[dict[str, Any]]) -> None:
    """Stop the stage when a check failed, naming the check, the offending rows of each split and the fix.

    A check that fails in several splits for the same reason is one entry (its rows per split, the explanation
    once), so every failed check's fix fits on the one line the command prints.

    Args:
        checks: the check rows (split, check, ok, failed, failed_ids, explanation) of `run_checks`.
    Raises:
        PreprocessingCheckFailed: one line, ` | ` between the failed checks.
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for c in checks:
        if not c["ok"]:
            groups.setdefault((c["check"], c["explanation"]), []).append(c)
    if groups:
        lines = []
        for (check, explanation), failed in groups.items():
            where = "; ".join(f"{c['split']}: {c['failed']} row(s) {', '.join(c['failed_ids'][:5])}"
                              if c["failed_ids"] else c["split"] for c in failed)
            lines.append(f'"{check}" fails — {where}: {explanation}')
        raise PreprocessingCheckFailed(" | ".join(lines))
