"""A JSON card judged by a category metric reads the answer's category from `data.target_format.category_key`:
stage 01 (and `labkit check --data`) refuses evaluation references that never hold it, since the metric would then
read 0 for every model (`labkit.data.checks.check_category_key`); references that hold it, even in some rows only,
and cards that judge no category metric pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO

from labkit.card.load import load_card
from labkit.data.checks import check_category_key
from labkit.errors import DataError


def _card(tmp_path: Path, body: str):
    path = tmp_path / "child.yaml"
    path.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\n{body}")
    return load_card(path).card


def _splits(*answers: dict) -> dict[str, list[dict]]:
    rows = [{"id": f"v{i}", "input": "x", "target": json.dumps(a), "category": "billing"} for i, a in enumerate(answers)]
    return {"train": rows, "validation": rows}


WITHOUT = {"priority": "low", "product": "P0"}
KEYS = "data: {target_format: {required_keys: [priority, product], optional_keys: [category]}}\n"


def test_a_category_metric_with_no_reference_holding_the_key_is_refused(tmp_path: Path) -> None:
    card = _card(tmp_path, KEYS)  # smoke.yaml judges per_category_f1
    with pytest.raises(DataError, match=r"experiment\.guardrails\.1\.metric: per_category_f1 compares the answer's "
                                        r"'category' key .* no reference answer of the validation split holds that key"):
        check_category_key(card, _splits(WITHOUT, WITHOUT))


def test_the_key_in_some_references_or_no_category_metric_passes(tmp_path: Path) -> None:
    card = _card(tmp_path, KEYS)
    check_category_key(card, _splits(WITHOUT, {**WITHOUT, "category": "billing"}))  # an optional key, held once
    plain = _card(tmp_path, KEYS + "experiment: {guardrails: [{metric: json_valid_rate, min: 0}]}\n")
    check_category_key(plain, _splits(WITHOUT, WITHOUT))  # field_accuracy alone: the column only groups the rows


def test_only_the_evaluated_split_counts(tmp_path: Path) -> None:
    card = _card(tmp_path, KEYS)
    splits = _splits(WITHOUT)
    splits["train"] = [{**splits["train"][0], "target": json.dumps({**WITHOUT, "category": "billing"})}]
    with pytest.raises(DataError, match="validation split"):
        check_category_key(card, splits)
