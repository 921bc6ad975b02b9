"""Files that are what they claim: sha256 of a file, the hashes of a folder recorded when it is written, and the
check before it is used again (a cache is verified, never trusted by its existence).

A file whose size and modification time are unchanged since its hash was recorded is taken as unchanged (the fast
path); any other file is hashed again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_record(path: Path) -> dict[str, Any]:
    """sha256, size and mtime of one file."""
    stat = path.stat()
    return {"sha256": sha256_file(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def file_hashes(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """`file_record` of every file under a folder, by relative path (files named in `skip` left out)."""
    return {str(p.relative_to(folder)): file_record(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in skip}


def file_problem(path: Path, want: dict[str, Any]) -> str | None:
    """What differs between a file and its recorded `file_record` (None when it is as recorded)."""
    try:
        stat = path.stat()
        if (stat.st_size, stat.st_mtime_ns) == (want["size"], want["mtime_ns"]):
            return None
        if stat.st_size != want["size"] or sha256_file(path) != want["sha256"]:
            return f"{path.name} changed since it was written (sha256 or size differs)"
    except OSError as exc:
        return f"{path.name} cannot be read ({exc.strerror or exc})"
    return None


def verify_folder(folder: Path, recorded: dict[str, dict[str, Any]] | None, skip: tuple[str, ...] = ()) -> str | None:
    """Check a folder against the hashes recorded when it was written.

    Args:
        folder: the folder.
        recorded: `file_hashes` as written with it (None or empty: nothing was recorded).
        skip: file names that are not part of the record (its own provenance file).
    Returns:
        what is wrong, or None when every file is as written.
    """
    if not recorded:
        return "no file hashes were recorded with it"
    present = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name not in skip}
    if extra := sorted(present - set(recorded)):
        return f"{extra[0]} was added after it was written"
    for name, want in recorded.items():
        if problem := file_problem(folder / name, want):
            return problem
    return None


def verified_sha256(path: Path, sidecar: Path) -> str | None:
    """The sha256 of a file, from its sidecar record when the file is unchanged since (else hashed again and the
    sidecar rewritten).

    Args:
        path: the file.
        sidecar: where its `file_record` is kept.
    Returns:
        the file's sha256 as it is now.
    """
    try:
        want = json.loads(sidecar.read_text())
        if isinstance(want, dict) and file_problem(path, want) is None:
            return str(want["sha256"])
    except (OSError, ValueError, KeyError):
        pass
    record = file_record(path)
    sidecar.write_text(json.dumps(record))
    return str(record["sha256"])
