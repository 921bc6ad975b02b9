"""`labkit.runs()`: the registry as a pandas DataFrame, one row per run (the columns of `labkit runs` and
machine-friendly ones, as `labkit runs --json` prints them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from labkit.core import listing
from labkit.core import runs as R

__all__ = ["runs", "runs_root"]


def runs_root(runs: str | Path | None = None) -> Path:
    """The runs root: `runs` when given, else $LABKIT_RUNS or <project>/runs (as the `labkit` command finds it)."""
    return Path(runs).expanduser().resolve() if runs else R.runs_root()


def runs(experiment: str | None = None, runs: str | Path | None = None) -> pd.DataFrame:
    """The registry as a DataFrame: every run, failed, interrupted and abandoned ones too.

    A batch run whose process is gone is recorded interrupted first (as `labkit runs` does); an interactive run
    whose kernel is gone shows `abandoned (kernel gone)`.

    Args:
        experiment: only this experiment's runs (None: every run).
        runs: the runs root (default: $LABKIT_RUNS or <project>/runs).
    Returns:
        one row per run, oldest first, indexed by run id: run, replicate, status, stage, updated, result (the columns
        of `labkit runs`) and experiment, variant, state, abandoned, mode, stages_done, started, stopped_by,
        replicate_index, replicates, seed, metric, baseline, tuned, decision, confirmed, error, dir; `updated` and
        `started` as UTC timestamps.
    """
    root = runs_root(runs)
    for run_id in R.mark_dead_runs(root):
        print(f"labkit: {run_id} was recorded as running but its process is gone: marked interrupted", file=sys.stderr)
    rows = listing.rows(root, experiment)
    frame = pd.DataFrame(rows, columns=list(listing.FIELDS))
    for column in ("started", "updated"):
        if column in frame:
            frame[column] = pd.to_datetime(frame[column], utc=True, errors="coerce")
    return frame.set_index("run_id", drop=False).rename_axis(None)
