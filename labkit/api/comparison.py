"""`labkit.compare(EXPERIMENT)`: the comparison of an experiment's runs, as data and as DataFrames.

The same comparison `labkit compare` prints and stage 05 shows (`labkit.experiment.compare`), without writing the
HTML report (`labkit compare EXPERIMENT` writes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from labkit.api.registry import runs_root
from labkit.experiment.compare import compare_experiment, seed_rows, summary_rows

__all__ = ["Comparison", "compare"]


@dataclass(frozen=True)
class Comparison:
    """An experiment's runs compared under one protocol.

    Attributes:
        experiment: the experiment id.
        data: the whole comparison (`labkit.experiment.compare.compare_experiment`): runs, reference, pairs, variants.
        table: one row per run as `labkit compare` prints it (text cells: intervals, verdict, flags), indexed by run.
        values: one row per run with numbers: primary_metric, value, low, high, against, gain, gain_low, gain_high,
            confirmed, comparable, verdict, train_seconds, steps, cost.
        seeds: every seed of a replicated variant, then the variant across its seeds (empty without replicates).
    """

    experiment: str
    data: dict[str, Any]
    table: pd.DataFrame
    values: pd.DataFrame
    seeds: pd.DataFrame

    def _repr_html_(self) -> str:  # a notebook cell shows the table (pandas escapes every cell)
        return self.table._repr_html_() or ""


def _values(row: dict[str, Any]) -> dict[str, Any]:
    """The numbers of one run's comparison row (None where the run has no results)."""
    metrics = row.get("run_metrics") or {}
    out: dict[str, Any] = {"run_id": row["run_id"], "variant": row.get("variant"), "status": row.get("status"),
                           "primary_metric": row.get("primary_metric"), "against": row.get("against"),
                           "confirmed": row.get("confirmed"), "comparable": row.get("comparable"),
                           "verdict": row.get("verdict"), "train_seconds": metrics.get("train_seconds"),
                           "steps": metrics.get("steps"), "cost": metrics.get("cost")}
    primary = row.get("primary_metric")
    overall = ((row.get("intervals") or {}).get("overall") or {}).get(primary) or {}
    against = ((row.get("against_intervals") or row.get("intervals") or {}).get("overall") or {}).get(primary) or {}
    tuned, diff = overall.get("tuned") or {}, against.get("diff") or {}
    out.update({"value": tuned.get("value"), "low": tuned.get("low"), "high": tuned.get("high"),
                "gain": diff.get("value"), "gain_low": diff.get("low"), "gain_high": diff.get("high")})
    return out


def compare(experiment: str, runs: str | Path | None = None, resamples: int = 2000) -> Comparison:
    """Compare every run of an experiment: paired bootstrap intervals, each run judged against its card's
    reference, the protocol check (a run that changes a protocol-fixed key is flagged not comparable).

    Args:
        experiment: the experiment id (`experiment.id` of its cards).
        runs: the runs root (default: $LABKIT_RUNS or <project>/runs).
        resamples: bootstrap resamples.
    Returns:
        the Comparison (its `table` shows in a notebook cell).
    Raises:
        MissingInput: the experiment has no runs.
    """
    data = compare_experiment(runs_root(runs), experiment, resamples=resamples)
    table = pd.DataFrame(summary_rows(data))
    if "run" in table:
        table = table.set_index("run").rename_axis(None)
    values = pd.DataFrame([_values(r) for r in data["runs"]])
    if "run_id" in values:
        values = values.set_index("run_id", drop=False).rename_axis(None)
    return Comparison(experiment, data, table, values, pd.DataFrame(seed_rows(data)))
