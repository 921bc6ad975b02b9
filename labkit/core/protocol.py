"""The experiment's protocol: the keys every variant of one experiment must share to be comparable.

A variant is comparable with the experiment when its protocol-fixed keys (evaluation procedure, seed, data
version, budget) equal the experiment's reference protocol — the one most of its completed runs share. The
commands that start a run (`labkit run`, `labkit stage`, a notebook opened by hand) call `check_protocol`
before `labkit.core.runs.new_run` creates anything.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from labkit.card.load import card_diff
from labkit.core import io
from labkit.core import runs as R
from labkit.errors import CardError

PROTOCOL_KEYS = ("eval", "train.seed", "budget", "data")


def card_protocol(card: dict[str, Any]) -> dict[str, Any]:
    """The protocol-fixed keys of a resolved card (a dict as archived in card.yaml)."""
    return {"eval": card.get("eval"), "train.seed": (card.get("train") or {}).get("seed"),
            "budget": card.get("budget"), "data": card.get("data")}


def run_protocol(run_dir: Path) -> dict[str, Any]:
    """The protocol of a run: its card's fixed keys, the data version it actually prepared and, for preference
    pairs, the version of their rejected answers (None for an sft run: not compared, see `protocol_changes`)."""
    card = yaml.safe_load((run_dir / "card.yaml").read_text(encoding="utf-8"))
    manifest = run_dir / "data_manifest.json"
    data = io.read_json(manifest) if manifest.exists() else {}
    return {**card_protocol(card), "data_version": data.get("data_version"),
            "preference_version": (data.get("preference") or {}).get("version")}


# where a data file lives is not part of the protocol (another checkout, another path); its content is, through
# the data version that stage 01 records. The rejected answers of preference pairs are the method's extra training
# signal, like the method itself: a dpo/orpo variant evaluates on the same rows as its sft siblings (their data
# version leaves the rejected answers out), and two preference runs are compared on their preference_version.
NOT_PROTOCOL = ("data.source.path", "data.fields.rejected")


def protocol_changes(reference: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Flat {key: {"reference": a, "run": b}} of the protocol keys that differ (None values are not yet known)."""
    out = {}
    for key in reference:
        if reference[key] is None or other.get(key) is None:
            continue
        for sub, change in card_diff(reference[key], other[key], f"{key}.").items():
            if sub not in NOT_PROTOCOL:
                out[sub] = {"reference": change["parent"], "run": change["card"]}
    return out


def check_protocol(resolved: dict[str, Any], root: Path, where: str) -> dict[str, Any]:
    """Refuse a new run whose protocol-fixed keys differ from its experiment's reference, unless the card says why.

    Args:
        resolved: the resolved card (LoadedCard.resolved).
        root: the runs root.
        where: the card's path (named in the error).
    Returns:
        the protocol changes (empty when the run follows the protocol, or is the experiment's first).
    Raises:
        CardError: a change without experiment.protocol_change.
    """

    experiment = resolved["experiment"]["id"]
    done = [r for r in experiment_runs(root, experiment) if r["status"] == "completed" and r["has_results"]]
    reference = _reference({r["run_id"]: run_protocol(r["dir"]) for r in done})
    if reference is None:
        return {}
    ref_card = yaml.safe_load((root / experiment / reference / "card.yaml").read_text(encoding="utf-8"))
    changes = protocol_changes(card_protocol(ref_card), card_protocol(resolved))
    if changes and not resolved["experiment"].get("protocol_change"):
        listed = "; ".join(f"{k}: {v['reference']} → {v['run']}" for k, v in changes.items())
        raise CardError(f"{where}: changes protocol-fixed key(s) of experiment {experiment!r} against its reference run "
                        f"{reference} ({listed}); its results would not be comparable. Keep them, or set "
                        "experiment.protocol_change: \"why\" to run it anyway (it is then flagged not comparable)")
    return changes


def _reference(protocols: dict[str, dict[str, Any]]) -> str | None:
    """The run whose protocol most completed runs share (ties: the earliest)."""
    if not protocols:
        return None
    keys = {rid: json.dumps(p, sort_keys=True, default=str) for rid, p in protocols.items()}
    common = Counter(keys.values()).most_common()
    best = max(count for _, count in common)
    chosen = next(k for k, c in common if c == best) if sum(c == best for _, c in common) == 1 else None
    for rid, key in keys.items():  # insertion order is start order
        if chosen is None or key == chosen:
            return rid
    return None


def experiment_runs(root: Path, experiment: str, current: str | None = None) -> list[dict[str, Any]]:
    """Every run of an experiment from the registry, oldest first, with its folder, status and reason.

    Args:
        root: the runs root.
        experiment: the experiment id.
        current: a run being finished now (its comparison stage wrote a verdict): counted as completed.
    Returns:
        rows {"run_id", "variant", "status", "reason", "dir", "started", "has_results"}.
    """
    rows = []
    for row in R.summarise(R.read_registry(root)):
        if row.get("experiment") != experiment:
            continue
        folder = root / experiment / row["run_id"]
        status = row.get("status", "?")
        has_results = (folder / "comparison" / "verdict.json").exists()
        if row["run_id"] == current and has_results and status == "running":
            status = "completed"
        rows.append({"run_id": row["run_id"], "variant": row.get("variant"), "status": status,
                     "reason": row.get("error") or "", "dir": folder, "started": row.get("started"),
                     "has_results": has_results, "stage": row.get("stage", "")})
    return rows
