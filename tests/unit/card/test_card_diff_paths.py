"""A card's diff against its parent compares resolved sources, not spellings: an inherited relative data path, or
the same file named from another folder, is no change; a different file is one, both sides resolved."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from labkit.card.load import load_card

REPO = Path(__file__).resolve().parents[3]


def test_the_diff_compares_resolved_paths(tmp_path: Path) -> None:
    parent_dir, child_dir = tmp_path / "shared", tmp_path / "variants"
    parent_dir.mkdir()
    child_dir.mkdir()
    raw = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    raw["data"]["source"] = {"path": "tickets.jsonl"}
    (parent_dir / "base.yaml").write_text(yaml.safe_dump(raw))
    row = json.dumps({"id": "a", "text": "t", "answer": "{}", "category": "c"}) + "\n"
    (parent_dir / "tickets.jsonl").write_text(row)
    (child_dir / "tickets.jsonl").write_text(row)
    child = child_dir / "r8.yaml"
    child.write_text("parent: ../shared/base.yaml\nmethod: {r: 8}\n")  # inherits the parent's relative path
    assert set(load_card(child).diff) == {"method.r"}
    child.write_text("parent: ../shared/base.yaml\nmethod: {r: 8}\ndata: {source: {path: ../shared/tickets.jsonl}}\n")
    assert set(load_card(child).diff) == {"method.r"}  # the same file, spelled from the child's folder
    child.write_text("parent: ../shared/base.yaml\ndata: {source: {path: tickets.jsonl}}\n")  # another file
    assert load_card(child).diff == {"data.source.path": {"parent": str(parent_dir / "tickets.jsonl"),
                                                          "card": str(child_dir / "tickets.jsonl")}}
