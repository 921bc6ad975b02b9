"""The two-level bootstrap over seeds and examples (labkit.scoring.seeds) on synthetic scored rows."""

from __future__ import annotations

import numpy as np
import pytest

from labkit.scoring.seeds import decision, seed_intervals, spread


def _run(rng: np.random.Generator, n: int, p: float) -> list[dict]:
    """One run's scored rows: example i right with probability p (a seed's own luck on each example)."""
    return [{"id": f"e{i:03d}", "category": "x", "exact_match": float(rng.random() < p)} for i in range(n)]


def _variant(seed: int, n: int, ps: list[float]) -> list[list[dict]]:
    rng = np.random.default_rng(seed)
    return [_run(rng, n, p) for p in ps]


def _width(leaf: dict) -> float:
    return leaf["high"] - leaf["low"]


def test_point_values_are_the_seeds_means_and_their_spread() -> None:
    a, b = _variant(1, 80, [0.4, 0.5, 0.6]), _variant(2, 80, [0.6, 0.7, 0.8])
    out = seed_intervals(a, b, "exact_match", resamples=400)
    for key, runs in (("a", a), ("b", b)):
        per_seed = [np.mean([r["exact_match"] for r in rows]) for rows in runs]
        assert out[key]["per_seed"] == pytest.approx(per_seed)
        assert out[key]["value"] == pytest.approx(np.mean(per_seed)) == pytest.approx(out[key]["mean"])
        assert out[key]["std"] == pytest.approx(np.std(per_seed, ddof=1))
        assert (out[key]["min"], out[key]["max"]) == (pytest.approx(min(per_seed)), pytest.approx(max(per_seed)))
    assert out["diff"]["value"] == pytest.approx(out["b"]["mean"] - out["a"]["mean"])
    assert out["n"] == 80 and out["seed_pairs"]["of"] == 9


def test_a_large_seed_spread_widens_the_interval_beyond_the_examples_alone() -> None:
    wide = seed_intervals(_variant(3, 200, [0.2, 0.5, 0.8]), _variant(4, 200, [0.3, 0.6, 0.9]), "exact_match",
                          resamples=2000)
    assert _width(wide["diff"]) > 1.5 * _width(wide["diff_examples_only"])
    assert wide["diff"]["low"] < 0 < wide["diff_examples_only"]["low"]  # the seeds make a clear gain uncertain
    assert decision(wide["diff_examples_only"]) == "B better" and decision(wide["diff"]) == "no difference shown"
    # seeds that differ only by the interaction's noise: the seed level adds almost nothing (no double count)
    tight = seed_intervals(_variant(3, 200, [0.5, 0.5, 0.5]), _variant(4, 200, [0.6, 0.6, 0.6]), "exact_match",
                           resamples=2000)
    assert _width(tight["diff"]) < 1.15 * _width(tight["diff_examples_only"])
    assert tight["a"]["seed_variance_share"] < 0.5 and wide["a"]["seed_variance_share"] > 0.9


def test_the_interval_matches_the_variance_of_seeds_plus_examples() -> None:
    """Reference: y[s, e] = mu + a_s + b_e + e_se with seeds drawn independently of the examples; var(mean B − mean A)
    = var(a_A)/k + var(a_B)/k + the paired example variance of the seeds' means. var(a) is the seeds' sample variance
    less the interaction's share MS_res / n (two-way layout without replication; MS_res computed here by least
    squares on the additive model's design matrix); the bootstrap's 95 % width is about 2 × 1.96 standard
    deviations."""
    a, b = _variant(5, 300, [0.3, 0.45, 0.6, 0.5]), _variant(6, 300, [0.5, 0.7, 0.6, 0.75])
    out = seed_intervals(a, b, "exact_match", resamples=4000, seed=1)
    k, n = 4, 300
    seed_var = 0.0
    for runs, key in ((a, "a"), (b, "b")):
        y = np.array([r["exact_match"] for rows in runs for r in rows])
        design = np.hstack([np.kron(np.eye(k), np.ones((n, 1))), np.kron(np.ones((k, 1)), np.eye(n))])
        fitted = design @ np.linalg.lstsq(design, y, rcond=None)[0]
        ms_res = float(((y - fitted) ** 2).sum()) / ((k - 1) * (n - 1))
        assert out[key]["seed_variance_share"] == pytest.approx(
            max(0.0, out[key]["std"] ** 2 - ms_res / n) / out[key]["std"] ** 2)
        seed_var += max(0.0, out[key]["std"] ** 2 - ms_res / n) / k
    mean_a = np.mean([[r["exact_match"] for r in rows] for rows in a], axis=0)
    mean_b = np.mean([[r["exact_match"] for r in rows] for rows in b], axis=0)
    examples = np.var(mean_b - mean_a, ddof=1) / n
    assert _width(out["diff"]) == pytest.approx(2 * 1.96 * np.sqrt(examples + seed_var), rel=0.15)
    assert _width(out["diff_examples_only"]) == pytest.approx(2 * 1.96 * np.sqrt(examples), rel=0.15)


def test_one_run_a_side_is_the_paired_bootstrap_of_two_runs() -> None:
    from labkit.scoring.bootstrap import paired_intervals

    (a,), (b,) = _variant(7, 60, [0.4]), _variant(8, 60, [0.6])
    out = seed_intervals([a], [b], "exact_match", resamples=500, seed=3)
    ref = paired_intervals(a, b, ["exact_match"], resamples=500, seed=3)["overall"]["exact_match"]["diff"]
    assert out["diff"] == pytest.approx(ref) and out["diff_examples_only"] == pytest.approx(ref)
    assert out["a"]["std"] is None and spread([0.5])["std"] is None


def test_decision_follows_the_metrics_direction() -> None:
    assert decision({"value": 0.1, "low": 0.02, "high": 0.2}) == "B better"
    assert decision({"value": -0.1, "low": -0.2, "high": -0.02}) == "A better"
    assert decision({"value": -0.1, "low": -0.2, "high": -0.02}, higher_is_better=False) == "B better"
    assert decision({"value": 0.0, "low": None, "high": None}) == "no difference shown"


def test_runs_on_other_examples_are_refused() -> None:
    a, b = _variant(9, 30, [0.5]), _variant(10, 20, [0.5])
    with pytest.raises(ValueError, match="not evaluated on the same split"):
        seed_intervals(a, b, "exact_match", resamples=10)
