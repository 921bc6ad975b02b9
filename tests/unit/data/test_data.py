"""Data loading, field mapping, cleaning and the split: clear errors, determinism, stratification."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.data import sources as D


def _card(tmp_path: Path, **data_overrides):
    raw = yaml.safe_load((REPO / "params" / "quickstart.yaml").read_text())
    raw["data"].update(data_overrides)
    path = tmp_path / "card.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_card(path).card


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _row(i: int, cat: str = "billing") -> dict:
    return {"id": f"r{i}", "text": f"ticket number {i} about {cat}", "category": cat,
            "answer": json.dumps({"category": cat, "priority": "low", "product": "Orbit Phone"})}


def test_builtin_source_is_deterministic(tmp_path: Path) -> None:
    card = _card(tmp_path)
    a, ida = D.load_source(card.data)
    b, idb = D.load_source(card.data)
    assert [r["text"] for r in a] == [r["text"] for r in b]
    assert ida["planted"] == idb["planted"] and len(a) == 400


def test_split_is_seeded_stratified_and_order_free(tmp_path: Path) -> None:
    card = _card(tmp_path)
    rows = D.map_fields(card.data, D.load_source(card.data)[0])
    rows, _ = D.apply_cleaning(card.data, rows, token_length=lambda r: 10)
    first = D.split_rows(card.data, rows)
    again = D.split_rows(card.data, list(reversed(rows)))
    assert {k: [r["id"] for r in v] for k, v in first.items()} == {k: [r["id"] for r in v] for k, v in again.items()}
    total = Counter(r["category"] for r in rows)
    for cat, n in total.items():
        val = sum(r["category"] == cat for r in first["validation"])
        assert abs(val - n * 0.15) <= 1
    ids = [r["id"] for split in first.values() for r in split]
    assert len(ids) == len(set(ids)) == len(rows)
    other = _card(tmp_path, split={"validation": 0.15, "test": 0.15, "seed": 14, "stratify": "category"})
    assert [r["id"] for r in D.split_rows(other.data, rows)["validation"]] != [r["id"] for r in first["validation"]]


def test_cleaning_rules_report_what_they_removed(tmp_path: Path) -> None:
    card = _card(tmp_path, cleaning=["normalise_whitespace", "drop_empty", {"drop_longer_than_chars": 30},
                                     "drop_exact_duplicates"])
    rows = [{"id": "a", "input": "  hello   there ", "target": "x", "category": "c"},
            {"id": "b", "input": "   \n ", "target": "x", "category": "c"},
            {"id": "c", "input": "x" * 31, "target": "x", "category": "c"},
            {"id": "d", "input": "Hello there", "target": "x", "category": "c"}]
    kept, report = D.apply_cleaning(card.data, rows)
    assert [r["id"] for r in kept] == ["a"] and kept[0]["input"] == "hello there"
    assert [(s["removed"], s["removed_ids"]) for s in report] == [(0, []), (1, ["b"]), (1, ["c"]), (1, ["d"])]
    assert report[0]["changed"] == 2


def test_corrupt_jsonl_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(_row(1)) + "\n{broken\n")
    card = _card(tmp_path, source={"path": str(path)})
    with pytest.raises(D.DataError, match=rf"{path}:2: not valid JSON"):
        D.load_source(card.data)


def test_missing_mapped_field_is_named(tmp_path: Path) -> None:
    rows = [_row(1), {"id": "r2", "text": "hi", "category": "billing"}]
    card = _card(tmp_path, source={"path": str(_jsonl(tmp_path / "d.jsonl", rows))})
    with pytest.raises(D.DataError, match=r"d\.jsonl:2: no field 'answer' \(data\.fields\.target"):
        D.map_fields(card.data, D.load_source(card.data)[0])


def test_category_only_in_validation_is_an_error(tmp_path: Path) -> None:
    rows = [_row(i, "billing") for i in range(20)] + [_row(100 + i, "rare") for i in range(1)]
    card = _card(tmp_path, source={"path": str(_jsonl(tmp_path / "d.jsonl", rows))},
                 split={"validation": 0.2, "test": 0.0, "seed": 1, "stratify": None})
    mapped = D.map_fields(card.data, D.load_source(card.data)[0])
    for seed in range(40):  # find a seed that puts the single 'rare' row into validation
        try:
            D.split_rows(updated(card, {"data.split.seed": seed}).data, mapped)
        except D.DataError as exc:
            assert "'rare' in validation but not in train" in str(exc)
            return
    pytest.fail("no seed put the rare category in validation only")


def test_empty_split_after_cleaning(tmp_path: Path) -> None:
    rows = [{**_row(1), "text": "  "}, {**_row(2), "text": ""}]
    card = _card(tmp_path, source={"path": str(_jsonl(tmp_path / "d.jsonl", rows))})
    with pytest.raises(D.DataError, match="^data.cleaning: drop_empty removed the last 2 rows, so none is left: check"):
        D.apply_cleaning(card.data, D.map_fields(card.data, D.load_source(card.data)[0]), token_length=lambda r: 10)


def test_csv_source_through_datasets(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("id,text,category,answer\n1,hello there,billing,\"{\"\"category\"\": \"\"billing\"\"}\"\n")
    card = _card(tmp_path, source={"path": str(path)})
    rows = D.map_fields(card.data, D.load_source(card.data)[0])
    assert rows == [{"id": "1", "input": "hello there", "target": '{"category": "billing"}', "category": "billing"}]


def test_duplicate_ids_are_refused(tmp_path: Path) -> None:
    card = _card(tmp_path, source={"path": str(_jsonl(tmp_path / "d.jsonl", [_row(1), _row(1)]))})
    with pytest.raises(D.DataError, match="used twice"):
        D.map_fields(card.data, D.load_source(card.data)[0])


def test_rows_hash_changes_with_content() -> None:
    a = [{"id": "1", "input": "x"}]
    assert D.rows_hash(a) == D.rows_hash([dict(a[0])])
    assert D.rows_hash(a) != D.rows_hash([{"id": "1", "input": "y"}])


def test_parquet_source(tmp_path: Path) -> None:
    import pandas as pd

    path = tmp_path / "d.parquet"
    pd.DataFrame([_row(1), _row(2, "shipping")]).to_parquet(path)
    card = _card(tmp_path, source={"path": str(path)})
    rows = D.map_fields(card.data, D.load_source(card.data)[0])
    assert [r["id"] for r in rows] == ["r1", "r2"] and rows[1]["category"] == "shipping"
