"""The runs of an experiment side by side: one flat row per run, and the paired view between any two runs."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path
from typing import Any

from labkit.evaluate.verdict import paired
from labkit.experiment.replicates import same_examples, seed_groups, variant_pairs
from labkit.scoring.bootstrap import paired_intervals
from labkit.scoring.metrics import RUN_METRICS
from labkit.show.tables import fmt_gib, fmt_seconds


def fmt_interval(leaf: dict[str, Any] | None, signed: bool = False) -> str:
    """A bootstrap leaf {value, low, high} as "v [low, high]" ("n/a" without a value)."""
    if not leaf or leaf["value"] is None:
        return "n/a"
    spec = "+.3f" if signed else ".3f"
    if leaf["low"] is None:
        return format(leaf["value"], spec)
    return f"{format(leaf['value'], spec)} [{format(leaf['low'], spec)}, {format(leaf['high'], spec)}]"


def fmt_change(key: str, change: dict[str, Any], width: int | None = None) -> str:
    """One changed card key as `key: old → new` (paths resolved: the report shows them relative to the project,
    `labkit.experiment.shareable`), each value cut at `width` characters when given."""
    def clean(value: Any) -> Any:  # unset keys (None) of a list of sections are noise in a one-line diff
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if v is not None}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    def show(value: Any) -> str:
        text = "—" if value is None else str(clean(value))
        return text if width is None or len(text) <= width else text[: width - 1] + "…"
    return f"{key}: {show(change.get('old'))} → {show(change.get('new'))}"


PATH_KEYS = ("data.source.path", "data.source.files", "model.source")


def spelling_only(key: str, change: dict[str, Any], parent: str | None) -> bool:
    """True for an archived diff's path "change" that names the same file: the parent card's relative path against
    the child's resolved one (runs archived before card diffs compared resolved sources).

    Args:
        key: the changed key.
        change: {"old", "new"}.
        parent: the parent card's file (card.diff.yaml's "parent").
    """
    old, new = change.get("old"), change.get("new")
    if key not in PATH_KEYS or not parent:
        return False
    if isinstance(old, dict) and isinstance(new, dict):
        return old.keys() == new.keys() and all(spelling_only(key, {"old": old[k], "new": new[k]}, parent) for k in old)
    if not isinstance(old, str) or not isinstance(new, str) or Path(old).is_absolute() or ":" in old.split("/")[0]:
        return False
    return str((Path(parent).parent / old).resolve()) == new


def _metric_cell(row: dict[str, Any], name: str) -> str:
    if name in RUN_METRICS:
        value = (row.get("run_metrics") or {}).get(name)
        return "—" if value is None else f"{value:.3f}"
    return fmt_interval(((row.get("intervals") or {}).get("overall") or {}).get(name, {}).get("tuned"))


def _speed(metrics: dict[str, Any]) -> str:
    """Counted tokens per second and model FLOPs utilisation ("1,234 · 0.12 %"), "—" where not counted."""
    if metrics.get("tokens_per_second") is None:
        return "—"
    mfu = metrics.get("mfu")
    return f"{metrics['tokens_per_second']:,.0f} · " + ("—" if mfu is None else f"{mfu:.2%}")


def summary_rows(comparison: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per run: status, primary metric and guardrails with intervals, the gain against the card's
    reference, training time, steps, tokens seen, peak memory, cost, the verdict, and the card diff against the parent."""
    out = []
    for row in comparison["runs"]:
        metrics = row.get("run_metrics") or {}
        flat: dict[str, Any] = {"run": row["run_id"], "status": row["status"]  # the run id starts with the variant
                                + (" (budget)" if row.get("budget_note") else "")}
        if row.get("replicate"):  # a replicate of its variant (experiment.replicates)
            flat["seed"] = f"{row.get('seed')} (replicate {row['replicate']}/{row.get('replicates')})"
        if "intervals" in row:
            primary = row["primary_metric"]
            against = row.get("against", "baseline")
            iv = (row.get("against_intervals") or row["intervals"])["overall"].get(primary)
            gain = "—" if primary in RUN_METRICS else fmt_interval(iv["diff"] if iv else None, signed=True)
            flat.update({
                "primary": f"{primary} = {_metric_cell(row, primary)}",
                "against": against if against == "baseline" else f"{against} ({row.get('reference_run') or 'no run yet'})",
                "gain vs reference [95% CI]": gain,
                "guardrails": "; ".join(f"{g} = {_metric_cell(row, g)}" for g in row["guardrail_metrics"]
                                        if g != "per_category_f1") or "—",
            })
        flat.update({"training time": fmt_seconds(metrics.get("train_seconds")),
                     "steps": metrics.get("steps") if metrics.get("steps") is not None else "—",
                     "tokens seen": f"{metrics['tokens_seen']:,.0f}" if metrics.get("tokens_seen") else "—",
                     "tokens/s · MFU": _speed(metrics),
                     "peak memory": fmt_gib(metrics.get("peak_memory_gib")),
                     "cost": f"{metrics['cost']:.2f}" if metrics.get("cost") is not None else "—"})
        if "intervals" in row:
            pairs = row.get("paired")
            concentration = row.get("concentration")
            flat.update({
                "verdict": ("CONFIRMED" if row["confirmed"] else row["verdict"].split(":")[0])
                + ("" if row["comparable"] else " · NOT COMPARABLE: " + ", ".join(row["protocol_changes"]))
                + (f" · {row['budget_note']}" if row.get("budget_note") else "")
                + (f" · NOT COMPARABLE: {row['steps_not_comparable']}" if row.get("steps_not_comparable") else ""),
                "wins/losses/ties": "{wins}/{losses}/{ties}".format(**pairs) if pairs and pairs.get("key") else "—",
                "changed vs parent": "; ".join(fmt_change(k, v, 40) for k, v in (row.get("changed") or {}).items()) or "—",
                "flags": "; ".join(((concentration or {}).get("flags") or []) +
                                   [f"guardrail failed: {g}" for g in row["guardrails_failed"]]) or "—",
            })
        if row.get("reason"):
            flat["reason"] = row["reason"]
        out.append(flat)
    return out


# the report's runs table shows the decision; the rest of a run's row goes to two more tables (cost and speed; the
# reference, card changes and reasons) so that each fits a page
DECISION_COLUMNS = ("run", "status", "seed", "primary", "gain vs reference [95% CI]", "guardrails", "wins/losses/ties",
                    "verdict", "flags")
COST_COLUMNS = ("run", "training time", "steps", "tokens seen", "tokens/s · MFU", "peak memory", "cost")


def column_groups(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], ...]:
    """`summary_rows` cut into three tables, each row keyed by its run: the decision (DECISION_COLUMNS), cost and
    speed (COST_COLUMNS), and every other column (against, changed vs parent, reason, any column added later).

    Returns:
        (decision rows, cost rows, other rows); a table whose rows hold only the run is empty.
    """
    def pick(row: dict[str, Any], keep: Any) -> dict[str, Any]:
        return {k: v for k, v in row.items() if keep(k)}
    known = set(DECISION_COLUMNS) | set(COST_COLUMNS)
    tables = ([pick(r, lambda k: k in DECISION_COLUMNS) for r in rows], [pick(r, lambda k: k in COST_COLUMNS) for r in rows],
              [pick(r, lambda k: k == "run" or k not in known) for r in rows])
    return tuple(t if any(len(r) > 1 for r in t) else [] for t in tables)


def pairwise(rows: list[dict[str, Any]], bootstrap: dict[str, Any]) -> list[dict[str, Any]]:
    """Paired intervals between every two comparable completed runs evaluated on the same examples; a variant with
    several seeds (`experiment.replicates`) is compared as a variant, across its seeds
    (`labkit.experiment.replicates.variant_pairs`), and its runs are not paired one by one.

    Args:
        rows: compare_experiment's run rows, still holding "tuned_rows" (and "seed", "card_key").
        bootstrap: resamples, level, seed.
    Returns:
        one entry per pair (a older than b): {"a", "b", "metric", "interval" ({baseline: a, tuned: b, diff: b − a}),
        "paired" (b against a per example), "run_metrics": {name: {"a", "b", "ratio"}}}; a pair across seeds also
        has "a_runs", "b_runs", "seeds", "across_seeds" and "decision".
    """
    groups = seed_groups(rows)
    replicated = {variant for variant, group in groups.items() if len(group) > 1}
    done = [r for r in rows if "tuned_rows" in r and r.get("comparable") and r["status"] == "completed"
            and r["variant"] not in replicated]
    out = []
    for a, b in combinations(done, 2):
        if not same_examples(a, b) or a["primary_metric"] != b["primary_metric"]:
            continue  # different evaluation examples or different questions: no paired comparison
        metric = a["primary_metric"] if a["primary_metric"] not in RUN_METRICS else next(
            (g for g in a["guardrail_metrics"] if g not in RUN_METRICS and g != "per_category_f1"), "exact_match")
        interval = paired_intervals(a["tuned_rows"], b["tuned_rows"], [metric], **bootstrap)["overall"][metric]
        run = {}
        for name in RUN_METRICS:
            va, vb = (a.get("run_metrics") or {}).get(name), (b.get("run_metrics") or {}).get(name)
            if va is not None and vb is not None:
                run[name] = {"a": va, "b": vb, "ratio": vb / va if va else None}
        out.append({"a": a["run_id"], "b": b["run_id"], "a_variant": a["variant"], "b_variant": b["variant"],
                    "metric": metric, "interval": interval, "paired": paired(a["tuned_rows"], b["tuned_rows"], metric),
                    "run_metrics": run})
    return out + variant_pairs(groups, bootstrap)


def _side(pair: dict[str, Any], side: str) -> str:
    """A pair's side: its variant and run, or its variant and seeds (a pair across seeds)."""
    seeds = (pair.get("seeds") or {}).get(side)
    if seeds is None:
        return f"{pair[side + '_variant']} · {pair[side]}"
    return f"{pair[side + '_variant']} · {len(seeds)} seed(s): {', '.join(str(s) for s in seeds)}"


def _seeds(leaf: dict[str, Any]) -> str:
    """A mean over seeds' per-seed values and spread ("" for one run)."""
    if len(leaf.get("per_seed") or []) < 2:
        return ""
    each = " / ".join(f"{v:.3f}" for v in leaf["per_seed"])
    return f"; seeds {each} (sd {leaf['std']:.3f}, {leaf['min']:.3f}–{leaf['max']:.3f})"


def pair_rows(comparison: dict[str, Any]) -> list[dict[str, Any]]:
    """The run-vs-run view as flat rows."""
    out = []
    for p in comparison.get("pairs") or []:
        iv = p["interval"]
        ratios = ", ".join(f"{k} ×{v['ratio']:.2f}" for k, v in p["run_metrics"].items() if v["ratio"] is not None)
        out.append({"A": _side(p, "a"), "B": _side(p, "b"), "metric": p["metric"],
                    "A value": fmt_interval(iv["baseline"]) + _seeds(iv["baseline"]),
                    "B value": fmt_interval(iv["tuned"]) + _seeds(iv["tuned"]),
                    "B − A [95% CI]": fmt_interval(iv["diff"], signed=True) + (
                        f"; across seeds and examples: {p['decision']} (examples only: "
                        f"{fmt_interval(p['across_seeds']['diff_examples_only'], signed=True)})"
                        if "decision" in p else "")
                    + ("" if (p.get("steps") or {}).get("comparable", True) else f" · NOT COMPARABLE: {p['steps']['why']}"),
                    "B wins/losses/ties": "{wins}/{losses}/{ties}".format(**p["paired"]),
                    "B / A run metrics": ratios or "—"})
    return out


def seed_rows(comparison: dict[str, Any]) -> list[dict[str, Any]]:
    """Every seed of each replicated variant, then the variant across its seeds: the mean, the spread, the gain
    against its reference with the interval over seeds and examples (and over the examples alone), the verdict."""
    out = []
    for v in comparison.get("variants") or []:
        metric, iv = v["metric"], v.get("interval") or {}
        for run, seed in zip(v["runs"], v["seeds"]):
            value = v["per_seed"].get(str(seed))
            out.append({"variant": v["variant"], "seed": str(seed), "run": run,
                        metric: "—" if value is None else f"{value:.3f}"})
        spread = "—" if v["mean"] is None else (f"{v['mean']:.3f} (sd {v['std']:.3f}, {v['min']:.3f}–{v['max']:.3f})"
                                                 if v["std"] is not None else f"{v['mean']:.3f}")
        out.append({"variant": v["variant"], "seed": f"mean of {len(v['seeds'])}", "run": "", metric: spread,
                    "gain vs reference [95% CI, seeds and examples]": fmt_interval(iv.get("diff"), signed=True),
                    "examples only": fmt_interval(iv.get("diff_examples_only"), signed=True),
                    "verdict": v["verdict"]})
    return out
