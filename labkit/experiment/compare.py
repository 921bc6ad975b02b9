"""Compare the variants of one experiment: every run in the registry, under one protocol.

A variant is comparable with the experiment when its protocol-fixed keys (evaluation procedure,
seed, data version, budget) equal the experiment's reference protocol — the one most of its
completed runs share. Failed, interrupted and invalid runs stay in the table with their reason.
Each run is judged again here against its card's reference (`experiment.target.against`: the baseline or a
sibling variant's latest completed run), so a run whose reference finished later gets its verdict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from labkit.card.load import card_diff
from labkit.card.schema import Card
from labkit.core import io
from labkit.core import runs as R
from labkit.core.comparability import budget_note, comparable, marked, training_steps
from labkit.core.io import read_jsonl
from labkit.core.protocol import (
    PROTOCOL_KEYS,
    _reference,
    experiment_runs,
    protocol_changes,
    run_protocol,
)
from labkit.core.replicates import read_replicate, run_seed
from labkit.errors import MissingInput
from labkit.evaluate.verdict import paired, verdict
from labkit.experiment.openings import openings
from labkit.experiment.replicates import card_key, seed_groups, variant_summaries
from labkit.experiment.runs_table import fmt_interval, pairwise, seed_rows, spelling_only, summary_rows
from labkit.scoring.bootstrap import concentration_for, paired_intervals
from labkit.scoring.metrics import RUN_METRICS
from labkit.stages.records import baseline_named, strongest_baseline
from labkit.stages.run_metrics import run_metrics

__all__ = ["compare_experiment", "fmt_interval", "seed_rows", "summary_rows"]


def _changed_against_parent(run_dir: Path) -> dict[str, Any]:
    """What the card changed against its parent, as {key: {"old", "new"}} (paths resolved, `spelling_only`)."""
    path = run_dir / "card.diff.yaml"
    if not path.exists():
        return {}
    diff = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    changed = {k: {"old": (v or {}).get("parent"), "new": (v or {}).get("card")} for k, v in (diff.get("changed") or {}).items()}
    changed = {k: v for k, v in changed.items() if not spelling_only(k, v, diff.get("parent"))}  # older runs' diffs
    return {"parent": diff.get("parent"), "changed": changed}


def _latest(rows: list[dict[str, Any]], variant: str) -> dict[str, Any] | None:
    done = [r for r in rows if r["variant"] == variant and r["status"] == "completed" and "tuned_rows" in r]
    return done[-1] if done else None


def _judge_variant_row(row: dict[str, Any], rows: list[dict[str, Any]], card: Card, names: list[str],
                       bootstrap: dict[str, Any]) -> None:
    """Verdict, intervals and paired view of one run against its card's reference, into the row."""
    target = card.experiment.target
    tuned = {**row["tuned_metrics"], "run": row["run_metrics"]}
    ref = _latest(rows, target.against) if target.against != "baseline" else None
    if target.against == "baseline":
        ref_rows = row["base_rows"]
        decision = verdict(card, row["baseline_metrics"], tuned, reference_rows=ref_rows, tuned_rows=row["tuned_rows"],
                           **bootstrap)
    else:
        ref_metrics = {**ref["tuned_metrics"], "run": ref["run_metrics"]} if ref else None
        ref_rows = ref["tuned_rows"] if ref else None
        decision = verdict(card, row["baseline_metrics"], tuned, ref_metrics, ref["run_id"] if ref else None,
                           reference_rows=ref_rows, tuned_rows=row["tuned_rows"], **bootstrap)
    which = strongest_baseline(Path(row["dir"]))  # the baseline rows and metrics are this prompt's
    decision = baseline_named(decision, which)
    decision = marked(decision, Path(row["dir"]), Path(ref["dir"]) if ref else None)  # budget stop, steps
    if ref:
        row["steps_not_comparable"] = comparable(Path(row["dir"]), Path(ref["dir"]))["why"]
    row.update({"against": target.against, "reference_run": ref["run_id"] if ref else None,
                "baseline_prompt": which["name"],
                "confirmed": decision["confirmed"], "verdict": decision["verdict"], "decision": decision,
                "guardrails_failed": [g["metric"] for g in decision["guardrails"] if not g["ok"]]})
    row["intervals"] = paired_intervals(row["base_rows"], row["tuned_rows"], names, **bootstrap)
    if ref_rows is not None and target.against != "baseline":
        row["against_intervals"] = paired_intervals(ref_rows, row["tuned_rows"], names, **bootstrap)
    if ref_rows is not None:
        row["paired"] = paired(ref_rows, row["tuned_rows"], target.primary_metric)
        row["concentration"] = concentration_for(ref_rows, row["tuned_rows"], target.primary_metric)
    else:
        row["paired"], row["concentration"] = None, None


def compare_experiment(root: Path, experiment: str, current: str | None = None, resamples: int = 2000,
                       level: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """The comparison of every run of an experiment.

    Args:
        root: the runs root.
        experiment: the experiment id.
        current: the run whose comparison stage is executing (counted as completed).
        resamples, level, seed: the paired bootstrap (labkit.scoring.bootstrap.paired_intervals).
    Returns:
        {"experiment", "reference", "reference_protocol", "runs": [...], "pairs": [...], "test_openings": [...]}; each
        run row has status and reason, and for runs with results: changed keys ({key: {old, new}}), comparable (+
        protocol changes and the card's protocol_change reason), run metrics, verdict against the card's reference,
        intervals against the baseline (and against the reference variant), paired wins/losses/ties and
        concentration on the primary metric's per-example value (None for a run metric), its training "seed" (and
        "replicate", "replicates" for a replicate), "training_steps" and "budget_note" ("budget-stopped at 8/24
        steps" or ""), "steps_not_comparable" against a reference variant (`labkit.core.comparability.comparable`'s
        why, "" when comparable). "pairs" holds the paired intervals between every two comparable runs (each with
        "steps": `comparable`'s answer for the two), and between variants across their seeds where one has
        several; "variants" judges each variant with several seeds across them (labkit.experiment.replicates.variant_summaries).
    """
    R.mark_dead_runs(root)  # a run whose process died is shown interrupted, never running
    rows = experiment_runs(root, experiment, current)
    if not rows:
        raise MissingInput(f"no runs of experiment {experiment!r} in {root / 'registry.jsonl'} (see `labkit runs`)")
    protocols = {r["run_id"]: run_protocol(r["dir"]) for r in rows if r["status"] == "completed" and r["has_results"]}
    reference = _reference(protocols)
    ref_protocol = protocols.get(reference) if reference else None
    ref_card = _load_card(root, experiment, reference) if reference else None
    bootstrap = {"resamples": resamples, "level": level, "seed": seed}
    cards: dict[str, Card] = {}
    for row in rows:
        row["dir"], folder = str(row["dir"]), Path(row["dir"])
        if (folder / "training" / "outcome.json").exists() or (folder / "parameter_check" / "fit.json").exists():
            price = (_load_card(root, experiment, row["run_id"]).get("budget") or {}).get("price_per_gpu_hour", 0.0)
            row["run_metrics"] = run_metrics(folder, price)
            steps = training_steps(folder)
            row.update(training_steps=steps, budget_note=budget_note(steps))  # "budget-stopped at 8/24 steps"
        if not row["has_results"] or not (folder / "card.yaml").exists():
            continue
        raw = yaml.safe_load((folder / "card.yaml").read_text(encoding="utf-8"))
        cards[row["run_id"]] = Card.model_validate(raw)
        own = protocols.get(row["run_id"]) or run_protocol(folder)  # an invalid run is not among the protocols
        changes = protocol_changes(ref_protocol, own) if ref_protocol else {}
        row.update({
            "hypothesis": raw["experiment"]["hypothesis"], "primary_metric": raw["experiment"]["target"]["primary_metric"],
            "min_improvement": raw["experiment"]["target"].get("min_improvement"),
            "guardrail_metrics": [g["metric"] for g in raw["experiment"].get("guardrails") or []],
            **_changed_against_parent(folder),
            "against_reference": {k: v["card"] for k, v in card_diff(ref_card, raw).items()}
            if reference and reference != row["run_id"] else {},
            "comparable": not changes, "protocol_changes": changes,
            "protocol_change_why": raw["experiment"].get("protocol_change"),
            "base_rows": read_jsonl(folder / "baseline" / "baseline_predictions.jsonl"),
            "tuned_rows": read_jsonl(folder / "comparison" / "tuned_predictions.jsonl"),
            "baseline_metrics": io.read_json(folder / "baseline" / "baseline_metrics.json"),
            "tuned_metrics": io.read_json(folder / "comparison" / "tuned_metrics.json"),
            "baseline_key": (io.read_json(folder / "baseline" / "baseline_key.json") or {}).get("key")
            if (folder / "baseline" / "baseline_key.json").exists() else None,
            "seed": run_seed(folder, raw), "card_key": card_key(raw), **_replicate(folder),
        })
        row.setdefault("run_metrics", run_metrics(folder))
    for row in rows:
        if row["run_id"] in cards:
            card = cards[row["run_id"]]
            names = [row["primary_metric"], *row["guardrail_metrics"]]
            _judge_variant_row(row, rows, card, [n for n in names if n not in RUN_METRICS] or ["exact_match"], bootstrap)
    pairs = pairwise(rows, bootstrap)
    dirs = {r["run_id"]: Path(r["dir"]) for r in rows}
    for pair in pairs:  # run against run: flagged when their training steps are not comparable
        if pair.get("a") in dirs and pair.get("b") in dirs:
            pair["steps"] = comparable(dirs[pair["a"]], dirs[pair["b"]])
    variants = variant_summaries(seed_groups(rows), cards, bootstrap)
    for row in rows:  # the per-example rows served the statistics; the comparison keeps their results only
        for key in ("base_rows", "tuned_rows", "baseline_metrics", "tuned_metrics", "card_key"):
            row.pop(key, None)
    return {"experiment": experiment, "generated": io.utc_now(), "reference": reference,
            "reference_protocol": ref_protocol, "protocol_keys": [*PROTOCOL_KEYS, "data_version", "preference_version"],
            "bootstrap": bootstrap, "runs": rows, "pairs": pairs, "variants": variants,
            "test_openings": openings(root, experiment)}


def _replicate(folder: Path) -> dict[str, Any]:
    """A replicate's index and count ({} for a run without replicates)."""
    found = read_replicate(folder)
    return {"replicate": found["index"], "replicates": found["of"]} if found else {}


def _load_card(root: Path, experiment: str, run_id: str | None) -> dict[str, Any]:
    path = root / experiment / str(run_id) / "card.yaml"
    return yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else {}
