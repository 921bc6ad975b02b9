"""A variant's replicates judged across their seeds (`experiment.replicates`; docs/deciding.md#replicates).

The seeds of a variant are its completed, comparable runs with results that share its latest run's card (the
`experiment.replicates` count aside), one per training seed (the latest run of each seed). A variant with two or more
seeds is *replicated*: its value is the mean over its seeds, each seed's value and their spread are shown, its verdict
is taken on the mean against the card's reference, and the interval of the gain counts the seeds' and the examples'
variance (`labkit.scoring.seeds.seed_intervals`): CONFIRMED needs that interval's lower end (the upper end for a
lower-is-better metric) to clear `min_improvement`, not only the mean gain. Variant against variant, a replicated
variant is compared by its seeds (`variant_pairs`), never run by run.
"""

from __future__ import annotations

import json
from itertools import combinations
from typing import Any

from labkit.card.schema import Card
from labkit.evaluate.verdict import higher_is_better, paired, verdict
from labkit.scoring.metrics import RUN_METRICS, example_key
from labkit.scoring.seeds import decision, seed_intervals


def card_key(card: dict[str, Any]) -> str:
    """What makes two runs replicates of one variant: their archived card, the replicate count left out."""
    experiment = {k: v for k, v in (card.get("experiment") or {}).items() if k != "replicates"}
    return json.dumps({**card, "experiment": experiment}, sort_keys=True, default=str)


def seed_groups(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each variant's seeds: {variant: its runs, one per seed (the latest), in seed order}.

    Args:
        rows: compare_experiment's run rows, holding "tuned_rows", "seed" and "card_key" (oldest first).
    Returns:
        the groups of every variant with a completed comparable run with results.
    """
    done = [r for r in rows if "tuned_rows" in r and r.get("comparable") and r["status"] == "completed"]
    out: dict[str, list[dict[str, Any]]] = {}
    for variant in dict.fromkeys(r["variant"] for r in done):
        mine = [r for r in done if r["variant"] == variant]
        key = mine[-1]["card_key"]
        by_seed = {r["seed"]: r for r in mine if r["card_key"] == key}  # later runs of a seed replace earlier ones
        out[variant] = [by_seed[s] for s in sorted(by_seed, key=lambda s: (s is None, s))]
    return out


def _mean(values: list[Any]) -> Any:
    """The mean of the seeds' metric files, leaf by leaf (numbers averaged, other leaves taken from the first)."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, dict) for v in present):
        keys = dict.fromkeys(k for v in present for k in v)
        return {k: _mean([v.get(k) for v in present]) for k in keys}
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return sum(present) / len(present)
    return present[0] if present else None


def _example_metric(group: list[dict[str, Any]]) -> str | None:
    """The per-example metric the seeds are compared on: the primary one, else the first guardrail's."""
    first = group[-1]
    names = [first["primary_metric"], *first["guardrail_metrics"]]
    return next((n for n in names if n not in RUN_METRICS and n != "per_category_f1"), None)


def _mean_rows(group: list[dict[str, Any]], key: str | None) -> list[dict[str, Any]]:
    """Per example, the mean over the seeds of the value behind the metric (the paired wins and losses)."""
    if key is None:
        return []
    ids = [r["id"] for r in group[0]["tuned_rows"]]
    by_run = [{r["id"]: r for r in row["tuned_rows"]} for row in group]
    return [{"id": i, key: sum(float(run[i][key]) for run in by_run) / len(by_run)} for i in ids
            if all(i in run and key in run[i] for run in by_run)]


def _label(group: list[dict[str, Any]]) -> str:
    return f"{len(group)} seeds ({', '.join(str(r['seed']) for r in group)})"


def _seed_rows(reference: list[list[list[dict[str, Any]]]], group: list[dict[str, Any]]) -> dict[str, Any]:
    """The verdict's paired rows for a replicated variant: seed i's predictions against the reference's seed i (cycled
    when the two sides have different numbers of seeds; the baseline repeated), every example id made unique per seed
    and grouped by its example (or its data.fields.group), so the interval resamples examples with all their seeds.

    Args:
        reference: per reference seed, a one-element list holding its scored rows.
        group: the variant's seeds (compare rows with "tuned_rows").
    Returns:
        {"reference_rows", "tuned_rows"} for `labkit.evaluate.verdict.verdict`.
    """
    out: dict[str, Any] = {"reference_rows": [], "tuned_rows": []}
    for i in range(max(len(reference), len(group))):
        pairs = (("reference_rows", reference[i % len(reference)][0]), ("tuned_rows", group[i % len(group)]["tuned_rows"]))
        for side, rows in pairs:
            out[side] += [{**r, "id": f"{r['id']}#seed{i}", "group": r.get("group", r["id"])} for r in rows]
    return out


def _judge(summary: dict[str, Any], card: Card, group: list[dict[str, Any]], ref: list[dict[str, Any]] | None,
           bootstrap: dict[str, Any]) -> None:
    """The variant's verdict on its seeds' mean, held to the interval over seeds and examples."""
    tuned = {**_mean([r["tuned_metrics"] for r in group]), "run": _mean([r.get("run_metrics") for r in group])}
    baseline = group[-1]["baseline_metrics"]
    if card.experiment.target.against == "baseline":
        decided = verdict(card, baseline, tuned, **_seed_rows([[group[-1]["base_rows"]]] * len(group), group),
                          **bootstrap)
    else:
        ref_metrics = None if ref is None else {**_mean([r["tuned_metrics"] for r in ref]),
                                                "run": _mean([r.get("run_metrics") for r in ref])}
        rows = _seed_rows([[r["tuned_rows"]] for r in ref], group) if ref else {}
        decided = verdict(card, baseline, tuned, ref_metrics, None if ref is None else _label(ref), **rows,
                          **bootstrap)
    interval, target = summary["interval"], card.experiment.target
    if (decided["confirmed"] and interval and interval["diff"]["low"] is not None and target.min_improvement is not None
            and interval["metric"] == target.primary_metric):
        up = higher_is_better(interval["metric"])
        worst = interval["diff"]["low"] if up else -interval["diff"]["high"]
        if worst < target.min_improvement - 1e-12:
            decided = {**decided, "confirmed": False, "decision": "inconclusive", "verdict": (
                f"INCONCLUSIVE across {len(group)} seeds: the mean gain on {interval['metric']} clears "
                f"{target.min_improvement} but the {int(interval['level'] * 100)}% interval over seeds and examples "
                f"[{interval['diff']['low']:+.3f}, {interval['diff']['high']:+.3f}] does not "
                f"(was: {decided['verdict']})")}
    text = decided["verdict"]
    if not text.startswith("INCONCLUSIVE"):
        where = (f"; the {int(interval['level'] * 100)}% interval of the gain over seeds and examples is "
                 f"[{interval['diff']['low']:+.3f}, {interval['diff']['high']:+.3f}]"
                 if interval and interval["diff"]["low"] is not None else "")
        text = f"{text.rstrip('.')} (on the mean over {_label(group)}{where})."
    summary.update(confirmed=decided["confirmed"], verdict=text, decision=decided)


def variant_summaries(groups: dict[str, list[dict[str, Any]]], cards: dict[str, Card],
                      bootstrap: dict[str, Any]) -> list[dict[str, Any]]:
    """Every replicated variant judged across its seeds.

    Args:
        groups: `seed_groups`.
        cards: the runs' cards by run id.
        bootstrap: resamples, level, seed.
    Returns:
        one entry per variant with two or more seeds: {"variant", "runs", "seeds", "metric", "per_seed" ({seed:
        value}), "mean", "std", "min", "max", "against", "reference_runs", "interval" (`seed_intervals` of the
        variant against its reference: the baseline or the reference variant's seeds; None for a run metric),
        "confirmed", "verdict", "decision"}.
    """
    out = []
    for variant, group in groups.items():
        if len(group) < 2:
            continue
        card = cards[group[-1]["run_id"]]
        against = card.experiment.target.against
        ref = groups.get(against) if against != "baseline" else None
        metric = card.experiment.target.primary_metric
        if metric in RUN_METRICS or metric == "per_category_f1":
            values = [(r.get("run_metrics") or {}).get(metric) for r in group]
            interval = None
        else:
            ref_runs = [group[-1]["base_rows"]] if against == "baseline" else [r["tuned_rows"] for r in ref or []]
            runs = [r["tuned_rows"] for r in group]
            interval = seed_intervals(ref_runs, runs, metric, **bootstrap) if ref_runs else None
            values = interval["b"]["per_seed"] if interval else [r["tuned_metrics"]["overall"].get(metric)
                                                                 for r in group]
        known = [v for v in values if v is not None]
        mean = sum(known) / len(known) if known else None
        std = (sum((v - mean) ** 2 for v in known) / (len(known) - 1)) ** 0.5 if len(known) > 1 else None
        summary = {"variant": variant, "runs": [r["run_id"] for r in group], "seeds": [r["seed"] for r in group],
                   "metric": metric, "per_seed": {str(r["seed"]): v for r, v in zip(group, values)}, "mean": mean,
                   "std": std, "min": min(known) if known else None, "max": max(known) if known else None,
                   "against": against, "reference_runs": [r["run_id"] for r in ref] if ref else None,
                   "interval": interval}
        _judge(summary, card, group, ref, bootstrap)
        out.append(summary)
    return out


def same_examples(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two runs evaluated the same examples (the same ids with the same references), so their answers pair —
    whatever their base model: a variant of another base model has a baseline of its own and the same rows.

    Args:
        a, b: `labkit.experiment.compare.compare_experiment`'s run rows (their "tuned_rows").
    Returns:
        True when both evaluated the same, non-empty set of examples.
    """
    def examples(row: dict[str, Any]) -> list[tuple[Any, Any]]:
        return sorted((r.get("id"), r.get("target")) for r in row.get("tuned_rows") or [])

    return bool(a.get("tuned_rows")) and examples(a) == examples(b)


def variant_pairs(groups: dict[str, list[dict[str, Any]]], bootstrap: dict[str, Any]) -> list[dict[str, Any]]:
    """Variant against variant across seeds, for every two variants of which at least one is replicated.

    Args:
        groups: `seed_groups` (variants in the order of their first completed run).
        bootstrap: resamples, level, seed.
    Returns:
        entries shaped like `labkit.experiment.runs_table.pairwise`'s (a, b: the latest runs; "interval" {baseline:
        A's mean over seeds, tuned: B's, diff}; "paired" on the per-example means over seeds; run metrics averaged
        over seeds) plus "a_runs", "b_runs", "seeds" {"a", "b"}, "across_seeds" (`seed_intervals`) and "decision".
    """
    out = []
    for (va, a), (vb, b) in combinations(groups.items(), 2):
        if max(len(a), len(b)) < 2 or not same_examples(a[-1], b[-1]) \
                or a[-1]["primary_metric"] != b[-1]["primary_metric"]:
            continue
        metric = _example_metric(a) or "exact_match"
        across = seed_intervals([r["tuned_rows"] for r in a], [r["tuned_rows"] for r in b], metric, **bootstrap)
        run = {}
        for name in RUN_METRICS:
            ma, mb = (_mean([(r.get("run_metrics") or {}).get(name) for r in side]) for side in (a, b))
            if ma is not None and mb is not None:
                run[name] = {"a": ma, "b": mb, "ratio": mb / ma if ma else None}
        key = example_key(metric)
        out.append({"a": a[-1]["run_id"], "b": b[-1]["run_id"], "a_variant": va, "b_variant": vb, "metric": metric,
                    "a_runs": [r["run_id"] for r in a], "b_runs": [r["run_id"] for r in b],
                    "seeds": {"a": [r["seed"] for r in a], "b": [r["seed"] for r in b]},
                    "interval": {"baseline": across["a"], "tuned": across["b"], "diff": across["diff"]},
                    "paired": paired(_mean_rows(a, key), _mean_rows(b, key), metric), "run_metrics": run,
                    "across_seeds": across, "decision": decision(across["diff"], higher_is_better(metric))})
    return out
