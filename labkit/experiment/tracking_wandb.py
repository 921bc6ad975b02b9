"""A run reported to Weights & Biases (card key `tracking.wandb`): the trainer's step metrics through its own callback
(`report_to` includes "wandb"), and when the run ends the same curated view as the MLflow mirror
(`labkit.experiment.mirror_content`): the headline metrics as the run's summary, the hypothesis and verdict as its
notes, the status, and one artifact holding the tables and the report (its folder and one self-contained page).

One W&B project per experiment id (or the card's `project`), the W&B run id is the labkit run id, so the trainer's
session and the final update are one run. Without an API key or a reachable server the run is logged offline (one
warning; `wandb sync` uploads it later); WANDB_MODE=offline does the same on purpose. The files go to `$WANDB_DIR`, by
default the runs folder (`runs/wandb/`). The key is read by wandb from WANDB_API_KEY or `wandb login`, never written
by labkit. State: `tracking/wandb.json` in the run folder.
"""

from __future__ import annotations

import netrc
import os
import re
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from labkit.core import io
from labkit.core import runs as R
from labkit.experiment import mirror_content as C
from labkit.experiment.tracking_mlflow import report_copy, run_params

STATE = "tracking/wandb.json"
OFFLINE_MODES = ("offline", "dryrun", "disabled")
EXIT_CODES = {"completed": 0, "budget_stopped": 0, "failed": 1, "interrupted": 255}
REACH_SECONDS = 3.0


def _reason_offline() -> str | None:
    """Why an online W&B run cannot start here (no API key, server unreachable), or None when it can."""
    base = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    host = urlsplit(base).hostname or ""
    if not os.environ.get("WANDB_API_KEY"):
        try:
            known = netrc.netrc(os.environ.get("NETRC")).authenticators(host)
        except (OSError, netrc.NetrcParseError):
            known = None
        if not known:
            return "no API key (set WANDB_API_KEY or run `wandb login`)"
    try:
        socket.create_connection((host, urlsplit(base).port or 443), timeout=REACH_SECONDS).close()
    except OSError as exc:
        return f"{host} cannot be reached ({exc.strerror or type(exc).__name__})"
    return None


def open_wandb(run: R.Run, settings: Any) -> dict[str, Any]:
    """The run's W&B state, decided once per run: project, entity, run id, files folder and mode.

    Args:
        run: the labkit run.
        settings: the card's `tracking.wandb` (`labkit.card.tracking.WandbTracking`).
    Returns:
        {"id", "project", "entity", "dir", "mode"}, saved in the run's tracking/wandb.json.
    """
    path = run.dir / STATE
    if path.exists():
        return io.read_json(path)
    mode = os.environ.get("WANDB_MODE", "online")
    if mode not in OFFLINE_MODES and (why := _reason_offline()):
        print(f"labkit: warning: W&B: {why}: {run.run_id} is logged offline (`wandb sync` uploads it later)",
              file=sys.stderr, flush=True)
        mode = "offline"
    state = {"id": re.sub(r"[^A-Za-z0-9_.-]", "-", run.run_id)[:64], "project": settings.project or run.experiment,
             "entity": settings.entity or os.environ.get("WANDB_ENTITY"),
             "dir": os.environ.get("WANDB_DIR") or str(run.root), "mode": mode}
    io.write_json(path, state)
    return state


def wandb_env(run: R.Run, state: dict[str, Any]) -> dict[str, str]:
    """The environment that makes the trainer's W&B callback (in the stage's kernel) log into this run.

    Returns:
        WANDB_* variables: run id (resumed by the final update), project, entity, name, group, folder, mode, and
        silence (the archived notebooks keep no W&B banners).
    """
    status = run.status()
    env = {"WANDB_RUN_ID": state["id"], "WANDB_RESUME": "allow", "WANDB_PROJECT": state["project"],
           "WANDB_NAME": run.run_id, "WANDB_RUN_GROUP": str(status.get("variant")), "WANDB_JOB_TYPE": "train",
           "WANDB_DIR": state["dir"], "WANDB_MODE": state["mode"], "WANDB_SILENT": "true", "WANDB_CONSOLE": "off"}
    if state.get("entity"):
        env["WANDB_ENTITY"] = state["entity"]
    return env


def mirror_wandb(run: R.Run, settings: Any, report: Path | None = None) -> dict[str, Any]:
    """Send a finished run's curated view to its W&B run (resumed by id): summary metrics, notes, config, tags, exit
    status, and an artifact with the tables and the report.

    Args:
        run: the labkit run (completed, failed or interrupted).
        settings: the card's `tracking.wandb`.
        report: the experiment's report page (index.html), when one was built.
    Returns:
        the W&B state of the run.
    """
    import wandb

    state = open_wandb(run, settings)
    card = C.read_card(run)
    labkit_state = C.run_state(run)
    Path(state["dir"]).mkdir(parents=True, exist_ok=True)
    session = wandb.init(
        id=state["id"], project=state["project"], entity=state.get("entity"), dir=state["dir"], resume="allow",
        mode=state["mode"], name=run.run_id, group=str(run.status().get("variant")), job_type="train",
        notes=C.description(run, card), config=run_params(run, card), tags=[labkit_state["status"]],
        reinit="create_new", settings=wandb.Settings(silent=True, console="off", save_code=False))
    try:
        session.summary.update({**C.headline(run.dir, card), "labkit.status": labkit_state["status"]})
        artifact = wandb.Artifact(f"labkit-{state['id']}", type="labkit-run",
                                  description=f"tables and report of labkit run {run.run_id}")
        for name, rows in C.tuned_tables(run.dir, card).items():
            artifact.add(_table(wandb, rows), f"tables/{name}")
        if baseline := C.baseline_table(run.dir, card):  # offline, W&B cannot say whether another run sent it:
            key, rows = baseline                          # each run's artifact carries the (small) table
            artifact.add(_table(wandb, rows), f"tables/baseline_{key}")
        with tempfile.TemporaryDirectory() as tmp:
            if report is not None and report.exists():
                artifact.add_dir(str(report_copy(report, run.run_id, Path(tmp))), "report")
                single = Path(tmp) / "report.html"
                single.write_text(C.self_contained(report), encoding="utf-8")
                artifact.add_file(str(single), "report.html")
            session.log_artifact(artifact)
    finally:
        session.finish(exit_code=EXIT_CODES.get(labkit_state["status"], 1))
        wandb.teardown()  # wait for W&B's service to write (offline) or send everything before labkit moves on
    return state


def _table(wandb: Any, rows: list[dict[str, Any]]) -> Any:
    names = list(dict.fromkeys(k for row in rows for k in row))
    return wandb.Table(columns=names, data=[[row.get(n) for n in names] for row in rows])
