"""Reading data sources: data files (JSONL, JSON, CSV, Parquet), hub data sets pinned to a commit, and sources that
come with their own splits (`data.split.from_source`: a hub data set's splits, or one file per split).

Each raw row carries where it came from in "__where__" (`file:line`, `hf:name@revision split row N`) and, for
given splits, its labkit split in "__split__" (`labkit.data.sources.map_fields` keeps it).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import datasets

from labkit.card.schema import Card
from labkit.card.experiment_and_data import Data, FilesSource, HubSource
from labkit.core import hub
from labkit.errors import DataError


def _utf8(path: Path, raw: bytes, offset: int = 0, line: int | None = None) -> str:
    """Decode bytes read from a data file; bytes that are not UTF-8 are one line naming the file, line and offset."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = line if line is not None else raw[:exc.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {offset + exc.start}); "
                        "save the file as UTF-8") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook: an object whose key appears twice (json would keep the last value silently) is
    refused, as a card's is."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise DataError(key)  # given its place by the reader, which knows the file and line
        seen[key] = value
    return seen


def _loads(text: str) -> Any:
    return json.loads(text, object_pairs_hook=_unique_keys)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    offset = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            line = _utf8(path, raw, offset, number)
            offset += len(raw)
            if not line.strip():
                continue
            try:
                row = _loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno}); fix or remove that line") from None
            except DataError as exc:
                raise DataError(f"{path}:{number}: key {exc} appears twice in one row (JSON would silently keep the "
                                "second value); keep one") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{number}: expected a JSON object per line, got {type(row).__name__}")
            row["__where__"] = f"{path}:{number}"
            rows.append(row)
    return rows


def _read_with_datasets(kind: str, where: str | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    datasets.disable_progress_bars()
    try:
        dataset = datasets.load_dataset(kind, **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"{where or kwargs.get('data_files') or kind}: could not be read ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0]})") from None
    finally:
        datasets.enable_progress_bars()
    return [dict(row) for row in dataset]


def read_file(path: Path, fmt: str = "auto") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Read one data file (JSONL, JSON, CSV or Parquet); each row carries its `file:line` in "__where__".

    Returns:
        (raw rows, identity: the path, its sha256 and format).
    """
    kind = fmt if fmt != "auto" else path.suffix.lstrip(".").lower()
    identity = {"kind": "file", "path": str(path), "sha256": file_sha256(path), "format": kind}
    if kind not in {"jsonl", "json", "csv", "parquet"}:
        raise DataError(f"{path}: unknown data format {kind!r} (use .jsonl, .json, .csv or .parquet, or data.source.format)")
    text = _utf8(path, path.read_bytes()) if kind in {"json", "csv"} else ""
    if kind == "jsonl":
        rows = _read_jsonl(path)
    elif kind == "json":
        try:
            rows = _loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        except DataError as exc:
            raise DataError(f"{path}: key {exc} appears twice in one object (JSON would silently keep the second "
                            "value); keep one") from None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise DataError(f"{path}: expected a JSON list of objects (or use .jsonl)")
    else:
        rows = _read_with_datasets(kind, data_files=str(path), split="train")
    for number, row in enumerate(rows, 1):  # a CSV's line 1 is its header
        row.setdefault("__where__", f"{path}:{number + 1}" if kind == "csv" else f"{path}: row {number}")
    return rows, identity


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB blocks)."""
    if not path.is_file():
        raise DataError(f"{path}: data file not found")
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_hub(source: HubSource, split: str | None = None, path: str | None = None) -> list[dict[str, Any]]:
    """Rows of one split of a hub data set at its pinned commit (one fast request first: `labkit.core.hub`).

    Args:
        source: the card's hub source (its revision a 40-hex commit).
        split: the split to read (default: source.split).
        path: what `datasets.load_dataset` loads instead of the hub name (a local copy; tests).
    Returns:
        the rows, each with "__where__".
    """
    split = split or source.split
    if source.revision == hub.RESOLVE:
        raise DataError(f"data.source.revision: {hub.RESOLVE} is looked up when a run starts (labkit run, or a stage "
                        "notebook) and recorded in its pins.json; or write the 40-hex commit hash")
    if path is None:
        hub.check_pin("data.source.revision", source.revision, DataError)
        hub.check_reachable("dataset", source.hf, source.revision, DataError, "data.source.hf")
    where = f"data.source.hf: hf:{source.hf}@{source.revision[:12]}… split {split!r}" + (
        " (HF_HUB_OFFLINE=1)" if hub.offline() else "")
    kwargs: dict[str, Any] = {"name": source.config, "split": split}
    if path is None:
        kwargs["revision"] = source.revision
    rows = _read_with_datasets(path or source.hf, where, **kwargs)
    for number, row in enumerate(rows, 1):
        row["__where__"] = f"hf:{source.hf}@{source.revision[:12]} {split} row {number}"
    return rows


def read_given_splits(data: Data, hub_path: str | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Read a source that comes with its splits, kept as given (`data.split.from_source`).

    Args:
        data: the card's data section (source a hub or files source; split.from_source maps labkit's split names to
            the source's).
        hub_path: a local copy that `datasets.load_dataset` reads in place of the hub data set (tests).
    Returns:
        (raw rows, each with "__split__" = train / validation / test, identity: the source's revision or every
        file's sha256, and the split mapping).
    """
    source, mapping = data.source, data.split.from_source or {}
    rows: list[dict[str, Any]] = []
    if isinstance(source, FilesSource):
        files = {}
        for split, name in mapping.items():
            part, identity = read_file(Path(source.files[name]), source.format)
            files[name] = {"path": identity["path"], "sha256": identity["sha256"], "format": identity["format"]}
            rows += [{**row, "__split__": split} for row in part]
        return rows, {"kind": "files", "files": files, "from_source": dict(mapping)}
    if not isinstance(source, HubSource):
        raise DataError("data.split.from_source: applies to a hub source or a files source (data.source.files)")
    for split, name in mapping.items():
        rows += [{**row, "__split__": split} for row in read_hub(source, name, hub_path)]
    return rows, {"kind": "hf", "name": source.hf, "revision": source.revision, "config": source.config,
                  "from_source": dict(mapping)}
