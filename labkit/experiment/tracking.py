"""The registry's runs mirrored into MLflow (`tracking.mlflow`) and Weights & Biases (`tracking.wandb`).

`labkit run` (and `labkit stage`) call `mirror_safely` when the run starts, after every stage and when it ends —
completed, failed or interrupted. The first call returns the environment that joins the trainer's own callbacks
(report_to "mlflow" / "wandb": the step metrics, once) to the mirrored run; `apply_env` sets it, `restore_env` undoes
it for the next card.
What is sent is the curated view of `labkit.experiment.mirror_content`; MLflow is updated at every call
(`labkit.experiment.tracking_mlflow`), W&B when the run ends (`labkit.experiment.tracking_wandb`). The run folder and
the registry stay the record; a mirror is a view of them and never fails the run.
"""

from __future__ import annotations

import os
import socket
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

from labkit.card.tracking import Tracking
from labkit.core import io
from labkit.core import runs as R
from labkit.core.secrets import redact
from labkit.experiment.mirror_content import flatten, numbers, read_card
from labkit.experiment.tracking_mlflow import MLFLOW_ENV as _MLFLOW_NAMES
from labkit.experiment.tracking_mlflow import STATE, artifact_root, mirror_run, open_mirror, tracking_uri
from labkit.experiment.tracking_wandb import mirror_wandb, open_wandb, wandb_env

__all__ = ["MLFLOW_ENV", "REACH_SECONDS", "STATE", "apply_env", "artifact_root", "card_uri", "flatten", "mirror_run",
           "mirror_safely", "numbers", "open_mirror", "restore_env", "scoped_env", "tracking_uri"]

# every variable `mirror_safely` may set for the stage kernels (older callers pop these after a card)
MLFLOW_ENV = (*_MLFLOW_NAMES, "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_NAME", "WANDB_RUN_GROUP", "WANDB_JOB_TYPE")
REACH_SECONDS = 3.0  # how long the one reachability probe of a tracking server waits
_saved: dict[str, str | None] = {}  # the values the environment had before a run's tracking set them


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
    return ((read_card(run).get("tracking") or {}).get("mlflow") or {}).get("uri")


def _warn(run: R.Run, where: str, exc: Exception) -> None:
    first = redact((str(exc).strip().splitlines() or [""])[0][:200])
    print(f"labkit: warning: the {where} mirror of {run.run_id} was not updated ({type(exc).__name__}: {first}); "
          "the run goes on, and its next update sends everything", file=sys.stderr, flush=True)


def mirror_safely(run: R.Run, final: bool = False, report: Path | None = None) -> dict[str, str]:
    """Update the run's mirrors its card asks for; a mirror that fails never fails the run: one warning line on
    stderr per mirror, and the next call tries again.

    Args:
        run: the labkit run.
        final: the run has ended (send the artifacts; W&B is updated then).
        report: the experiment's report page, if built.
    Returns:
        the environment that joins the trainer's callbacks to the mirrored runs (MLflow: MLFLOW_TRACKING_URI,
        MLFLOW_RUN_ID, MLFLOW_MAX_LOG_PARAMS; W&B: `tracking_wandb.wandb_env`), {} when nothing is mirrored.
    """
    env: dict[str, str] = {}
    try:
        uri = card_uri(run)
        if uri and not _switched_off(run, uri):
            state = mirror_run(run, uri, final=final, report=report)
            # the trainer's callback logs step metrics only: the card is the run's parameters (TrainingArguments
            # would duplicate them, and a changed value on resume would raise inside training)
            env.update({"MLFLOW_TRACKING_URI": state["uri"], "MLFLOW_RUN_ID": state["run_id"],
                        "MLFLOW_MAX_LOG_PARAMS": "0"})
    except Exception as exc:  # noqa: BLE001 - the run folder and the registry are the record; the mirror is a view
        _warn(run, "MLflow", exc)
    try:
        settings = Tracking.model_validate(read_card(run).get("tracking") or {}).wandb_settings()
        if settings is not None:
            env.update(wandb_env(run, open_wandb(run, settings)))
            if final:
                mirror_wandb(run, settings, report=report)
    except Exception as exc:  # noqa: BLE001 - as above
        _warn(run, "W&B", exc)
    return env


def apply_env(env: dict[str, str]) -> None:
    """Set variables for the stage kernels (what `mirror_safely` returned, the runner's own); `restore_env` puts the
    old values back when the run ends.

    Args:
        env: the variables to set.
    """
    for name in env:
        _saved.setdefault(name, os.environ.get(name))
    os.environ.update(env)


@contextmanager
def scoped_env(env: dict[str, str]) -> Iterator[None]:
    """Set variables for one block (a stage's kernel) and put back what each was, set or not, when it ends.

    Args:
        env: the variables to set.
    """
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def restore_env() -> None:
    """Put back the environment variables a run's tracking set (the next card's run is its own)."""
    for name, value in _saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _saved.clear()
