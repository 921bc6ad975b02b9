"""Card values that would bend the record: an experiment id labkit uses in the runs folder, credentials in a
tracking URI (archived with every run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from labkit.card.load import load_card
from labkit.errors import CardError


def _child(tmp_path: Path, body: str) -> Path:
    card = tmp_path / "child.yaml"
    card.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\n{body}")
    return card


@pytest.mark.parametrize("name", ["registry.jsonl", "Registry.torn", "registry", "mlruns", "mlartifacts", "wandb"])
def test_experiment_ids_cannot_take_the_runs_folders_own_names(tmp_path: Path, name: str) -> None:
    card = _child(tmp_path, f"experiment: {{id: {name}}}\n")
    with pytest.raises(CardError, match=rf"{card}:2: experiment.id: .*labkit uses in the runs folder"):
        load_card(card)


def test_an_ordinary_id_that_starts_like_one_is_fine(tmp_path: Path) -> None:
    assert load_card(_child(tmp_path, "experiment: {id: registry-triage}\n")).card.experiment.id == "registry-triage"


def test_credentials_in_the_tracking_uri_are_refused_with_the_fix(tmp_path: Path) -> None:
    card = _child(tmp_path, "tracking: {mlflow: {uri: 'https://alice:s3cret@mlflow.example:5000'}}\n")
    with pytest.raises(CardError) as err:
        load_card(card)
    assert "MLFLOW_TRACKING_PASSWORD" in str(err.value) and "s3cret" not in str(err.value)
    assert load_card(_child(tmp_path, "tracking: {mlflow: {uri: 'http://127.0.0.1:5000'}}\n"))


def test_an_inherited_relative_data_path_resolves_against_the_card_that_wrote_it(tmp_path: Path) -> None:
    import json

    import yaml

    parent_dir, child_dir = tmp_path / "shared", tmp_path / "variants"
    parent_dir.mkdir()
    child_dir.mkdir()
    raw = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    raw["data"]["source"] = {"path": "tickets.jsonl"}
    (parent_dir / "base.yaml").write_text(yaml.safe_dump(raw))
    (parent_dir / "tickets.jsonl").write_text(json.dumps({"id": "a", "text": "t", "answer": "{}", "category": "c"}) + "\n")
    (child_dir / "tickets.jsonl").write_text("a different file the child's folder happens to hold\n")
    child = child_dir / "r8.yaml"
    child.write_text("parent: ../shared/base.yaml\nmethod: {r: 8}\n")
    assert load_card(child).card.data.source.path == str(parent_dir / "tickets.jsonl")
    child.write_text("parent: ../shared/base.yaml\ndata: {source: {path: tickets.jsonl}}\n")  # the child names its own
    assert load_card(child).card.data.source.path == str(child_dir / "tickets.jsonl")
