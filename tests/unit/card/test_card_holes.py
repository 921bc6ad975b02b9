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


@pytest.mark.parametrize("name", ["registry.jsonl", "Registry.torn", "registry", "mlruns", "mlartifacts"])
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
