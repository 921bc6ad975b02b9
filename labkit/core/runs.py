"""Run folders and the registry.

runs/<experiment>/<run_id>/ holds one run (card.yaml, card.diff.yaml, env.json, status.json,
data_manifest.json, notebooks/, one folder per stage); runs/registry.jsonl is append-only and
file-locked, one line per status change, so failed and interrupted runs are never lost.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from labkit.card.load import LoadedCard, dump_yaml
from labkit.card.shipped import is_shipped
from labkit.core.heartbeat import is_dead
from labkit.core.io import read_json, utc_now, write_atomic, write_json
from labkit.errors import MissingInput, RegistryCorrupt

_UMASK = os.umask(0o022)
os.umask(_UMASK)
STAGES = ("baseline", "preprocessing", "parameter_check", "training", "comparison")
NOTEBOOKS = {stage: f"{i:02d}_{stage}.ipynb" for i, stage in enumerate(STAGES, 1)}


def project_root(start: Path | None = None) -> Path:
    """The nearest folder above `start` (default: cwd) holding params/ or pyproject.toml; the working folder's
    for a card shipped inside the installed package."""
    start = (start or Path.cwd()).resolve()
    if is_shipped(start):
        start = Path.cwd().resolve()
    for folder in [start, *start.parents]:
        if (folder / "params").is_dir() or (folder / "pyproject.toml").is_file():
            return folder
    return Path.cwd().resolve()


def runs_root(start: Path | None = None) -> Path:
    """Where runs live: $LABKIT_RUNS, else <project root>/runs."""
    if os.environ.get("LABKIT_RUNS"):
        return Path(os.environ["LABKIT_RUNS"]).expanduser().resolve()
    return project_root(start) / "runs"


@dataclass
class Run:
    """One run folder."""

    dir: Path

    @property
    def run_id(self) -> str:
        return self.dir.name

    @property
    def experiment(self) -> str:
        return self.dir.parent.name

    @property
    def root(self) -> Path:
        return self.dir.parent.parent

    @property
    def registry(self) -> Path:
        return self.root / "registry.jsonl"

    @property
    def card_path(self) -> Path:
        return self.dir / "card.yaml"

    @property
    def status_path(self) -> Path:
        return self.dir / "status.json"

    def stage_dir(self, stage: str) -> Path:
        """The folder of a stage's data files (created)."""
        path = self.dir / stage
        path.mkdir(parents=True, exist_ok=True)
        return path

    def status(self) -> dict[str, Any]:
        """The run's status.json."""
        return read_json(self.status_path)


def new_run(loaded: LoadedCard, root: Path, mode: str = "batch") -> Run:
    """Create a run folder with the archived card, its diff and status, and register it.

    Args:
        loaded: the validated card.
        root: the runs root.
        mode: "batch" (labkit run) or "interactive" (a notebook opened by hand).
    Returns:
        the Run.
    Callers check the experiment's protocol first (`labkit.core.protocol.check_protocol`).
    """
    card = loaded.card
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = f"{card.experiment.variant}-{stamp}-{loaded.hash}"
    folder = root / card.experiment.id / base
    n = 1
    while folder.exists():
        n += 1
        folder = root / card.experiment.id / f"{base}.{n}"
    folder.mkdir(parents=True)
    run = Run(folder)
    write_atomic(run.card_path, dump_yaml(loaded.resolved))
    write_atomic(folder / "card.diff.yaml", dump_yaml({"parent": str(loaded.chain[1]) if len(loaded.chain) > 1 else None,
                                                       "changed": loaded.diff}))
    write_json(run.status_path, {
        "run_id": run.run_id, "experiment": card.experiment.id, "variant": card.experiment.variant,
        "card_hash": loaded.hash, "card_source": str(loaded.path), "mode": mode, "status": "running",
        "created": utc_now(), "stages": {}, "pid": os.getpid(), "host": socket.gethostname()})
    record(run, "started", status="running", mode=mode, card_source=str(loaded.path))
    return run


def record(run: Run, event: str, status: str | None = None, **fields: Any) -> dict[str, Any]:
    """Append one event to the registry (locked) and mirror it in status.json.

    Args:
        run: the run.
        event: started | stage_started | stage_done | stage_failed | stage_interrupted | completed | failed |
            interrupted | resumed | invalidated.
        status: the run's status after the event (None keeps it).
        fields: extra data (stage, error, seconds…).
    Returns:
        the registry line written.
    """
    state = run.status()
    if status:
        state["status"] = status
    stage = fields.get("stage")
    if stage and event.startswith("stage_"):
        entry = state["stages"].setdefault(stage, {})
        entry.update({"status": event.removeprefix("stage_"), "time": utc_now(),
                      **{k: v for k, v in fields.items() if k != "stage"}})
    if event in {"completed", "failed", "interrupted", "invalidated"}:
        state["finished"] = utc_now()
        if fields.get("error"):
            state["error"] = fields["error"]
    if event == "invalidated":
        state["invalid_reason"] = fields.get("why")
    state["heartbeat"] = time.time()
    write_json(run.status_path, state)
    line = {"time": utc_now(), "run_id": run.run_id, "experiment": run.experiment,
            "variant": state.get("variant"), "event": event, "status": state["status"], **fields}
    run.registry.parent.mkdir(parents=True, exist_ok=True)
    with open(run.registry, "a", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            handle.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    return line


_REPORTED: set[tuple[str, int]] = set()  # corrupt registry lines already reported by this process


def read_registry(root: Path, strict: bool = False) -> list[dict[str, Any]]:
    """All registry events under a runs root.

    A line that is not a JSON event is never dropped silently: it is reported on stderr once per process with its
    line number (`strict`: raised), and the registry file is left as it is.

    Args:
        root: the runs root.
        strict: raise RegistryCorrupt instead of reporting (commands whose decision a lost event could change).
    Returns:
        the events, oldest first.
    """
    path = root / "registry.jsonl"
    if not path.exists():
        return []
    events, bad = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            bad.append((number, f"not valid JSON: {exc.msg} at column {exc.colno}"))
            continue
        if not isinstance(event, dict) or not {"run_id", "time"} <= set(event):
            bad.append((number, "not a registry event (no run_id or time)"))
            continue
        events.append(event)
    for number, why in bad:
        message = (f"{path}:{number}: {why}; the line is ignored (labkit never rewrites the registry: restore the "
                   "line from a backup, or remove it)")
        if strict:
            raise RegistryCorrupt(message)
        if (str(path), number) not in _REPORTED:
            _REPORTED.add((str(path), number))
            print(f"labkit: warning: {message}", file=sys.stderr)
    return events


def status_label(row: dict[str, Any]) -> str:
    """The status as shown: `completed (budget)` for a run that training stopped on budget.max_minutes."""
    status = str(row.get("status", "?"))
    return f"{status} (budget)" if status == "completed" and row.get("stopped_by") == "budget" else status


def summarise(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fold registry events into one row per run (its latest status, last stage, error, `stopped_by`)."""
    runs: dict[str, dict[str, Any]] = {}
    for event in events:
        row = runs.setdefault(event["run_id"], {"run_id": event["run_id"], "experiment": event.get("experiment"),
                                                 "variant": event.get("variant"), "started": event["time"],
                                                 "stage": "", "error": ""})
        row["status"] = event.get("status", row.get("status"))
        row["updated"] = event["time"]
        if event.get("stage"):
            row["stage"] = event["stage"]
        if event.get("error"):
            row["error"] = event["error"]
        if event.get("event") == "resumed":
            row["error"] = ""
            row.pop("stopped_by", None)
        if event.get("event") == "invalidated":
            row["error"] = f"invalid: {event.get('why')}"
        if event.get("stopped_by"):
            row["stopped_by"] = event["stopped_by"]
            row["error"] = f"{status_label(row)}: {event.get('note') or 'stopped by the time budget'}"
        if "summary" in event:
            row["summary"] = event["summary"]
    return list(runs.values())


def find_interactive_run(loaded: LoadedCard, root: Path) -> Run | None:
    """The newest interactive run of this exact card (same hash) that has not completed."""
    folder = root / loaded.card.experiment.id
    if not folder.is_dir():
        return None
    candidates = sorted((p for p in folder.iterdir() if p.is_dir() and p.name.startswith(loaded.card.experiment.variant + "-")
                         and (p / "status.json").exists()), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in candidates:
        status = read_json(path / "status.json")
        if status.get("mode") == "interactive" and status.get("card_hash") == loaded.hash and status["status"] != "completed":
            return Run(path)
    return None


def find_run(run_id: str, root: Path) -> Run:
    """The run folder of a run id (or a path to it) under a runs root.

    Raises:
        FileNotFoundError: no such run.
    """
    path = Path(run_id)
    if (path / "status.json").exists():
        return Run(path.resolve())
    matches = [p for p in root.glob(f"*/{run_id}") if (p / "status.json").exists()] if root.is_dir() else []
    if not matches:
        raise MissingInput(f"no run {run_id!r} under {root} (see `labkit runs`)")
    return Run(matches[0])


def set_owner(run: Run, pid: int) -> None:
    """Record the process now responsible for a run (its liveness is what `labkit runs` checks)."""
    state = run.status()
    state.update(pid=pid, host=socket.gethostname(), heartbeat=time.time())
    write_json(run.status_path, state)


def mark_dead_runs(root: Path) -> list[str]:
    """Record as interrupted every run marked running whose process is gone (or that stopped beating).

    Returns:
        the ids of the runs so marked.
    """
    marked = []
    for row in summarise(read_registry(root)):
        if row.get("status") != "running":
            continue
        run = Run(root / row["experiment"] / row["run_id"])
        if not run.status_path.exists():
            continue
        status = run.status()
        reason = is_dead(run.dir, status) if status.get("status") == "running" else None
        if reason:
            record(run, "interrupted", status="interrupted", error=f"interrupted: {reason}", detected_by="labkit runs")
            marked.append(run.run_id)
    return marked
