"""Sources that come with their splits (`data.split.from_source`): one file per split, a hub data set's splits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from labkit.card.load import load_card
from labkit.core import runs as R
from labkit.data import reading
from labkit.data import sources as D
from labkit.data.prepare import derive_splits, prepare
from labkit.errors import CardError, DataError, LeakageError
from labkit.experiment.final import open_test_split


def _answer(i: int) -> str:
    return json.dumps({"category": "billing", "priority": "low", "product": f"P{i % 3}"})


def _write(folder: Path, name: str, rows: list[dict]) -> Path:
    path = folder / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(prefix: str, n: int, start: int = 0) -> list[dict]:
    words = ["invoice", "refund", "login", "printer", "delivery", "password", "upgrade", "screen", "battery", "router",
             "account", "coupon", "shipping", "warranty", "cable", "license", "tablet", "camera"]
    return [{"id": f"{prefix}{i}", "category": "billing", "answer": _answer(i),
             "text": f"{prefix} ticket {i}: the {words[i % len(words)]} broke after {words[(i * 7 + 3) % len(words)]} "
                     f"number {i * 13 + start} went wrong"} for i in range(start, start + n)]


def _card(folder: Path, data: dict) -> Path:
    raw = yaml.safe_load((REPO / "params" / "quickstart.yaml").read_text())
    raw["model"] = {"source": "tiny:llama", "dtype": "float32"}
    raw["data"].update(data)
    path = folder / "card.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _files_card(folder: Path, **extra) -> Path:
    _write(folder, "tr.jsonl", _rows("t", 12))
    _write(folder, "dev.jsonl", _rows("v", 4))
    _write(folder, "held.jsonl", _rows("h", 4))
    return _card(folder, {"source": {"files": {"training": "tr.jsonl", "dev": "dev.jsonl", "held": "held.jsonl"}},
                          "split": {"from_source": {"train": "training", "validation": "dev", "test": "held"}}, **extra})


@pytest.fixture
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model.location)


def test_files_source_keeps_each_file_as_its_split_and_hashes_them(tmp_path: Path, tok, tiny_model) -> None:
    loaded = load_card(_files_card(tmp_path))
    derived = derive_splits(loaded.card, tok)
    assert {n: sorted(r["id"] for r in rows) for n, rows in derived.splits.items()} == {
        "train": sorted(f"t{i}" for i in range(12)), "validation": [f"v{i}" for i in range(4)],
        "test": [f"h{i}" for i in range(4)]}
    assert derived.source["kind"] == "files" and set(derived.source["files"]) == {"training", "dev", "held"}
    assert derived.source["files"]["dev"]["sha256"] == reading.file_sha256(tmp_path / "dev.jsonl")
    run = R.new_run(loaded, tmp_path / "runs")
    manifest = prepare(loaded.card, run, tok, tiny_model.revision)
    assert manifest["split"]["sizes"] == {"train": 12, "validation": 4, "test": 4}
    assert manifest["split"]["spec"]["from_source"] == {"train": "training", "validation": "dev", "test": "held"}
    assert not (run.dir / "data" / "test.jsonl").exists()  # the test split stays locked
    assert manifest["split"]["sha256"]["test"] == D.split_sha256(derived.splits["test"])
    # `labkit final`'s one way to the test rows re-derives them from the files and checks them against the manifest
    assert [r["id"] for r in open_test_split(run, tok)] == [f"h{i}" for i in range(4)]
    _write(tmp_path, "held.jsonl", _rows("h", 3))
    with pytest.raises(DataError, match="the data changed since the run"):
        open_test_split(run, tok)
    _write(tmp_path, "held.jsonl", _rows("h", 4))

    # moving one row from the validation file to the test file changes the splits' hashes and the data version
    other = tmp_path / "moved"
    other.mkdir()
    _write(other, "tr.jsonl", _rows("t", 12))
    _write(other, "dev.jsonl", _rows("v", 3))
    _write(other, "held.jsonl", _rows("h", 4) + _rows("v", 1, start=3))
    card2 = yaml.safe_load((tmp_path / "card.yaml").read_text())
    (other / "card.yaml").write_text(yaml.safe_dump(card2))
    loaded2 = load_card(other / "card.yaml")
    manifest2 = prepare(loaded2.card, R.new_run(loaded2, other / "runs"), tok, tiny_model.revision)
    assert manifest2["split"]["sizes"] == {"train": 12, "validation": 3, "test": 5}
    assert manifest2["data_version"] != manifest["data_version"]
    assert manifest2["split"]["sha256"]["train"] == manifest["split"]["sha256"]["train"]


def test_leakage_search_runs_across_given_splits(tmp_path: Path, tok) -> None:
    _write(tmp_path, "tr.jsonl", _rows("t", 12))
    _write(tmp_path, "dev.jsonl", _rows("v", 3) + [{**_rows("t", 12)[5], "id": "copy-of-t5"}])
    _write(tmp_path, "held.jsonl", _rows("h", 4))
    files = {"training": "tr.jsonl", "dev": "dev.jsonl", "held": "held.jsonl"}
    mapping = {"train": "training", "validation": "dev", "test": "held"}
    card = load_card(_card(tmp_path, {"source": {"files": files}, "split": {"from_source": mapping}})).card
    derived = derive_splits(card, tok)
    assert derived.leakage["dropped_from_train"] == ["t5"]
    assert "copy-of-t5" in {r["id"] for r in derived.splits["validation"]}
    card = load_card(_card(tmp_path, {"source": {"files": files}, "split": {"from_source": mapping},
                                      "leakage": {"policy": "fail"}})).card
    with pytest.raises(LeakageError, match="validation:copy-of-t5|train:t5"):
        derive_splits(card, tok)


def test_from_source_card_errors_name_the_key(tmp_path: Path) -> None:
    _files_card(tmp_path)
    files = {"training": "tr.jsonl", "dev": "dev.jsonl"}
    cases = [
        ({"source": {"files": files}}, "data.split.from_source: a files source keeps its files as splits"),
        ({"source": {"files": files}, "split": {"from_source": {"train": "training", "validation": "valid"}}},
         "'valid' is not a key of data.source.files"),
        ({"source": {"files": files}, "split": {"from_source": {"train": "training"}}}, "needs at least train and validation"),
        ({"source": {"files": {**files, "x": "missing.jsonl"}}, "split": {"from_source": {"train": "training", "validation": "dev"}}},
         "data.source.files.x: file not found: missing.jsonl"),
        ({"split": {"from_source": {"train": "train", "validation": "validation"}}},
         "applies to a hub source .* or a files source"),
        ({"source": {"hf": "acme/dialogs", "revision": "a" * 40, "split": "train"},
          "split": {"from_source": {"train": "train", "validation": "validation"}}}, "data.source.split: .* remove"),
        ({"source": {"files": files}, "split": {"from_source": {"train": "training", "validation": "training"}}},
         "two splits name the same source split"),
    ]
    for data, message in cases:
        with pytest.raises(CardError, match=message) as info:
            load_card(_card(tmp_path, data))
        assert "\n" not in str(info.value) and str(tmp_path / "card.yaml") in str(info.value)


def test_hub_split_mapping_through_datasets_own_loader(tmp_path: Path, tok) -> None:
    """The hub branch reads each mapped split with datasets.load_dataset; here from a local copy of a data set laid
    out as on the hub (one file per split), since the tests never reach the hub."""
    copy = tmp_path / "dialogsum-copy"
    copy.mkdir()
    for name, rows in {"train": _rows("t", 12), "validation": _rows("v", 4), "test": _rows("h", 4)}.items():
        _write(copy, f"{name}.jsonl", rows)
    revision = "a" * 40
    card = load_card(_card(tmp_path, {"source": {"hf": "acme/dialogs", "revision": revision},
                                      "split": {"from_source": {"train": "train", "validation": "test",
                                                                "test": "validation"}}})).card
    rows, identity = reading.read_given_splits(card.data, hub_path=str(copy))
    assert identity == {"kind": "hf", "name": "acme/dialogs", "revision": revision, "config": None,
                        "from_source": {"train": "train", "validation": "test", "test": "validation"}}
    mapped = D.map_fields(card.data, rows)
    splits = D.split_rows(card.data, mapped)
    assert sorted(r["id"] for r in splits["validation"]) == [f"h{i}" for i in range(4)]  # the mapping, as given
    assert sorted(r["id"] for r in splits["test"]) == [f"v{i}" for i in range(4)]
    assert f"hf:acme/dialogs@{revision[:12]} train row 1" in {r["__where__"] for r in rows}
