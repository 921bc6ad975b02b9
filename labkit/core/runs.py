"""Run folders and the registry.

runs/<experiment>/<run_id>/ holds one run (card.yaml, card.diff.yaml, env.json, status.json,
data_manifest.json, notebooks/, one folder per stage); runs/registry.jsonl is append-only and
file-locked, one line per status change, so failed and interrupted runs are never lost.
"""

from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from labkit.card.load import LoadedCard, dump_yaml
from labkit.card.shipped import is_shipped
from labkit.core.heartbeat import is_dead
from labkit.core.io import read_json, utc_now, write_atomic, write_json
from labkit.core.replicates import Replicate, record_replicate
from labkit.core.registry import append, read_registry, status_label, summarise  # noqa: F401 (R.summarise…)
from labkit.errors import MissingInput, RunStateError, StorageError, UsageError

_UMASK = os.umask(0o022)
os.umask(_UMASK)
# bytes set aside in every run folder and freed when the disk is full, so the run can still be recorded as failed
RESERVE, RESERVE_BYTES = ".labkit-reserve", 256 * 1024
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


def new_run(loaded: LoadedCard, root: Path, mode: str = "batch", replicate: Replicate | None = None,
            run_id: str | None = None) -> Run:
    """Create a run folder with the archived card, its diff and status, and register it.

    Args:
        loaded: the validated card.
        root: the runs root.
        mode: "batch" (labkit run) or "interactive" (a notebook opened by hand).
        replicate: which replicate of the card this run is (`labkit.core.replicates`): its replicate.json, and
            its index, count and seed in status.json and the registry's `started` event; None for a run of a card
            without replicates.
        run_id: the run's id, chosen by the caller (`labkit run CARD --run-id ID`: every machine of a run and every
            recovery of a managed job name the same run); default: variant, time and card hash.
    Returns:
        the Run.
    Callers check the experiment's protocol first (`labkit.core.protocol.check_protocol`).
    """
    card = loaded.card
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = f"{card.experiment.variant}-{stamp}-{loaded.hash}"
    folder = root / card.experiment.id / base
    n = 1
    while folder.exists() and run_id is None:
        n += 1
        folder = root / card.experiment.id / f"{base}.{n}"
    if run_id is not None:
        folder = root / card.experiment.id / check_run_id(run_id)
        if folder.exists():
            raise RunStateError(f"{folder} exists: run id {run_id} is taken; resume it (`labkit run --resume {run_id}`) "
                                "or choose another id")
    folder.mkdir(parents=True)
    (folder / RESERVE).write_bytes(b"\0" * RESERVE_BYTES)
    run = Run(folder)
    write_atomic(run.card_path, dump_yaml(loaded.resolved))
    write_atomic(folder / "card.diff.yaml", dump_yaml({"parent": str(loaded.chain[1]) if len(loaded.chain) > 1 else None,
                                                       "changed": loaded.diff}))
    seeds = {}
    if replicate is not None:
        record_replicate(folder, replicate)
        seeds = {"replicate": replicate["index"], "replicates": replicate["of"], "seed": replicate["seed"]}
    write_json(run.status_path, {
        "run_id": run.run_id, "experiment": card.experiment.id, "variant": card.experiment.variant,
        "card_hash": loaded.hash, "card_values": card_values(loaded), "card_source": str(loaded.path), "mode": mode,
        "status": "running", **seeds,
        "created": utc_now(), "stages": {}, "pid": os.getpid(), "host": socket.gethostname()})
    record(run, "started", status="running", mode=mode, card_source=str(loaded.path), card_hash=loaded.hash, **seeds)
    return run


def check_run_id(run_id: str) -> str:
    """A run id given on the command line: a folder name of letters, digits, `.`, `_` and `-`, not starting with a
    dot or an underscore (the experiment's own folders), at most 128 characters.

    Returns:
        the run id.
    Raises:
        UsageError: one line with the rule.
    """
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", run_id or ""):
        raise UsageError(f"--run-id {run_id!r}: a run id is a folder name of letters, digits, '.', '_' and '-' "
                         "(starting with a letter or digit, at most 128 characters)")
    return run_id


def card_values(loaded: LoadedCard) -> dict[str, Any]:
    """The card's non-default values as dotted keys (what its hash covers), kept in status.json to name the keys of
    a later edit."""
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
        else:
            flat[prefix] = node

    walk(loaded.card.model_dump(mode="json", exclude_defaults=True), "")
    return flat


def check_archived_card(run: Run, loaded: LoadedCard) -> None:
    """Refuse a card whose hash differs from the one the run recorded when it started (an edited card.yaml).

    Args:
        run: the run.
        loaded: the card about to be used for a stage or a resume (normally the run's archived card.yaml).
    Raises:
        RunStateError: one line naming the keys that differ and the fix.
    """
    status = run.status()
    recorded = status.get("card_hash")
    if recorded is None or loaded.hash == recorded:
        return
    before, now = status.get("card_values") or {}, card_values(loaded)
    keys = sorted(k for k in before.keys() | now.keys() if before.get(k, "<default>") != now.get(k, "<default>"))
    changes = [f"{k} ({before.get(k, 'default')!r} → {now.get(k, 'default')!r})" for k in keys[:6]]
    named = f"; keys that differ: {', '.join(changes)}{'…' if len(keys) > 6 else ''}" if before else ""
    raise RunStateError(f"{loaded.path}: this card (hash {loaded.hash}) is not the card run {run.run_id} started with "
                        f"(hash {recorded}){named}: a run is a record — put the archived card back, or start a new "
                        "run from the edited card")


def check_stage_may_run(run: Run, stage: str, rerun_done: bool = False) -> None:
    """Refuse to execute a stage in place where that would rewrite the record.

    Never in an invalid or finalised run (test split opened), nor in a run whose stages are all done; a stage already
    done is re-executed only when `rerun_done` (an unfinished interactive run, whose notebook is being worked on).

    Args:
        run: the run.
        stage: the stage about to run.
        rerun_done: allow re-executing a done stage of an unfinished run.
    Raises:
        RunStateError: one line with the alternative.
    """
    status = run.status()
    done = {s for s, v in status.get("stages", {}).items() if v.get("status") == "done"}
    name = f"{run.experiment}/{run.run_id}"
    fresh = "start a new run (`labkit run CARD`, or `labkit stage NAME CARD` without --run)"
    if status.get("status") == "invalid":
        raise RunStateError(f"{name} is invalid ({status.get('invalid_reason')}): it stays as it is; {fresh}")
    if any(e.get("run_id") == run.run_id and e.get("event") == "test_opened" for e in read_registry(run.root)):
        raise RunStateError(f"{name} is finalised (its test split was opened): its stages are never re-executed; {fresh}")
    if done >= set(STAGES):
        raise RunStateError(f"{name} is complete: its archived stages are never re-executed in place; {fresh}")
    if stage in done and not rerun_done:
        raise RunStateError(f"stage {stage} of {name} is done and archived: it is not re-executed in place; {fresh}, "
                            f"or `labkit run --resume {run.run_id}` to run the stages not yet done")


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
    if status and state.get("status") != "invalid":  # an invalidation is final: later events keep the run invalid
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
    line = {"time": utc_now(), "run_id": run.run_id, "experiment": run.experiment,
            "variant": state.get("variant"), "event": event, "status": state["status"], **fields}
    try:
        write_json(run.status_path, state)
        append(run.registry, line)
    except StorageError:
        reserve = run.dir / RESERVE
        if not reserve.exists():
            raise
        reserve.unlink()  # a full disk: the run's reserve makes room for what it was to be recorded
        write_json(run.status_path, state)
        append(run.registry, line)
    return line


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


_PATTERN = set("*?[]")


def find_run(run_id: str, root: Path) -> Run:
    """The run folder of a run id, a unique prefix of one, or a path to a run folder inside the runs root.

    A run id is a name, never a pattern: glob characters, `..` and paths outside the runs root are refused.

    Args:
        run_id: the run id, a unique prefix of it, or the run folder's path.
        root: the runs root.
    Returns:
        the Run.
    Raises:
        UsageError: a pattern, a path outside the runs root, or a prefix that several runs share.
        MissingInput: no such run.
    """
    if not run_id or _PATTERN & set(run_id) or ".." in Path(run_id).parts:
        raise UsageError(f"{run_id!r} is not a run id: give the run's id (or a unique prefix) as `labkit runs` "
                         "lists it — patterns and '..' are not accepted")
    root = root.resolve()
    if "/" in run_id or os.sep in run_id:
        path = Path(run_id).expanduser().resolve()
        if path.parent.parent != root or not (path / "status.json").is_file():
            raise UsageError(f"{run_id}: not a run folder of the runs root {root} (runs/<experiment>/<run_id>); "
                             "give the run id, or set LABKIT_RUNS to the runs root that holds it")
        return Run(path)
    folders = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    runs = [p / run_id for p in folders if (p / run_id / "status.json").is_file()]
    if not runs:
        runs = [r for p in folders for r in p.iterdir() if r.name.startswith(run_id) and (r / "status.json").is_file()]
    if len(runs) > 1:
        names = ", ".join(sorted(f"{r.parent.name}/{r.name}" for r in runs)[:5])
        raise UsageError(f"{run_id!r} matches {len(runs)} runs ({names}…): give more of the run id")
    if not runs:
        raise MissingInput(f"no run {run_id!r} under {root} (see `labkit runs`)")
    return Run(runs[0])


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
