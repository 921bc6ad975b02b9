"""The statistics behind a verdict on a per-example metric: the paired bootstrap interval of the gain, the examples
that would give 80 % power to confirm it, and the smallest gain an evaluation of n examples could confirm.

A gain is confirmed when the end of its two-sided `level` interval on the side of the worse value (the lower end of
the gain in the metric's good direction) clears the threshold `min_improvement` — a one-sided test at
α = (1 − level) / 2 of "gain ≤ threshold". With σ the standard deviation of one example's paired difference
(tuned − reference) and z the standard normal quantiles (scipy.stats.norm):

    examples for power 1 − β to confirm a true gain g:   n = ((z[1 − α] + z[1 − β]) · σ / (g − threshold))²
    smallest gain confirmed with power 1 − β at n:        threshold + (z[1 − α] + z[1 − β]) · σ / √n

σ is the sample standard deviation of the per-example differences where the metric is their mean (accuracy,
field accuracy, ROUGE, exact match …) and the examples are independent; otherwise (F1 over examples, slot F1,
grouped examples) it is the bootstrap standard error of the gain times √n, the per-example spread that gives the
same standard error (for grouped examples it keeps the design effect of groups of the same sizes). docs/deciding.md
gives the method.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.stats import norm

from labkit.scoring.bootstrap import paired_samples

POWER = 0.8  # the power the examples needed are sized for, and the detectable gain is stated at


def z_sum(level: float = 0.95, power: float = POWER) -> float:
    """z[1 − α] + z[power] with α = (1 − level) / 2: the one-sided test that a two-sided `level` interval makes."""
    return float(norm.ppf(1 - (1 - level) / 2) + norm.ppf(power))


def examples_for_power(gain: float, threshold: float, sd: float, level: float = 0.95, power: float = POWER) -> int | None:
    """Examples that give `power` to confirm a true gain `gain` against `threshold` (the interval's end clearing it).

    Args:
        gain: the true gain (e.g. the observed one), in the metric's good direction.
        threshold: min_improvement.
        sd: standard deviation of one example's paired difference.
        level: the interval's level.
        power: the power wanted.
    Returns:
        the number of examples (rounded up), or None when no number of examples confirms it (gain ≤ threshold) or
        any does (sd 0).
    """
    if gain <= threshold or sd <= 0:
        return None
    return math.ceil((z_sum(level, power) * sd / (gain - threshold)) ** 2)


def detectable_gain(n: int, threshold: float, sd: float, level: float = 0.95, power: float = POWER) -> float:
    """The smallest true gain that n examples confirm with `power` (minimum detectable effect above the threshold).

    Args:
        n: examples evaluated.
        threshold: min_improvement (0 without one).
        sd: standard deviation of one example's paired difference.
        level: the interval's level.
        power: the power.
    Returns:
        threshold + (z[1 − α] + z[power]) · sd / √n.
    """
    return threshold + z_sum(level, power) * sd / math.sqrt(n)


def _percentiles(samples: np.ndarray, level: float) -> tuple[float | None, float | None]:
    rest = samples[1:][~np.isnan(samples[1:])]
    if not len(rest):
        return None, None
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(rest, [tail, 100 - tail])
    return float(low), float(high)


def gain_statistics(ref_rows: list[dict[str, Any]], tuned_rows: list[dict[str, Any]], name: str, higher: bool,
                    threshold: float | None, resamples: int = 2000, level: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """The primary metric's gain over the reference with its paired bootstrap interval, and its power numbers.

    Args:
        ref_rows: the reference's scored predictions (the baseline's, or the reference variant's tuned ones).
        tuned_rows: this run's, on the same examples.
        name: the metric (a per-example metric of labkit.scoring.names.METRICS).
        higher: whether a larger value is better (the gain is taken in that direction).
        threshold: min_improvement (None: 0 is used for the detectable gain, no examples are sized).
        resamples, level, seed: the bootstrap (grouped when the rows carry groups).
    Returns:
        {"n", "groups", "level", "resamples", "gain_low", "gain_high" (the interval of the gain in the good
        direction), "ratio_low", "ratio_high" (of tuned / reference), "sd" (per-example standard deviation of the
        difference), "sd_from" ("examples" or "bootstrap"), "detectable_gain", "examples_needed" (for the observed
        gain; None unless it exceeds the threshold)}.
    """
    drawn = paired_samples(ref_rows, tuned_rows, name, resamples, seed)
    n, sign = drawn["n"], 1.0 if higher else -1.0
    gain = sign * (drawn["tuned"] - drawn["reference"])
    low, high = _percentiles(gain, level)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(drawn["reference"] != 0, drawn["tuned"] / np.where(drawn["reference"] != 0,
                                                                           drawn["reference"], 1), np.nan)
    ratio_low, ratio_high = _percentiles(ratio, level)
    if drawn["diffs"] is not None and drawn["groups"] is None and n > 1:
        sd, sd_from = float(np.std(drawn["diffs"], ddof=1)), "examples"
    else:
        rest = gain[1:][~np.isnan(gain[1:])]
        sd, sd_from = (float(np.std(rest, ddof=1)) * math.sqrt(n) if len(rest) > 1 else 0.0), "bootstrap"
    base = threshold if threshold is not None else 0.0
    observed = float(gain[0]) if not np.isnan(gain[0]) else None
    needed = examples_for_power(observed, base, sd, level) if threshold is not None and observed is not None else None
    return {"n": n, "groups": drawn["groups"], "level": level, "resamples": resamples, "gain_low": low,
            "gain_high": high, "ratio_low": ratio_low, "ratio_high": ratio_high, "sd": sd, "sd_from": sd_from,
            "detectable_gain": detectable_gain(n, base, sd, level) if n else None, "examples_needed": needed}
