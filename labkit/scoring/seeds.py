"""Two variants compared across their training seeds: a two-level paired bootstrap over seeds and examples.

A variant trained with k seeds (`experiment.replicates`) has k scored prediction sets on the same examples. Its value
is the mean over its seeds. The interval of the difference B − A counts both sources of variance:

- examples: one multinomial weight vector per resample, the *same* for every run of both variants (the examples are
  shared, so the comparison stays paired: `labkit.scoring.bootstrap.weights`, row 0 all ones);
- seeds: in each resample, each variant's k seeds are drawn with replacement, independently of the examples and of
  the other variant (seeds and examples are crossed, not nested: every seed is scored on every example).

The metric of each run is computed under each example weight vector (`labkit.scoring.bootstrap.metric`), then each
variant's value in a resample is the mean of its drawn seeds. Two corrections keep the seed level's variance at the
seeds' own share (model y[s, e] = mu + seed effect a_s + example effect b_e + interaction e_se):

- drawing k values out of k with replacement shrinks their variance by (k − 1)/k: the deviations are widened by
  sqrt(k / (k − 1)), so the bootstrap variance is the unbiased sample variance s² of the seeds' values;
- each seed's value also carries the interaction's noise on n examples (var e / n), which the example level already
  counts: for a metric that is a mean of per-example values, var a is estimated as s² − MS_res / n (MS_res: the
  seed × example residual mean square of a two-way layout, clipped at 0), and the deviations are scaled to it.
  Other metrics (F1, slot F1) keep s², which errs on the wide side.

With one run on a side (the baseline, a variant without replicates) that side has no seed level. The percentile
interval of the difference is reported beside the one with the seeds held fixed (examples only), which shows how
much the seeds add. Method and example: docs/deciding.md#replicates.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from labkit.scoring.bootstrap import MEAN_KEYS, Columns, interval, metric, weights


def spread(values: list[float]) -> dict[str, Any]:
    """The seeds' values and their spread: {"per_seed", "mean", "std" (sample, ddof 1; None for one seed), "min",
    "max"}."""
    arr = np.asarray(values, dtype=float)
    return {"per_seed": [float(v) for v in arr], "mean": float(arr.mean()),
            "std": float(arr.std(ddof=1)) if len(arr) > 1 else None, "min": float(arr.min()), "max": float(arr.max())}


def seed_variance_share(per_example: np.ndarray) -> float:
    """The share of the seeds' sample variance that is the seeds' own (not the interaction's noise on n examples).

    Args:
        per_example: (k seeds, n examples) per-example values of a metric that is their mean.
    Returns:
        max(0, s² − MS_res / n) / s² (1 when the seeds' values do not vary or there is one example).
    """
    k, n = per_example.shape
    seed_means = per_example.mean(axis=1)
    s2 = float(seed_means.var(ddof=1)) if k > 1 else 0.0
    if s2 <= 0 or n < 2:
        return 1.0
    residual = per_example - seed_means[:, None] - per_example.mean(axis=0)[None, :] + per_example.mean()
    ms_res = float((residual ** 2).sum()) / ((k - 1) * (n - 1))
    return max(0.0, s2 - ms_res / n) / s2


def _seed_draws(values: np.ndarray, draws: int, rng: np.random.Generator, share: float | None) -> np.ndarray:
    """A variant's mean over its seeds under each example resample: values (k, 1 + draws) → (1 + draws,); seeds
    drawn with replacement, their deviations scaled to `share` of the unbiased seed variance (None: seeds fixed)."""
    k = values.shape[0]
    mean = values.mean(axis=0)
    if k == 1 or share is None:
        return mean
    widened = mean + np.sqrt(share * k / (k - 1)) * (values - mean)  # see the module docstring
    counts = rng.multinomial(k, np.full(k, 1.0 / k), size=draws) / k  # (draws, k)
    return np.concatenate([mean[:1], np.einsum("rs,sr->r", counts, widened[:, 1:])])


def seed_intervals(a_runs: list[list[dict[str, Any]]], b_runs: list[list[dict[str, Any]]], name: str,
                   resamples: int = 2000, level: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """B against A across seeds and examples: each side's mean over its seeds, every seed's value, and the intervals.

    Args:
        a_runs: variant A's runs, each its scored predictions (`labkit.scoring.metrics.score_predictions` rows); the
            baseline is one run.
        b_runs: variant B's runs, on the same examples.
        name: a metric with one value per run (not per_category_f1).
        resamples: bootstrap resamples.
        level: interval coverage.
        seed: resampling seed (the same seed gives the same intervals).
    Returns:
        {"method", "metric", "n" (examples), "level", "resamples", "a" and "b": {"value", "low", "high" (the mean
        over seeds and its interval), "per_seed", "mean", "std", "min", "max", "seed_variance_share"}, "diff":
        {"value", "low", "high"} of
        B − A over seeds and examples, "diff_examples_only" (seeds held fixed), "seed_pairs": {"b_wins", "b_losses",
        "ties", "of"} (each B seed's value against each A seed's)}.
    Raises:
        ValueError: a run lacks one of the examples (they were not evaluated on the same split).
    """
    ids = sorted(r["id"] for r in a_runs[0])
    w = weights(len(ids), resamples, seed)
    columns = {key: [Columns(rows, ids) for rows in runs] for key, runs in (("a", a_runs), ("b", b_runs))}
    sides = {key: np.vstack([metric(w, c, name) for c in cols]) for key, cols in columns.items()}
    shares = {key: seed_variance_share(np.vstack([c.values[MEAN_KEYS[name]] for c in cols]))
              if name in MEAN_KEYS and len(cols) > 1 else 1.0 for key, cols in columns.items()}
    rng = np.random.default_rng([seed, 1])
    both = {key: _seed_draws(values, resamples, rng, shares[key]) for key, values in sides.items()}
    fixed = {key: _seed_draws(values, resamples, rng, None) for key, values in sides.items()}
    out: dict[str, Any] = {"method": "two-level paired bootstrap: seeds within each variant, examples shared",
                           "metric": name, "n": len(ids), "level": level, "resamples": resamples}
    for key, values in sides.items():
        out[key] = {**interval(both[key], level), **spread(list(values[:, 0])), "seed_variance_share": shares[key]}
    out["diff"] = interval(both["b"] - both["a"], level)
    out["diff_examples_only"] = interval(fixed["b"] - fixed["a"], level)
    a_vals, b_vals = sides["a"][:, 0], sides["b"][:, 0]
    pairs = b_vals[:, None] - a_vals[None, :]
    out["seed_pairs"] = {"b_wins": int((pairs > 0).sum()), "b_losses": int((pairs < 0).sum()),
                         "ties": int((pairs == 0).sum()), "of": int(pairs.size)}
    return out


def decision(diff: dict[str, Any], higher_is_better: bool = True) -> str:
    """Which side the interval of B − A favours: "B better", "A better" or "no difference shown" (it spans 0)."""
    if diff.get("low") is None:
        return "no difference shown"
    low, high = (diff["low"], diff["high"]) if higher_is_better else (-diff["high"], -diff["low"])
    return "B better" if low > 0 else "A better" if high < 0 else "no difference shown"
