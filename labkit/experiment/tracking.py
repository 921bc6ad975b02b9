"""The registry's runs mirrored into MLflow (card key `tracking.mlflow.uri`), so `mlflow ui` lists and compares them.

One MLflow experiment per labkit experiment id, one MLflow run per labkit run (tagged `labkit.run_id`). The mirror
is brought up to date by `mirror_run`, which `labkit run` calls after every stage and when the run ends —
completed, failed or interrupted — and which is safe to call again: the card's parameters (flattened), the data
version, the metrics of stages 01, 03 and 05 (each file once), the status, and at the end the executed notebooks,
the verdict and the experiment's report as artifacts. What was already sent is kept in `tracking/mlflow.json` in
the run folder. The run folder and the registry stay the record; the mirror is a view of them.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from labkit.core import io
from labkit.core import runs as R
from labkit.core.replicates import read_replicate
from labkit.core.secrets import redact
from labkit.stages import records


STATE = "tracking/mlflow.json"
MLFLOW_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_MAX_LOG_PARAMS")
STATUS = {"running": "RUNNING", "completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
# the stage files whose numbers become MLflow metrics, under the stage's name
METRIC_FILES = {"baseline": f"baseline/{records.BASELINE_METRICS}", "parameter_check": f"parameter_check/{records.FIT}",
                "memory": f"parameter_check/{records.MEMORY}", "comparison": f"comparison/{records.TUNED_METRICS}",
                "verdict": f"comparison/{records.VERDICT}", "training": f"training/{records.OUTCOME}"}


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


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested card or result as {"a.b.c": leaf}; lists are kept whole (as JSON)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(flatten(sub, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): json.dumps(value) if isinstance(value, list) else value}


def numbers(value: Any, prefix: str) -> dict[str, float]:
    """The finite numbers of a result file as metrics ("baseline/field_accuracy", …); booleans as 0/1."""
    out = {}
    for key, leaf in flatten(value, prefix + "/").items():
        if isinstance(leaf, bool):
            out[key] = float(leaf)
        elif isinstance(leaf, (int, float)) and leaf == leaf and abs(leaf) != float("inf"):
            out[key] = float(leaf)
    return {k.replace(" ", "_").replace("/overall.", "/"): v for k, v in out.items()}


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.ERROR)  # store migrations and deprecations: not the user's concern
    return MlflowClient(tracking_uri=uri)


def open_mirror(run: R.Run, uri: str) -> dict[str, Any]:
    """The run's mirror state, creating its MLflow experiment and run on first use.

    Args:
        run: the labkit run.
        uri: the card's tracking.mlflow.uri.
    Returns:
        {"uri", "experiment_id", "run_id", "sent": {file: mtime}, "status"}, also saved in the run's tracking/mlflow.json.
    """
    path = run.dir / STATE
    state = io.read_json(path) if path.exists() else {}
    full = tracking_uri(uri, run.root)
    if state.get("uri") == full and state.get("run_id"):
        return state
    client = _client(full)
    found = client.get_experiment_by_name(run.experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(run.experiment,
                                                                                artifact_location=artifact_root(full))
    status = run.status()
    created = client.create_run(experiment_id, run_name=run.run_id, tags={
        "labkit.run_id": run.run_id, "labkit.experiment": run.experiment, "labkit.variant": str(status.get("variant")),
        "labkit.run_dir": str(run.dir), "labkit.mode": str(status.get("mode"))})
    state = {"uri": full, "experiment_id": experiment_id, "run_id": created.info.run_id, "sent": {}, "status": None}
    io.write_json(path, state)
    return state


def mirror_run(run: R.Run, uri: str, final: bool = False, report: Path | None = None) -> dict[str, Any]:
    """Bring a run's MLflow mirror up to date: parameters, data version, new metric files, status; with `final`, the
    notebooks, verdict and report as artifacts.

    Args:
        run: the labkit run.
        uri: the card's tracking.mlflow.uri.
        final: the run has ended (completed, failed or interrupted): send the artifacts too.
        report: the experiment's report page, when one was built.
    Returns:
        the mirror state (MLflow run id, what was sent).
    """
    from mlflow.entities import Metric, Param, RunTag

    state = open_mirror(run, uri)
    client = _client(state["uri"])
    mlflow_run = state["run_id"]
    status = run.status()
    card = yaml.safe_load(run.card_path.read_text(encoding="utf-8"))
    params = {k: "" if v is None else str(v)[:6000] for k, v in flatten(card).items()}
    manifest = run.dir / "data_manifest.json"
    data_version = io.read_json(manifest).get("data_version") if manifest.exists() else None
    if data_version:
        params["data_version"] = str(data_version)
    if replicate := read_replicate(run.dir):  # the seed this replicate trained with (card.yaml keeps the card's)
        params.update({"train.seed": str(replicate["seed"]), "replicate": f"{replicate['index']}/{replicate['of']}"})
    known = client.get_run(mlflow_run).data.params
    new = [Param(k, v) for k, v in params.items() if k not in known]  # a parameter is sent once
    now = _now_ms()
    metrics = []
    for stage, name in METRIC_FILES.items():
        path = run.dir / name
        if path.exists() and state["sent"].get(name) != path.stat().st_mtime:
            body = io.read_json(path)
            if stage == "parameter_check":
                body = {"plan": body.get("plan"), "verdict": body.get("verdict")}
            metrics += [Metric(k, v, now, 0) for k, v in numbers(body, stage).items()]
            state["sent"][name] = path.stat().st_mtime
    tags = [RunTag("labkit.status", str(status.get("status"))), RunTag("labkit.card_hash", str(status.get("card_hash")))]
    if data_version:
        tags.append(RunTag("labkit.data_version", str(data_version)))
    if status.get("error"):
        tags.append(RunTag("labkit.error", str(status["error"])[:5000]))
    for start in range(0, max(len(new), len(metrics), 1), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(mlflow_run, metrics=metrics[start:start + 100], params=new[start:start + 100],
                         tags=tags if start == 0 else [])
    if final:
        for notebook in sorted((run.dir / "notebooks").glob("*.ipynb")):
            client.log_artifact(mlflow_run, str(notebook), "notebooks")
        for name in ("card.yaml", "comparison/verdict.json", "comparison/human_ratings.jsonl"):
            if (run.dir / name).exists():
                client.log_artifact(mlflow_run, str(run.dir / name), str(Path(name).parent).strip("."))
        if report is not None and report.exists():
            client.log_artifact(mlflow_run, str(report), "report")
    mlflow_status = STATUS.get(status.get("status"), "RUNNING")
    if final and mlflow_status != "RUNNING":
        client.set_terminated(mlflow_run, mlflow_status)
    elif client.get_run(mlflow_run).info.status != "RUNNING":  # the trainer's own MLflow callback ended it
        client.update_run(mlflow_run, status="RUNNING")
    state["status"] = mlflow_status
    io.write_json(run.dir / STATE, state)
    return state


def _now_ms() -> int:
    return int(time.time() * 1000)


REACH_SECONDS = 3.0  # how long the one reachability probe of a tracking server waits


def _switched_off(run: R.Run, uri: str) -> bool:
    """Whether the run's mirror is off because its tracking server could not be reached: probed once per run (a TCP
    connection within REACH_SECONDS), instead of MLflow's minutes of retries after every stage.

    Returns:
        True when the mirror is off for this run (one warning was printed when it was switched off).
    """
    path = run.dir / STATE
    state = io.read_json(path) if path.exists() else {}
    if state.get("off"):
        return True
    parts = urlsplit(uri)
    if parts.scheme not in {"http", "https"} or state.get("reached"):
        return False
    try:
        socket.create_connection((parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)),
                                 timeout=REACH_SECONDS).close()
    except OSError as exc:
        why = f"{redact(uri)} cannot be reached ({exc.strerror or type(exc).__name__})"
        io.write_json(path, {**state, "off": why})
        print(f"labkit: warning: the MLflow server {why}: the mirror is off for {run.run_id} (the run folder and the "
              "registry are the record; start the server and `labkit compare` shows everything)", file=sys.stderr,
              flush=True)
        return True
    io.write_json(path, {**state, "reached": True})
    return False


def card_uri(run: R.Run) -> str | None:
    """The run's `tracking.mlflow.uri` (from its archived card), or None when it is not mirrored."""
    card = yaml.safe_load(run.card_path.read_text(encoding="utf-8")) or {}
    return ((card.get("tracking") or {}).get("mlflow") or {}).get("uri")


def mirror_safely(run: R.Run, final: bool = False, report: Path | None = None) -> dict[str, str]:
    """`mirror_run` for a run whose card asks for it; a mirror that fails never fails the run: one warning line on
    stderr, and the next call tries again.

    Args:
        run: the labkit run.
        final: the run has ended (send the artifacts).
        report: the experiment's report page, if built.
    Returns:
        the environment that joins the trainer's MLflow callback to the mirrored run (`MLFLOW_ENV`), or {} when the
        run is not mirrored or the mirror failed.
    """
    try:
        uri = card_uri(run)
        if not uri or _switched_off(run, uri):
            return {}
        state = mirror_run(run, uri, final=final, report=report)
        # the trainer's callback logs step metrics only: the card is the run's parameters (TrainingArguments would
        # duplicate them, and a changed value on resume would raise inside training)
        return {"MLFLOW_TRACKING_URI": state["uri"], "MLFLOW_RUN_ID": state["run_id"], "MLFLOW_MAX_LOG_PARAMS": "0"}
    except Exception as exc:  # noqa: BLE001 - the run folder and the registry are the record; the mirror is a view
        first = redact((str(exc).strip().splitlines() or [""])[0][:200])
        print(f"labkit: warning: the MLflow mirror of {run.run_id} was not updated ({type(exc).__name__}: {first}); "
              "the run goes on, and its next update sends everything", file=sys.stderr, flush=True)
        return {}
