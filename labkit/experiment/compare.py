"""Compare the variants of one experiment: every run in the registry, under one protocol.

A variant is comparable with the experiment when its protocol-fixed keys (evaluation procedure,
seed, data version, budget) equal the experiment's reference protocol — the one most of its
completed runs share. Failed, interrupted and invalid runs stay in the table with their reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from labkit.card.load import card_diff
from labkit.core import io
from labkit.core import runs as R
from labkit.core.io import read_jsonl
from labkit.core.protocol import (
    PROTOCOL_KEYS,
    _reference,
    experiment_runs,
    protocol_changes,
    run_protocol,
)
from labkit.errors import MissingInput
from labkit.evaluate.verdict import paired
from labkit.experiment.final import openings
from labkit.scoring.bootstrap import MEAN_KEYS, concentration, paired_intervals


def _metric_key(name: str) -> str:
    return MEAN_KEYS.get(name, name)


def _changed_against_parent(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "card.diff.yaml"
    if not path.exists():
        return {}
    diff = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return {"parent": diff.get("parent"), "changed": {k: v.get("card") for k, v in (diff.get("changed") or {}).items()}}


def compare_experiment(root: Path, experiment: str, current: str | None = None, resamples: int = 2000,
                       level: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """The comparison of every run of an experiment.

    Args:
        root: the runs root.
        experiment: the experiment id.
        current: the run whose comparison stage is executing (counted as completed).
        resamples, level, seed: the paired bootstrap (labkit.scoring.bootstrap.paired_intervals).
    Returns:
        {"experiment", "reference", "reference_protocol", "runs": [...], "test_openings": [...]}; each run row has
        status and reason, and for runs with results: changed keys, comparable (+ protocol changes and the
        card's protocol_change reason), verdict, intervals, paired wins/losses/ties and concentration flags.
    """
    R.mark_dead_runs(root)  # a run whose process died is shown interrupted, never running
    rows = experiment_runs(root, experiment, current)
    if not rows:
        raise MissingInput(f"no runs of experiment {experiment!r} in {root / 'registry.jsonl'} (see `labkit runs`)")
    protocols = {r["run_id"]: run_protocol(r["dir"]) for r in rows if r["status"] == "completed" and r["has_results"]}
    reference = _reference(protocols)
    ref_protocol = protocols.get(reference) if reference else None
    ref_card = _load_card(root, experiment, reference) if reference else None
    for row in rows:
        row["dir"], folder = str(row["dir"]), Path(row["dir"])
        if not row["has_results"] or not (folder / "card.yaml").exists():
            continue
        card = yaml.safe_load((folder / "card.yaml").read_text(encoding="utf-8"))
        primary = card["experiment"]["target"]["primary_metric"]
        names = [primary] + [g["metric"] for g in card["experiment"].get("guardrails") or []]
        base_rows = read_jsonl(folder / "baseline" / "baseline_predictions.jsonl")
        tuned_rows = read_jsonl(folder / "comparison" / "tuned_predictions.jsonl")
        own = protocols.get(row["run_id"]) or run_protocol(folder)  # an invalid run is not among the protocols
        changes = protocol_changes(ref_protocol, own) if ref_protocol else {}
        verdict = io.read_json(folder / "comparison" / "verdict.json")
        row.update({
            "hypothesis": card["experiment"]["hypothesis"], "primary_metric": primary,
            "min_improvement": card["experiment"]["target"]["min_improvement"],
            **_changed_against_parent(folder),
            "against_reference": {k: v["card"] for k, v in card_diff(ref_card, card).items()}
            if reference and reference != row["run_id"] else {},
            "comparable": not changes, "protocol_changes": changes,
            "protocol_change_why": card["experiment"].get("protocol_change"),
            "confirmed": verdict["confirmed"], "verdict": verdict["verdict"],
            "guardrails_failed": [g["metric"] for g in verdict["guardrails"] if not g["ok"]],
            "intervals": paired_intervals(base_rows, tuned_rows, names, resamples=resamples, level=level, seed=seed),
            "paired": paired(base_rows, tuned_rows, primary),
            "concentration": concentration(base_rows, tuned_rows, _metric_key(primary))
            if _metric_key(primary) in tuned_rows[0] else None,
            "baseline_key": (io.read_json(folder / "baseline" / "baseline_key.json") or {}).get("key")
            if (folder / "baseline" / "baseline_key.json").exists() else None,
        })

    return {"experiment": experiment, "generated": io.utc_now(), "reference": reference,
            "reference_protocol": ref_protocol, "protocol_keys": [*PROTOCOL_KEYS, "data_version", "preference_version"],
            "bootstrap": {"resamples": resamples, "level": level, "seed": seed}, "runs": rows,
            "test_openings": openings(root, experiment)}


def _load_card(root: Path, experiment: str, run_id: str | None) -> dict[str, Any]:
    return yaml.safe_load((root / experiment / str(run_id) / "card.yaml").read_text(encoding="utf-8"))


def summary_rows(comparison: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per run for a table: status/reason, changes, primary metric with its interval, flags."""
    out = []
    for row in comparison["runs"]:
        flat: dict[str, Any] = {"run": row["run_id"], "variant": row["variant"], "status": row["status"],
                                "reason": row["reason"]}
        if "intervals" in row:
            metric = row["primary_metric"]
            iv = row["intervals"]["overall"][metric]
            flat.update({
                "changed vs parent": ", ".join(f"{k}={v}" for k, v in (row.get("changed") or {}).items()) or "—",
                "comparable": "yes" if row["comparable"] else "NO: " + ", ".join(row["protocol_changes"]),
                metric + " (baseline)": fmt_interval(iv["baseline"]),
                metric + " (tuned)": fmt_interval(iv["tuned"]),
                "gain [95% CI]": fmt_interval(iv["diff"], signed=True),
                "wins/losses/ties": "{wins}/{losses}/{ties}".format(**row["paired"]),
                "confirmed": row["confirmed"],
                "flags": "; ".join((row.get("concentration") or {}).get("flags", []) +
                                   [f"guardrail failed: {g}" for g in row["guardrails_failed"]]) or "—",
            })
        out.append(flat)
    return out


def fmt_interval(leaf: dict[str, Any], signed: bool = False) -> str:
    if leaf["value"] is None:
        return "n/a"
    spec = "+.3f" if signed else ".3f"
    if leaf["low"] is None:
        return format(leaf["value"], spec)
    return f"{format(leaf['value'], spec)} [{format(leaf['low'], spec)}, {format(leaf['high'], spec)}]"
