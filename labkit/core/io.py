"""Atomic file writing and the JSON / JSONL / YAML readers every package shares.

A run's files are written through a temporary file and a rename, so a reader (another stage, `labkit runs`,
a report) never sees half a file.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from labkit.errors import CorruptFile, StorageError

_UMASK = os.umask(0o022)
os.umask(_UMASK)


STAMP = "%Y-%m-%dT%H:%M:%SZ"  # the registry's and status.json's times


def utc_now() -> str:
    """Current UTC time, ISO 8601 with seconds."""
    return datetime.now(timezone.utc).strftime(STAMP)


def utc_seconds(stamp: str) -> float:
    """Seconds since the epoch of a `utc_now` time.

    Args:
        stamp: the time as `utc_now` writes it.
    Returns:
        the seconds. Raises ValueError on another format.
    """
    return datetime.strptime(stamp, STAMP).replace(tzinfo=timezone.utc).timestamp()


_FIX = {errno.ENOSPC: "free disk space (or set LABKIT_RUNS to a folder on a larger disk)",
        errno.EDQUOT: "free space within your quota",
        errno.EROFS: "the file system is read-only: set LABKIT_RUNS (and LABKIT_CACHE) to a writable folder",
        errno.EACCES: "you may not write there: fix the folder's permissions or set LABKIT_RUNS elsewhere",
        errno.EPERM: "you may not write there: fix the folder's permissions or set LABKIT_RUNS elsewhere"}


def storage_error(path: Path, exc: OSError) -> StorageError:
    """The one-line error for a file that could not be written, naming it and the fix for its cause."""
    return StorageError(f"{path}: could not be written ({exc.strerror or exc}); "
                        f"{_FIX.get(exc.errno or 0, 'check the disk and the folder')}")


def write_atomic(path: Path, text: str) -> None:
    """Write a file via a temporary file and rename, so readers never see half a file (and a failed write leaves the
    old file as it was).

    Raises:
        StorageError: disk full, read-only file system, no permission (one line naming the file and the fix).
    """
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; run files are shared like any other file
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise storage_error(path, exc) from None


def write_json(path: Path, data: Any) -> None:
    """Atomically write JSON (indented, UTF-8)."""
    write_atomic(path, json.dumps(data, indent=1, ensure_ascii=False, default=str) + "\n")


def read_json(path: Path) -> Any:
    """Read a JSON file.

    Raises:
        CorruptFile: the file is not valid JSON or not UTF-8 (one line naming it); a missing file raises as before.
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f"line {exc.lineno}: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        raise CorruptFile(f"{path}: cannot be read back ({where}); labkit wrote it whole, so it was changed or "
                          "damaged since: restore it from a backup (a run's files are its record)") from None


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
