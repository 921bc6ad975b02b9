"""The openings of an experiment's test split, read back from the registry (`labkit final` records them).

The comparison and the report list them; `labkit.experiment.final` refuses a second opening with them. Reading
them needs the registry only, not the models `final` evaluates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labkit.core import runs as R


def openings(root: Path, experiment: str, strict: bool = False) -> list[dict[str, Any]]:
    """Every opening of an experiment's test split, from the registry, oldest first.

    Args:
        root: the runs root (holds registry.jsonl).
        experiment: the experiment id.
        strict: a corrupt registry line is an error (it might hide an opening), not a warning.
    Returns:
        one dict per opening: {"opening", "run_id", "variant", "who", "when", "reopen", "why", "outcome"
        ("evaluated" | "failed" | "incomplete"), "confirmed", "verdict", "problem"}.
    """
    out: list[dict[str, Any]] = []
    by_key: dict[tuple[str, Any], dict[str, Any]] = {}
    for event in R.read_registry(Path(root), strict=strict):
        if event.get("experiment") != experiment:
            continue
        kind = event.get("event")
        if kind == "test_opened":
            row = {"opening": event.get("opening"), "run_id": event["run_id"], "variant": event.get("variant"),
                   "who": event.get("who"), "when": event.get("time"), "reopen": bool(event.get("reopen")),
                   "why": event.get("why"), "outcome": "incomplete", "confirmed": None, "verdict": None, "problem": None}
            out.append(row)
            by_key[(event["run_id"], event.get("opening"))] = row
        elif kind in {"test_evaluated", "test_open_failed"}:
            row = by_key.get((event["run_id"], event.get("opening")))
            if row is None:
                continue
            if kind == "test_evaluated":
                row.update(outcome="evaluated", confirmed=event.get("confirmed"), verdict=event.get("verdict"))
            else:
                row.update(outcome="failed", problem=event.get("problem"))
    return out
