"""A run mirrored into MLflow (card key `tracking.mlflow.uri`): the curated view of `labkit.experiment.mirror_content`.

One MLflow experiment per labkit experiment id, tagged for classic model training (`mlflow.experimentKind`, else
MLflow 3 opens it in its GenAI view); one MLflow run per labkit run (tagged `labkit.run_id`). `mirror_run` is safe
to call again: the card as parameters (sent once), the headline metrics (each value once; the trainer's step metrics
come from its own callback), the description, the status, and at the end the tables, the notebooks, the verdict and
the experiment's report (its folder, and one self-contained page that MLflow's viewer renders). What was sent is kept
in `tracking/mlflow.json` in the run folder.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from labkit.core import io
from labkit.core import runs as R
from labkit.core.replicates import read_replicate
from labkit.experiment import mirror_content as C

STATE = "tracking/mlflow.json"
MLFLOW_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_MAX_LOG_PARAMS")
STATUS = {"running": "RUNNING", "completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED",
          "budget_stopped": "KILLED"}  # budget-stopped: ended, but not the finished run its card planned
# MLflow 3's experiment kinds (its web UI's ExperimentKind): "custom_model_development" is "Machine learning"
KIND_TAG, KIND = "mlflow.experimentKind", "custom_model_development"
NOTE_TAG = "mlflow.note.content"  # the run's description in the MLflow UI


def tracking_uri(uri: str, root: Path) -> str:
    """The MLflow tracking URI of a card's `tracking.mlflow.uri`: a URI as it is, a plain path (relative to the
    runs root) as a file URI, `sqlite:///relative.db` relative to the runs root."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str((root / uri.removeprefix("sqlite:///")).resolve())
    if "://" in uri or uri.startswith("file:"):
        return uri
    return (root / Path(uri).expanduser()).resolve().as_uri()


def artifact_root(uri: str) -> str | None:
    """Where a new MLflow experiment keeps its artifacts: next to a SQLite store (`mlartifacts/`; MLflow's default
    would be ./mlruns under whatever folder the command ran in), else the store's own default (None)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return None


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.ERROR)  # store migrations and deprecations: not the user's concern
    return MlflowClient(tracking_uri=uri)


def open_mirror(run: R.Run, uri: str) -> dict[str, Any]:
    """The run's mirror state, creating its MLflow experiment (tagged for classic training) and run on first use.

    Args:
        run: the labkit run.
        uri: the card's tracking.mlflow.uri.
    Returns:
        {"uri", "experiment_id", "run_id", "sent", "metrics", "status"}, also saved in the run's tracking/mlflow.json.
    """
    path = run.dir / STATE
    state = io.read_json(path) if path.exists() else {}
    full = tracking_uri(uri, run.root)
    if state.get("uri") == full and state.get("run_id"):
        return state
    client = _client(full)
    found = client.get_experiment_by_name(run.experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(
        run.experiment, artifact_location=artifact_root(full), tags={KIND_TAG: KIND})
    if found and found.tags.get(KIND_TAG) != KIND:  # made by an older labkit, or by hand
        client.set_experiment_tag(experiment_id, KIND_TAG, KIND)
    status = run.status()
    created = client.create_run(experiment_id, run_name=run.run_id, tags={
        "labkit.run_id": run.run_id, "labkit.experiment": run.experiment, "labkit.variant": str(status.get("variant")),
        "labkit.run_dir": str(run.dir), "labkit.mode": str(status.get("mode"))})
    state = {"uri": full, "experiment_id": experiment_id, "run_id": created.info.run_id, "sent": {}, "metrics": {},
             "status": None}
    io.write_json(path, state)
    return state


def run_params(run: R.Run, card: dict[str, Any]) -> dict[str, str]:
    """The run's parameters: the resolved card flattened (settings such as eval.rouge.use_stemmer among them), the
    data version, the replicate's seed, and how many examples the evaluation scored."""
    params = {k: "" if v is None else str(v)[:6000] for k, v in C.flatten(card).items()}
    manifest = run.dir / "data_manifest.json"
    if manifest.exists() and (version := io.read_json(manifest).get("data_version")):
        params["data_version"] = str(version)
    if replicate := read_replicate(run.dir):  # the seed this replicate trained with (card.yaml keeps the card's)
        params.update({"train.seed": str(replicate["seed"]), "replicate": f"{replicate['index']}/{replicate['of']}"})
    for name in ("baseline/baseline_metrics.json", "comparison/tuned_metrics.json"):
        if (run.dir / name).exists() and (n := io.read_json(run.dir / name).get("n")) is not None:
            params[f"eval.examples.{name.split('/')[0]}"] = str(n)
    return params


def mirror_run(run: R.Run, uri: str, final: bool = False, report: Path | None = None) -> dict[str, Any]:
    """Bring a run's MLflow mirror up to date: parameters, headline metrics, description and status; with `final`,
    the tables, baseline (once per baseline key), notebooks, verdict and report as artifacts.

    Args:
        run: the labkit run.
        uri: the card's tracking.mlflow.uri.
        final: the run has ended (completed, failed or interrupted): send the artifacts too.
        report: the experiment's report page (index.html), when one was built.
    Returns:
        the mirror state (MLflow run id, what was sent).
    """
    from mlflow.entities import Metric, Param, RunTag

    state = open_mirror(run, uri)
    client = _client(state["uri"])
    mlflow_run = state["run_id"]
    card = C.read_card(run)
    known = client.get_run(mlflow_run).data.params
    params = [Param(k, v) for k, v in run_params(run, card).items() if k not in known]  # a parameter is sent once
    sent = state.setdefault("metrics", {})
    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, 0) for k, v in C.headline(run.dir, card).items() if sent.get(k) != v]
    sent.update({m.key: m.value for m in metrics})
    labkit_state = C.run_state(run)
    tags = [RunTag("labkit.status", labkit_state["status"]), RunTag(NOTE_TAG, C.description(run, card)),
            RunTag("labkit.card_hash", str(run.status().get("card_hash")))]
    if (version := params_value(params, known, "data_version")) is not None:
        tags.append(RunTag("labkit.data_version", version))
    if labkit_state["status"] == "budget_stopped":
        tags += [RunTag("labkit.stopped_by", "budget"), RunTag("labkit.steps", f"{labkit_state['steps']}/"
                                                                               f"{labkit_state['planned'] or '?'}")]
    if labkit_state.get("error"):
        tags.append(RunTag("labkit.error", str(labkit_state["error"])[:5000]))
    for start in range(0, max(len(params), len(metrics), 1), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(mlflow_run, metrics=metrics[start:start + 100], params=params[start:start + 100],
                         tags=tags if start == 0 else [])
    if final:
        _artifacts(client, run, card, state, report)
    mlflow_status = STATUS.get(labkit_state["status"], "RUNNING")
    if final and mlflow_status != "RUNNING":
        client.set_terminated(mlflow_run, mlflow_status)
    elif client.get_run(mlflow_run).info.status != "RUNNING":  # the trainer's own MLflow callback ended it
        client.update_run(mlflow_run, status="RUNNING")
    state["status"] = mlflow_status
    io.write_json(run.dir / STATE, state)
    return state


def params_value(new: list[Any], known: dict[str, str], name: str) -> str | None:
    """A parameter's value, among those being sent or those MLflow already has."""
    return next((p.value for p in new if p.key == name), known.get(name))


def _artifacts(client: Any, run: R.Run, card: dict[str, Any], state: dict[str, Any], report: Path | None) -> None:
    """The run's tables, the baseline table (when no run of this experiment sent it yet), notebooks, card, verdict,
    ratings and the experiment's report."""
    mlflow_run = state["run_id"]
    for name, rows in C.tuned_tables(run.dir, card).items():
        client.log_table(mlflow_run, data=_columns(rows), artifact_file=f"tables/{name}.json")
    if baseline := C.baseline_table(run.dir, card):
        key, rows = baseline
        tag = f"labkit.baseline.{key}"
        holder = client.get_experiment(state["experiment_id"]).tags.get(tag)
        if holder in (None, mlflow_run):  # the baseline once per experiment (and key): in the first run that had it
            client.log_table(mlflow_run, data=_columns(rows), artifact_file=f"tables/baseline_{key}.json")
            client.set_experiment_tag(state["experiment_id"], tag, mlflow_run)
            holder = mlflow_run
        client.set_tag(mlflow_run, "labkit.baseline_key", key)
        client.set_tag(mlflow_run, "labkit.baseline_run", holder)
    for notebook in sorted((run.dir / "notebooks").glob("*.ipynb")):
        client.log_artifact(mlflow_run, str(notebook), "notebooks")
    for name in ("card.yaml", "comparison/verdict.json", "comparison/human_ratings.jsonl"):
        if (run.dir / name).exists():
            client.log_artifact(mlflow_run, str(run.dir / name), str(Path(name).parent).strip("."))
    if report is not None and report.exists():
        with tempfile.TemporaryDirectory() as tmp:
            copy = report_copy(report, run.run_id, Path(tmp))
            client.log_artifacts(mlflow_run, str(copy), "report")
            single = Path(tmp) / "report.html"
            single.write_text(C.self_contained(report), encoding="utf-8")
            client.log_artifact(mlflow_run, str(single))


def report_copy(index: Path, run_id: str, into: Path) -> Path:
    """The part of the experiment's report folder a run carries: its index page, plots and data, and this run's own
    notebook pages (`runs/<run_id>/`; other runs carry theirs).

    Args:
        index: the report's index.html.
        run_id: the run.
        into: a scratch folder.
    Returns:
        the copied folder.
    """
    out = into / "report"
    out.mkdir(parents=True)
    for path in index.parent.iterdir():
        if path.is_file() and path.name != "screenshot.png":
            shutil.copy2(path, out / path.name)
    pages = index.parent / "runs" / run_id
    if pages.is_dir():
        shutil.copytree(pages, out / "runs" / run_id)
    return out


def _columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Table rows as the columns `MlflowClient.log_table` takes (a missing cell is None)."""
    names = list(dict.fromkeys(k for row in rows for k in row))
    return {name: [row.get(name) for row in rows] for name in names}
