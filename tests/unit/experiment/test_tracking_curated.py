"""The curated mirror on a real MLflow store and a real W&B offline run: a budget-stopped run with a JSON task's
result files — headline metrics only (no ROUGE, no length ratio, no constant baseline), tables, the baseline once
per experiment, the description, the experiment kind, the status, and a report that is one self-contained page."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from labkit.card.load import load_card
from labkit.core import io
from labkit.core import runs as R
from labkit.experiment.mirror_content import self_contained
from labkit.experiment.tracking import apply_env, mirror_run, mirror_safely, restore_env
from tests.wandb_log import run_records, summary

REPO = Path(__file__).resolve().parents[3]
PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d49444154789c6360"
                    "0000000200010073757c640000000049454e44ae426082")  # a 1x1 PNG
ALL = {"json_valid_rate": 1.0, "field_presence_rate": 1.0, "field_accuracy": 0.6, "exact_match": 0.2, "rouge1": 0.8,
       "rouge2": 0.6, "rougeL": 0.8, "rougeLsum": 0.8, "mean_length_ratio": 0.97, "slot_precision": 0.6,
       "slot_recall": 0.6, "slot_f1": 0.6, "accuracy": 0.5, "macro_f1": 0.4}


def _metrics(scale: float) -> dict:
    per = {c: {**{k: v * scale for k, v in ALL.items()}, "f1": 0.5 * scale, "precision": 0.5, "support": 12}
           for c in ("billing", "shipping", "account")}
    keys = {k: {"slot_precision": 0.5, "slot_recall": 0.4, "slot_f1": 0.45, "support": 30} for k in ("category", "priority")}
    return {"n": 36, "overall": {k: v * scale for k, v in ALL.items()}, "per_category": per, "per_key": keys,
            "rouge": {"use_stemmer": True}}


def _finished_run(tmp_path: Path, tracking: str, variant: str = "tiny-lora") -> R.Run:
    """A run folder as stage 05 leaves it, whose training the budget stopped after 3 of 8 steps."""
    card = tmp_path / f"{variant}.yaml"
    card.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\nexperiment: {{variant: {variant}}}\ntracking: {tracking}\n")
    run = R.new_run(load_card(card), tmp_path / "runs")
    io.write_json(run.dir / "baseline" / "baseline_metrics.json", _metrics(0.1))
    io.write_json(run.dir / "baseline" / "baseline_key.json", {"key": "k1", "cached": False})
    io.write_json(run.dir / "parameter_check" / "fit.json", {"plan": {"steps": 8, "seconds_per_step": 1.5,
                                                                       "train_seconds": 12.0, "rows_per_epoch": 40}})
    io.write_json(run.dir / "training" / "outcome.json", {
        "steps": 3, "metrics": {"train_runtime": 4.0, "train_loss": 9.1}, "budget_exhausted": True, "interrupted": None,
        "cost": {"tokens": 900, "tokens_per_second": 225.0, "mfu": 0.01}})
    tuned = _metrics(1.0)
    tuned["run"] = {"train_seconds": 4.0, "tokens_seen": 900, "tokens_per_second": 225.0, "mfu": 0.01,
                    "flops_convention": "6N", "cost": None}
    io.write_json(run.dir / "comparison" / "tuned_metrics.json", tuned)
    rails = [{"metric": "json_valid_rate", "value": 1.0, "reference": 0.1, "ok": True}] + [
        {"metric": f"per_category_f1[{c}]", "value": v, "reference": 0.05, "ok": True}
        for c, v in (("billing", 0.5), ("shipping", 0.25), ("account", 0.5))]
    io.write_json(run.dir / "comparison" / "verdict.json", {
        "against": "baseline", "confirmed": True, "guardrails": rails,
        "primary": {"metric": "field_accuracy", "reference": 0.06, "tuned": 0.6, "gain": 0.54, "gain_low": 0.4,
                    "gain_high": 0.66, "n": 36},
        "verdict": "CONFIRMED against the baseline: field_accuracy 0.060 → 0.600 (gain +0.540, 95% interval "
                   "[+0.400, +0.660] on n = 36 examples)"})
    R.record(run, "completed", status="completed", stopped_by="budget")
    return run


def _report(tmp_path: Path) -> Path:
    out = tmp_path / "runs" / "smoke" / "_report"
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "loss_curves.png").write_bytes(PNG)
    index = out / "index.html"
    index.write_text('<!doctype html><html><body><h1>smoke</h1><img src="loss_curves.png" alt="loss">'
                     '<img src="https://example.org/x.png"></body></html>')
    return index


def test_the_mlflow_run_is_curated(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    run = _finished_run(tmp_path, "{mlflow: {uri: 'sqlite:///mlflow.db'}}")
    state = mirror_run(run, "sqlite:///mlflow.db", final=True, report=_report(tmp_path))
    client = MlflowClient(state["uri"])
    got = client.get_run(state["run_id"])
    metrics = got.data.metrics
    assert client.get_experiment(state["experiment_id"]).tags["mlflow.experimentKind"] == "custom_model_development"
    assert len(metrics) <= 25, sorted(metrics)
    assert metrics["comparison/field_accuracy"] == 0.6 and metrics["baseline/field_accuracy"] == pytest.approx(0.06)
    assert (metrics["verdict/gain"], metrics["verdict/gain_low"], metrics["verdict/gain_high"]) == (0.54, 0.4, 0.66)
    assert metrics["comparison/json_valid_rate"] == 1.0 and metrics["comparison/per_category_f1.min"] == 0.25
    assert metrics["run/tokens_per_second"] == 225.0 and metrics["training/steps"] == 3
    assert metrics["parameter_check/plan.seconds_per_step"] == 1.5
    assert not [m for m in metrics if "rouge" in m or "length_ratio" in m or "use_stemmer" in m or m.endswith("/n")]
    assert not [m for m in metrics if m.startswith("baseline/") and m != "baseline/field_accuracy"]
    assert "train_runtime" not in metrics and "training/metrics.train_runtime" not in metrics  # the trainer's, once
    assert got.data.params["eval.rouge.use_stemmer"] == "True" and got.data.params["eval.examples.comparison"] == "36"
    # the hypothesis and verdict as the description; budget-stopped as such
    note = got.data.tags["mlflow.note.content"]
    assert "**Hypothesis:** A tiny random Llama" in note and "CONFIRMED against the baseline" in note
    assert "Budget-stopped" in note and "after 3 of 8 steps" in note
    assert got.info.status == "KILLED" and got.data.tags["labkit.status"] == "budget_stopped"
    assert got.data.tags["labkit.stopped_by"] == "budget" and got.data.tags["labkit.steps"] == "3/8"
    # tables: the task's metrics per category and per key; the baseline once
    arts = {a.path for a in client.list_artifacts(state["run_id"], "tables")}
    assert arts == {"tables/per_category.json", "tables/per_key.json", "tables/baseline_k1.json"}
    table = json.loads(Path(client.download_artifacts(state["run_id"], "tables/per_category.json", str(tmp_path))).read_text())
    assert table["columns"] == ["category", "field_accuracy", "json_valid_rate", "f1", "support"]
    assert len(table["data"]) == 3
    # the report: its folder, and one page with the images inside
    assert {a.path for a in client.list_artifacts(state["run_id"], "report")} >= {"report/index.html",
                                                                                  "report/loss_curves.png"}
    page = Path(client.download_artifacts(state["run_id"], "report.html", str(tmp_path))).read_text()
    assert 'src="data:image/png;base64,' in page and 'src="https://example.org/x.png"' in page

    second = _finished_run(tmp_path, "{mlflow: {uri: 'sqlite:///mlflow.db'}}", variant="other")
    other = mirror_run(second, "sqlite:///mlflow.db", final=True)
    assert other["experiment_id"] == state["experiment_id"]
    assert {a.path for a in client.list_artifacts(other["run_id"], "tables")} == {"tables/per_category.json",
                                                                                  "tables/per_key.json"}
    assert client.get_run(other["run_id"]).data.tags["labkit.baseline_run"] == state["run_id"]
    mirror_run(second, "sqlite:///mlflow.db", final=True)  # again: nothing sent twice
    assert len(client.get_metric_history(other["run_id"], "comparison/field_accuracy")) == 1


def test_self_contained_keeps_images_outside_the_folder_as_they_are(tmp_path: Path) -> None:
    index = _report(tmp_path)
    (index.parent.parent / "secret.png").write_bytes(PNG)
    index.write_text(index.read_text() + '<img src="../secret.png">')
    page = self_contained(index)
    assert page.count("data:image/png;base64,") == 1 and 'src="../secret.png"' in page


def test_wandb_offline_gets_the_same_view_and_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "labkit-planted-wandb-key-42"
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_files"))
    monkeypatch.setenv("WANDB_API_KEY", secret)
    run = _finished_run(tmp_path, "{wandb: {project: smoke-tests}}")
    env = mirror_safely(run)
    assert env["WANDB_RUN_ID"] == run.run_id and env["WANDB_PROJECT"] == "smoke-tests" and env["WANDB_MODE"] == "offline"
    apply_env(env)  # as `labkit run` does for the stage kernels, then undoes for the next card
    restore_env()
    assert "WANDB_RUN_ID" not in os.environ and os.environ["WANDB_DIR"] == str(tmp_path / "wandb_files")
    mirror_safely(run, final=True, report=_report(tmp_path))
    monkeypatch.delenv("WANDB_MODE")
    restore_env()  # the final update set nothing: a later card's restore puts back no value of this one
    assert "WANDB_MODE" not in os.environ
    logs = sorted((tmp_path / "wandb_files" / "wandb").glob(f"offline-run-*-{run.run_id}/run-{run.run_id}.wandb"))
    assert logs, list((tmp_path / "wandb_files").rglob("*"))
    values = summary(logs)
    assert values["comparison/field_accuracy"] == 0.6 and values["labkit.status"] == "budget_stopped"
    assert not [k for k in values if "rouge" in k]
    (info,) = run_records(logs)
    assert "**Hypothesis:**" in info.notes and "Budget-stopped" in info.notes and info.project == "smoke-tests"
    assert list(info.tags) == ["budget_stopped"]
    for path in [*(tmp_path / "wandb_files").rglob("*"), *run.dir.rglob("*")]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_the_trainer_reports_to_wandb_only_under_a_mirrored_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from labkit.card.load import load_card as load
    from labkit.train.trainer import report_to

    card = load(REPO / "params" / "smoke.yaml").card
    card = card.model_copy(update={"tracking": card.tracking.model_copy(update={"wandb": True})})
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    assert "wandb" not in report_to(card)
    monkeypatch.setenv("WANDB_RUN_ID", "x")
    assert "wandb" in report_to(card)


def test_tracking_wandb_in_a_card(tmp_path: Path) -> None:
    from labkit.errors import CardError

    def child(body: str) -> Path:
        card = tmp_path / "child.yaml"
        card.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\ntracking: {body}\n")
        return card

    assert load_card(child("{wandb: true}")).card.tracking.wandb_settings().project is None
    got = load_card(child("{wandb: {project: triage, entity: lab}}")).card.tracking.wandb_settings()
    assert (got.project, got.entity) == ("triage", "lab")
    assert load_card(child("{wandb: false}")).card.tracking.wandb_settings() is None
    with pytest.raises(CardError, match="tracking.wandb"):  # no key for a secret: the card is archived
        load_card(child("{wandb: {project: triage, api_key: abc}}"))


def test_wandb_without_a_key_or_a_server_logs_offline_with_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture) -> None:
    import socket

    from labkit.card.tracking import WandbTracking
    from labkit.experiment.tracking_wandb import open_wandb

    with socket.socket() as probe:  # a local port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    run = _finished_run(tmp_path, "{wandb: true}")
    state = open_wandb(run, WandbTracking())
    assert state["mode"] == "offline" and state["project"] == "smoke" and state["dir"] == str(run.root)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no API key" in err[0] and "logged offline" in err[0]
    assert open_wandb(run, WandbTracking()) == state  # decided once per run
    monkeypatch.setenv("WANDB_API_KEY", "labkit-planted-wandb-key-42")
    other = _finished_run(tmp_path, "{wandb: true}", variant="other")
    assert open_wandb(other, WandbTracking())["mode"] == "offline"
    assert "cannot be reached" in capsys.readouterr().err
