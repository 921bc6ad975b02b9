"""Read a W&B offline run's transaction log (`run-<id>.wandb`) with W&B's own record type: the file is a LevelDB-style
log (a 7-byte W&B header, then 32 KiB blocks of checksummed chunks) whose records are `wandb_internal_pb2.Record`s.
wandb 0.31 ships no Python reader of it (its Go core reads it to sync), so the tests read it here."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK, HEADER = 32 * 1024, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """Every record of a .wandb file, in order.

    Args:
        path: the run's .wandb file.
    Returns:
        wandb_internal_pb2.Record messages.
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    out, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def history(path: Path, key: str) -> list[float]:
    """The values a run logged under `key` in its history (one per logged step)."""
    values = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:
                name = item.key or "/".join(item.nested_key)
                if name == key:
                    values.append(json.loads(item.value_json))
    return values


def summary(paths: list[Path]) -> dict[str, Any]:
    """The summary values the runs' logs set, the later ones winning."""
    out: dict[str, Any] = {}
    for path in paths:
        for record in records(path):
            if record.WhichOneof("record_type") == "summary":
                for item in record.summary.update:
                    out[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out


def run_records(paths: list[Path]) -> list[Any]:
    """The run records (name, notes, config, tags, group) of the logs."""
    return [r.run for p in paths for r in records(p) if r.WhichOneof("record_type") == "run"]
