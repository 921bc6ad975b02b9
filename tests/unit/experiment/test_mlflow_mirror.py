"""The MLflow mirror on a real local store: an interrupted run, idempotent updates, a failing store only warns."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.card.load import load_card
from labkit.core import io
from labkit.core import runs as R
from labkit.experiment.tracking import flatten, mirror_run, mirror_safely, numbers, tracking_uri

REPO = Path(__file__).resolve().parents[3]


def _run(tmp_path: Path, uri: str) -> R.Run:
    card = tmp_path / "card.yaml"
    card.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\ntracking: {{mlflow: {{uri: '{uri}'}}}}\n")
    return R.new_run(load_card(card), tmp_path / "runs")


def test_flatten_and_numbers() -> None:
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": None}) == {"a.b": 1, "a.c": "[1, 2]", "d": None}
    assert numbers({"overall": {"field_accuracy": 0.5, "n": 3}, "ok": True, "why": "x", "nan": float("nan")},
                   "baseline") == {"baseline/field_accuracy": 0.5, "baseline/n": 3.0, "baseline/ok": 1.0}


def test_relative_uris_are_taken_from_the_runs_folder(tmp_path: Path) -> None:
    assert tracking_uri("sqlite:///mlflow.db", tmp_path) == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert tracking_uri("mlruns", tmp_path) == (tmp_path / "mlruns").as_uri()
    assert tracking_uri("http://host:5000", tmp_path) == "http://host:5000"


def test_an_interrupted_run_is_mirrored_once_and_killed(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    run = _run(tmp_path, "sqlite:///mlflow.db")
    io.write_json(run.dir / "baseline" / "baseline_metrics.json", {"overall": {"field_accuracy": 0.25}})
    state = mirror_run(run, "sqlite:///mlflow.db")
    assert mirror_run(run, "sqlite:///mlflow.db")["run_id"] == state["run_id"]  # one MLflow run per labkit run
    R.record(run, "interrupted", status="interrupted", stage="training")
    mirror_run(run, "sqlite:///mlflow.db", final=True)
    client = MlflowClient(state["uri"])
    got = client.get_run(state["run_id"])
    assert got.info.status == "KILLED" and got.data.tags["labkit.status"] == "interrupted"
    assert got.info.run_name == run.run_id and got.data.params["experiment.variant"] == "tiny-lora"
    assert len(client.get_metric_history(state["run_id"], "baseline/field_accuracy")) == 1  # each file sent once
    assert client.get_experiment(state["experiment_id"]).name == "smoke"
    # artifacts beside the store, not in ./mlruns of whatever folder the command ran in
    assert list((tmp_path / "runs" / "mlartifacts").rglob("card.yaml"))


def test_a_failing_store_warns_one_line_and_never_raises(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "blocked").write_text("a file where the store's folder would be")
    run = _run(tmp_path, "sqlite:///../blocked/mlflow.db")
    assert mirror_safely(run, final=True) == {}
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"labkit: warning: the MLflow mirror of {run.run_id} was not updated")
    assert run.status()["status"] == "running"  # the run itself is untouched


def test_a_replicate_is_mirrored_with_the_seed_it_trained_with(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from labkit.core.replicates import replicates

    card = tmp_path / "card.yaml"
    card.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\nexperiment: {{replicates: 3}}\n"
                    "tracking: {mlflow: {uri: 'sqlite:///mlflow.db'}}\n")
    loaded = load_card(card)
    run = R.new_run(loaded, tmp_path / "runs", replicate=replicates(loaded.card)[1])
    state = mirror_run(run, "sqlite:///mlflow.db")
    params = MlflowClient(state["uri"]).get_run(state["run_id"]).data.params
    assert params["train.seed"] == "43" and params["replicate"] == "2/3" and params["experiment.replicates"] == "3"
