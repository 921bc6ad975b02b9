"""The registry's runs as rows for people and programs, and the runs a notebook can open.

One row per run, the same for `labkit runs` (a table), `labkit runs --json` and `labkit.runs()` (a DataFrame): the
table's columns (`COLUMNS`) and machine-friendly ones beside them. An interactive run whose kernel is gone is shown
`abandoned (kernel gone)`, not `running`: nothing is recorded for it, so opening its notebook again (a new kernel,
a new heartbeat) shows it running again. `card_runs`, `latest_completed` and `openable_text` are what a notebook's
`run_dir` resolves against (`labkit.stages.context.open_stage`).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from labkit.card.load import LoadedCard
from labkit.core import runs as R
from labkit.core.heartbeat import STALE_SECONDS, process_alive
from labkit.core.io import read_json

# the columns of `labkit runs`, {key in --json and labkit.runs(): header of the table}
COLUMNS = {"run": "run", "replicate": "replicate", "status": "status", "stage": "stage", "updated": "updated",
           "result": "result / error"}
# every key of a row: the table's columns, then the machine-friendly ones
FIELDS = (*COLUMNS, "experiment", "run_id", "variant", "state", "abandoned", "mode", "stages_done", "started",
          "stopped_by", "replicate_index", "replicates", "seed", "metric", "baseline", "tuned", "decision", "confirmed",
          "error", "dir")
LATEST = "latest"  # a notebook's run_dir: this card's newest completed run, opened for review


def kernel_gone(run_dir: Path, status: dict[str, Any]) -> str | None:
    """Why an interactive run recorded as running has no live kernel, or None when it may have one.

    The kernel beats `<run>/heartbeat` every 30 s while it lives (`labkit.core.heartbeat`), with its pid and host.

    Args:
        run_dir: the run folder.
        status: its status.json.
    Returns:
        "kernel 123 is gone", "no heartbeat for 12 min", or None (a batch run, a finished one, a live kernel).
    """
    if status.get("mode") != "interactive" or status.get("status") != "running":
        return None
    path = Path(run_dir) / "heartbeat"
    try:
        beat = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        beat = {}
    pid, host = beat.get("pid") or status.get("pid"), beat.get("host") or status.get("host")
    if pid and host == socket.gethostname() and not process_alive(int(pid)):
        return f"kernel {pid} is gone"
    age = time.time() - float(beat.get("time") or status.get("heartbeat") or 0)
    return f"no heartbeat for {age / 60:.0f} min" if age > STALE_SECONDS else None


def stages_done(status: dict[str, Any]) -> list[str]:
    """The run's stages recorded done, in stage order."""
    done = {s for s, v in (status.get("stages") or {}).items() if v.get("status") == "done"}
    return [s for s in R.STAGES if s in done]


def result_text(summary: dict[str, Any]) -> str:
    """A completed run's result as `labkit runs` shows it: `field_accuracy 0.250→0.830 confirmed`."""
    metric = next((k for k in summary if k not in ("confirmed", "decision")), None)
    values = summary[metric] if metric else {}
    result = (f"{metric} {values['baseline']:.3f}→{values['tuned']:.3f} " if metric and None not in
              (values.get("baseline"), values.get("tuned")) else "")
    # the verdict's decision word (inconclusive, not judged); runs recorded before it had only confirmed or not
    return result + (summary.get("decision") or ("confirmed" if summary.get("confirmed") else "not confirmed"))


def _status(folder: Path) -> dict[str, Any]:
    try:
        return read_json(folder / "status.json") if (folder / "status.json").is_file() else {}
    except Exception:  # noqa: BLE001 - an unreadable status.json leaves the registry's row as it is
        return {}


def rows(root: Path, experiment: str | None = None) -> list[dict[str, Any]]:
    """Every run of the registry (or of one experiment) as a row: `COLUMNS` and machine-friendly keys.

    Args:
        root: the runs root.
        experiment: only this experiment's runs (None: all).
    Returns:
        one dict per run, oldest first: run, replicate, status (as shown), stage, updated, result (the table's
        columns), and experiment, run_id, variant, state (the recorded status), abandoned (why, or None), mode,
        stages_done, started, stopped_by, replicate_index, replicates, seed, metric, baseline, tuned, decision,
        confirmed, error, dir.
    """
    out = []
    for row in R.summarise(R.read_registry(root)):
        if experiment and row.get("experiment") != experiment:
            continue
        folder = root / str(row.get("experiment")) / row["run_id"]
        status = _status(folder)
        gone = kernel_gone(folder, status) if row.get("status") == "running" else None
        summary = row.get("summary") or {}
        metric = next((k for k in summary if k not in ("confirmed", "decision")), None)
        values = (summary.get(metric) or {}) if metric else {}
        shown = {**row, "abandoned": gone}
        out.append({
            "run": f"{row['experiment']}/{row['run_id']}",
            "replicate": f"{row['replicate']}/{row.get('replicates')} seed {row.get('seed')}"
            if row.get("replicate") else "",
            "status": R.status_label(shown), "stage": row.get("stage", ""), "updated": row.get("updated", ""),
            "result": result_text(summary) if summary else (f"abandoned: {gone}" if gone else row.get("error") or ""),
            "experiment": row.get("experiment"), "run_id": row["run_id"], "variant": row.get("variant"),
            "state": row.get("status"), "abandoned": gone, "mode": status.get("mode"),
            "stages_done": stages_done(status), "started": row.get("started"), "stopped_by": row.get("stopped_by"),
            "replicate_index": row.get("replicate"), "replicates": row.get("replicates"), "seed": row.get("seed"),
            "metric": metric, "baseline": values.get("baseline"), "tuned": values.get("tuned"),
            "decision": summary.get("decision"), "confirmed": summary.get("confirmed"), "error": row.get("error") or "",
            "dir": str(folder)})
    return out


def card_runs(loaded: LoadedCard, root: Path) -> list[dict[str, Any]]:
    """The runs of a card's experiment and variant, newest first, from their status.json.

    Args:
        loaded: the card.
        root: the runs root.
    Returns:
        {run_id, dir, status (as shown), state, mode, stages_done, same_card (this card's hash)} per run.
    """
    folder = root / loaded.card.experiment.id
    found = []
    for path in folder.iterdir() if folder.is_dir() else ():
        status = _status(path)
        if not status or status.get("variant") != loaded.card.experiment.variant:
            continue
        gone = kernel_gone(path, status)
        found.append({"run_id": path.name, "dir": path, "created": status.get("created") or "",
                      "status": R.status_label({**status, "abandoned": gone}), "state": status.get("status"),
                      "mode": status.get("mode"), "stages_done": stages_done(status),
                      "same_card": status.get("card_hash") == loaded.hash})
    return sorted(found, key=lambda r: (r["created"], r["run_id"]), reverse=True)


def latest_completed(loaded: LoadedCard, root: Path, stage: str) -> R.Run | None:
    """The card's newest completed run (same card hash, recorded `completed`) in which `stage` is done, or None."""
    for run in card_runs(loaded, root):
        if run["same_card"] and run["state"] == "completed" and stage in run["stages_done"]:
            return R.Run(run["dir"])
    return None


def openable_text(loaded: LoadedCard, root: Path, stage: str, why: str) -> str:
    """One message: why the notebook cannot open a run, the runs of its card it could open, and how to set run_dir.

    Args:
        loaded: the card.
        root: the runs root.
        stage: the notebook's stage.
        why: what is missing ("no completed run of this card has stage comparison done").
    Returns:
        the message (for a MissingInput).
    """
    listed = []
    for run in card_runs(loaded, root)[:8]:
        done = ", ".join(run["stages_done"]) or "none"
        other = "" if run["same_card"] else "; another version of the card"
        listed.append(f"{run['run_id']} ({run['status']}, {run['mode']}; stages done: {done}{other})")
    runs = ("runs of " + f"{loaded.card.experiment.id}/{loaded.card.experiment.variant} under {root}: "
            + "; ".join(listed)) if listed else f"no run of {loaded.card.experiment.id}/" \
        f"{loaded.card.experiment.variant} under {root}"
    return (f"{why}; {runs}. In the notebook's parameters cell set run_dir = \"{LATEST}\" (this card's newest "
            f"completed run, opened for review) or run_dir = \"{root / loaded.card.experiment.id}/<run_id>\", or run "
            f"the stages before {stage} first (`labkit run {loaded.path}`, or their notebooks with run_dir = \"\")")
