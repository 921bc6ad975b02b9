"""The append-only registry: `runs/registry.jsonl`, one JSON event a line, file-locked.

A crash or a full disk can leave the last line torn (bytes without their newline). An append never glues its event
to such a line: it first copies the torn bytes aside (`registry.torn/`), ends the line, and starts its event on a
fresh one; the reader then reports the torn line as unreadable and names the copy. labkit never rewrites earlier
lines.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path
from typing import Any

from labkit.core.io import storage_error, utc_now
from labkit.errors import RegistryCorrupt

REGISTRY = "registry.jsonl"
TORN = "registry.torn"  # the torn lines' bytes, one file each, beside the registry

# what an unreadable line may have held, for the commands that read the registry
LOST_EVENT_NOTE = ("an unreadable line may have held any event of a run — its completion, an invalidation or a test "
                   "opening; `labkit final` refuses to open a test split while such a line exists")


def _torn_tail(handle: Any) -> bytes:
    """The bytes after the registry's last newline (empty when it ends on one)."""
    size = handle.seek(0, os.SEEK_END)
    if size == 0:
        return b""
    start = max(0, size - 1)
    handle.seek(start)
    if handle.read(1) == b"\n":
        return b""
    chunk = 1 << 16
    while start > 0:  # find the last newline
        start = max(0, start - chunk)
        handle.seek(start)
        block = handle.read(min(chunk, size - start))
        cut = block.rfind(b"\n")
        if cut >= 0:
            start += cut + 1
            break
    handle.seek(start)
    return handle.read(size - start)


def append(path: Path, event: dict[str, Any]) -> None:
    """Append one event to the registry, locked, always on a fresh line.

    Args:
        path: the registry file.
        event: the JSON-serialisable event.
    """
    line = (json.dumps(event, ensure_ascii=False, default=str) + "\n").encode("utf-8")
    try:
        _append(path, line)
    except OSError as exc:
        raise storage_error(path, exc) from None


def _append(path: Path, line: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            torn = _torn_tail(handle)
            if torn:
                number = sum(block.count(b"\n") for block in _blocks(handle)) + 1
                keep = path.parent / TORN / f"line-{number}-{utc_now().replace(':', '')}.bytes"
                keep.parent.mkdir(parents=True, exist_ok=True)
                keep.write_bytes(torn)
                handle.write(b"\n")
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _blocks(handle: Any, size: int = 1 << 20) -> Any:
    handle.seek(0)
    while block := handle.read(size):
        yield block


def torn_copies(path: Path, number: int) -> list[Path]:
    """The kept copies of a torn registry line (by its line number)."""
    folder = path.parent / TORN
    return sorted(folder.glob(f"line-{number}-*.bytes")) if folder.is_dir() else []


_REPORTED: set[tuple[str, int]] = set()  # unreadable registry lines already reported by this process


def unreadable(path: Path) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """The registry's events and its unreadable lines.

    Args:
        path: the registry file.
    Returns:
        (events oldest first, [(line number, why)]).
    """
    if not path.exists():
        return [], []
    events, bad = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            kept = torn_copies(path, number)
            bad.append((number, f"not valid JSON: {exc.msg} at column {exc.colno}"
                        + (f" (a torn write; its bytes are kept in {kept[0]})" if kept else "")))
            continue
        if not isinstance(event, dict) or not {"run_id", "time"} <= set(event):
            bad.append((number, "not a registry event (no run_id or time)"))
            continue
        events.append(event)
    return events, bad


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
    path = root / REGISTRY
    events, bad = unreadable(path)
    for number, why in bad:
        message = (f"{path}:{number}: {why}; the line is ignored and no later event is lost (labkit never rewrites "
                   "the registry: restore the line from its kept copy or a backup, or leave it)")
        if strict:
            raise RegistryCorrupt(f"{message}; {LOST_EVENT_NOTE}")
        if (str(path), number) not in _REPORTED:
            _REPORTED.add((str(path), number))
            print(f"labkit: warning: {message}", file=sys.stderr)
    return events


def status_label(row: dict[str, Any]) -> str:
    """The status as shown: `completed (budget)` for a run that training stopped on budget.max_minutes;
    `abandoned (kernel gone)` for an interactive run recorded running whose kernel is gone (`row["abandoned"]`, set by
    `labkit.core.listing`)."""
    status = str(row.get("status", "?"))
    if status == "running" and row.get("abandoned"):
        return "abandoned (kernel gone)"
    return f"{status} (budget)" if status == "completed" and row.get("stopped_by") == "budget" else status


def summarise(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fold registry events into one row per run (its latest status, last stage, error, `stopped_by`; a replicate's
    `replicate` index, `replicates` count and training `seed`)."""
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
        if event.get("event") == "invalidated" or row.get("invalid"):
            row["invalid"] = row.get("invalid") or event.get("why")
            row["status"] = "invalid"  # final: a run invalidated while running stays invalid when it ends
            row["error"] = f"invalid: {row['invalid']}"
        if event.get("stopped_by"):
            row["stopped_by"] = event["stopped_by"]
            row["error"] = f"{status_label(row)}: {event.get('note') or 'stopped by the time budget'}"
        if "summary" in event:
            row["summary"] = event["summary"]
        if "replicate" in event:  # a replicate of its variant (labkit.core.replicates): index, count, seed
            row.update({k: event[k] for k in ("replicate", "replicates", "seed") if k in event})
    return list(runs.values())


def lost_events_note(root: Path) -> str | None:
    """One line for `labkit runs` and `compare` when registry lines could not be read: which, and what it means.

    Args:
        root: the runs root.
    Returns:
        the line, or None when every line was read.
    """
    path = root / REGISTRY
    _, bad = unreadable(path)
    if not bad:
        return None
    numbers = ", ".join(str(n) for n, _ in bad[:5]) + ("…" if len(bad) > 5 else "")
    return f"{len(bad)} registry line(s) could not be read ({path}, line {numbers}): {LOST_EVENT_NOTE}"
