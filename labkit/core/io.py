"""Atomic file writing and the JSON / JSONL / YAML readers every package shares.

A run's files are written through a temporary file and a rename, so a reader (another stage, `labkit runs`,
a report) never sees half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

_UMASK = os.umask(0o022)
os.umask(_UMASK)


def utc_now() -> str:
    """Current UTC time, ISO 8601 with seconds."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_atomic(path: Path, text: str) -> None:
    """Write a file via a temporary file and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; run files are shared like any other file
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    """Atomically write JSON (indented, UTF-8)."""
    write_atomic(path, json.dumps(data, indent=1, ensure_ascii=False, default=str) + "\n")


def read_json(path: Path) -> Any:
    """Read a JSON file."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a file ([] when the file does not exist).

    Args:
        path: the .jsonl file.
    Returns:
        one dict per non-empty line.
    """
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Atomically write rows as JSON lines (UTF-8).

    Args:
        path: the .jsonl file.
        rows: the rows.
    """
    write_atomic(Path(path), "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows))
