"""Compare the variants of one experiment: every run in the registry, under one protocol.

A variant is comparable with the experiment when its protocol-fixed keys (evaluation procedure,
seed, data version, budget) equal the experiment's reference protocol — the one most of its
completed runs share. Failed, interrupted and invalid runs stay in the table with their reason.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from labkit import runs as R
from labkit.cards import card_diff
from labkit.compare import paired
from labkit.stats import MEAN_KEYS, concentration, paired_intervals

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
    data = R.read_json(manifest) if manifest.exists() else {}
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
    from labkit.cards import CardError

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


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """JSON lines of a run file ([] when the file does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _metric_key(name: str) -> str:
    return MEAN_KEYS.get(name, name)


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
        resamples, level, seed: the paired bootstrap (labkit.stats.paired_intervals).
    Returns:
        {"experiment", "reference", "reference_protocol", "runs": [...], "test_openings": [...]}; each run row has
        status and reason, and for runs with results: changed keys, comparable (+ protocol changes and the
        card's protocol_change reason), verdict, intervals, paired wins/losses/ties and concentration flags.
    """
    R.mark_dead_runs(root)  # a run whose process died is shown interrupted, never running
    rows = experiment_runs(root, experiment, current)
    if not rows:
        raise FileNotFoundError(f"no runs of experiment {experiment!r} in {root / 'registry.jsonl'} (see `labkit runs`)")
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
        verdict = R.read_json(folder / "comparison" / "verdict.json")
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
            "baseline_key": (R.read_json(folder / "baseline" / "baseline_key.json") or {}).get("key")
            if (folder / "baseline" / "baseline_key.json").exists() else None,
        })
    from labkit.final import openings

    return {"experiment": experiment, "generated": R.utc_now(), "reference": reference,
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
