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


def test_a_run_archived_with_a_spelling_change_shows_none(tmp_path: Path) -> None:
    """card.diff.yaml of a run made before the fix: the parent's relative path against the child's resolved one."""
    from labkit.experiment.compare import _changed_against_parent

    (tmp_path / "shared").mkdir()
    data = tmp_path / "shared" / "tickets.jsonl"
    other = tmp_path / "variants" / "tickets.jsonl"
    run = tmp_path / "run"
    run.mkdir()
    (run / "card.diff.yaml").write_text(yaml.safe_dump({"parent": str(tmp_path / "shared" / "base.yaml"), "changed": {
        "data.source.path": {"parent": "tickets.jsonl", "card": str(data)},
        "data.source.files": {"parent": {"train": "tickets.jsonl"}, "card": {"train": str(other)}},
        "method.r": {"parent": 16, "card": 8}}}))
    changed = _changed_against_parent(run)["changed"]
    assert changed == {"data.source.files": {"old": {"train": "tickets.jsonl"}, "new": {"train": str(other)}},
                       "method.r": {"old": 16, "new": 8}}  # another file is still a change
