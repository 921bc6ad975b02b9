"""The verdict decided on the paired bootstrap interval of the gain (docs/deciding.md): INCONCLUSIVE with the
examples that give 80 % power (checked by simulation and against the noncentral t), the detectable gain, and the
cluster bootstrap over data.fields.group."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from labkit.card.load import load_card
from labkit.card.schema import Card
from labkit.data.sources import map_fields
from labkit.errors import DataError, LabkitError
from labkit.evaluate.power import detectable_gain, examples_for_power, z_sum
from labkit.evaluate.procedure import score_answers
from labkit.evaluate.verdict import verdict
from labkit.scoring.bootstrap import paired_intervals

REPO = Path(__file__).resolve().parents[3]


def _card(min_improvement: float = 0.02, **fields: str | None) -> Card:
    raw = copy.deepcopy(load_card(REPO / "params" / "quickstart.yaml").resolved)
    raw["experiment"]["target"]["min_improvement"] = min_improvement
    raw["experiment"]["guardrails"] = []
    raw["data"]["fields"].update(fields)
    return Card.model_validate(raw)


def _pairs(ref: np.ndarray, tuned: np.ndarray, groups: list[str] | None = None) -> tuple[list[dict], list[dict]]:
    """Scored rows with a binary per-example field accuracy (and a group when given)."""
    extra = [{"group": g} for g in groups] if groups else [{} for _ in ref]
    rows = [[{"id": f"e{i:05d}", "category": None, "field_accuracy": float(v), **x} for i, (v, x) in
             enumerate(zip(side, extra))] for side in (ref, tuned)]
    return rows[0], rows[1]


def _metrics(rows: list[dict]) -> dict:
    return {"n": len(rows), "overall": {"field_accuracy": float(np.mean([r["field_accuracy"] for r in rows]))},
            "per_category": {}}


def _judge(card: Card, ref: np.ndarray, tuned: np.ndarray, resamples: int = 2000, seed: int = 0) -> dict:
    ref_rows, tuned_rows = _pairs(ref, tuned)
    return verdict(card, _metrics(ref_rows), _metrics(tuned_rows), reference_rows=ref_rows, tuned_rows=tuned_rows,
                   resamples=resamples, seed=seed)


# the observed evaluation: 100 examples, 18 won, 8 lost, 74 tied → gain +0.10, per-example sd 0.50
WIN, LOSS, TIE = (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)
OBSERVED = [WIN] * 18 + [LOSS] * 8 + [TIE] * 74


def _draw(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    picked = np.asarray(OBSERVED)[rng.integers(0, len(OBSERVED), n)]
    return picked[:, 0], picked[:, 1]


def test_a_gain_whose_interval_crosses_the_threshold_is_inconclusive_with_the_examples_that_settle_it() -> None:
    card = _card(min_improvement=0.02)
    pairs = np.asarray(OBSERVED)
    decision = _judge(card, pairs[:, 0], pairs[:, 1])
    primary = decision["primary"]
    assert decision["decision"] == "inconclusive" and decision["confirmed"] is False
    assert primary["gain"] == pytest.approx(0.10) and primary["point_ok"] is True
    assert primary["gain_low"] < 0.02 < primary["gain"] < primary["gain_high"]
    sd = float(np.std(pairs[:, 1] - pairs[:, 0], ddof=1))
    assert primary["sd"] == pytest.approx(sd) and primary["n"] == 100
    expected = math.ceil(((stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * sd / 0.08) ** 2)
    assert primary["examples_needed"] == expected and 300 < expected < 320
    text = decision["verdict"]
    assert text.startswith("INCONCLUSIVE against the baseline: field_accuracy gain +0.100 clears the required 0.02")
    assert f"about {expected} examples would give 80% power" in text and "n = 100" in text
    assert f"95% interval [{primary['gain_low']:+.3f}, {primary['gain_high']:+.3f}]" in text
    # the same gain at a threshold its interval clears is CONFIRMED; below the point estimate, NOT CONFIRMED
    assert _judge(_card(min_improvement=-0.05), pairs[:, 0], pairs[:, 1])["decision"] == "confirmed"
    refuted = _judge(_card(min_improvement=0.15), pairs[:, 0], pairs[:, 1])
    assert refuted["decision"] == "not confirmed" and refuted["primary"]["examples_needed"] is None
    assert "n = 100 examples" in refuted["verdict"] and "detect with 80% power" in refuted["verdict"]


def test_the_examples_needed_confirm_the_observed_gain_four_times_in_five_by_simulation() -> None:
    card = _card(min_improvement=0.02)
    pairs = np.asarray(OBSERVED)
    n = _judge(card, pairs[:, 0], pairs[:, 1])["primary"]["examples_needed"]
    rng = np.random.default_rng(11)
    experiments = 600
    confirmed = [_judge(card, *_draw(n, rng), resamples=400, seed=s)["confirmed"] for s in range(experiments)]
    share = float(np.mean(confirmed))
    assert abs(share - 0.8) < 0.06, share  # binomial sd 0.016 at 600 experiments, plus the resampling's own noise
    # and the 100 examples actually evaluated confirm it far less often: the verdict's INCONCLUSIVE is earned
    few = [_judge(card, *_draw(100, rng), resamples=400, seed=s)["confirmed"] for s in range(200)]
    assert float(np.mean(few)) < 0.55


def test_power_numbers_against_the_noncentral_t_reference() -> None:
    # one-sided one-sample t-test at alpha 0.025 on the paired differences (statsmodels' TTestPower computes the same)
    for gain, threshold, sd in ((0.10, 0.02, 0.5), (0.06, 0.0, 0.35), (0.3, 0.1, 1.2)):
        n = examples_for_power(gain, threshold, sd)
        df, shift = n - 1, (gain - threshold) / sd * math.sqrt(n)
        power = 1 - stats.nct.cdf(stats.t.ppf(0.975, df), df, shift)
        assert 0.78 < power < 0.81, (gain, n, power)
        shorter = 1 - stats.nct.cdf(stats.t.ppf(0.975, n - 11), n - 11, (gain - threshold) / sd * math.sqrt(n - 10))
        assert shorter < 0.8
        # the detectable gain at n is the gain that n examples confirm with 80% power: the inverse of the above
        mde = detectable_gain(n, threshold, sd)
        assert gain - 0.01 * sd < mde <= gain + 1e-9  # n is rounded up
        assert abs(examples_for_power(mde, threshold, sd) - n) <= 1
    assert z_sum() == pytest.approx(1.959964 + 0.841621, abs=1e-5)
    assert examples_for_power(0.05, 0.05, 0.5) is None and examples_for_power(0.1, 0.0, 0.0) is None


def test_grouped_resampling_widens_the_interval_on_duplicated_groups() -> None:
    rng = np.random.default_rng(3)
    pairs = np.asarray(OBSERVED)[rng.permutation(100)][:40]
    copies = 5  # every example five times: the same 40 sources, 200 rows
    ref, tuned = np.repeat(pairs[:, 0], copies), np.repeat(pairs[:, 1], copies)
    groups = [f"g{i}" for i in range(40) for _ in range(copies)]
    flat = paired_intervals(*_pairs(ref, tuned), ["field_accuracy"])["overall"]["field_accuracy"]["diff"]
    grouped_out = paired_intervals(*_pairs(ref, tuned, groups), ["field_accuracy"])
    grouped = grouped_out["overall"]["field_accuracy"]["diff"]
    assert grouped_out["groups"] == 40 and grouped["value"] == pytest.approx(flat["value"])
    ratio = (grouped["high"] - grouped["low"]) / (flat["high"] - flat["low"])
    assert 1.8 < ratio < 2.7, ratio  # sqrt(5) = 2.24: five copies of a source carry one source's information
    # one example per group is the ordinary bootstrap again
    single = paired_intervals(*_pairs(pairs[:, 0], pairs[:, 1], [f"g{i}" for i in range(40)]), ["field_accuracy"])
    plain = paired_intervals(*_pairs(pairs[:, 0], pairs[:, 1]), ["field_accuracy"])
    assert single["overall"] == plain["overall"]
    # the verdict uses the groups: its sd and detectable gain grow, and it says how many groups it resampled
    card = _card(min_improvement=0.0, group="dialogue")
    ref_rows, tuned_rows = _pairs(ref, tuned, groups)
    judged = verdict(card, _metrics(ref_rows), _metrics(tuned_rows), reference_rows=ref_rows, tuned_rows=tuned_rows)
    alone = verdict(card, _metrics(ref_rows), _metrics(tuned_rows), reference_rows=_pairs(ref, tuned)[0],
                    tuned_rows=_pairs(ref, tuned)[1])
    assert judged["primary"]["groups"] == 40 and "in 40 groups" in judged["verdict"]
    assert judged["primary"]["detectable_gain"] > 1.8 * alone["primary"]["detectable_gain"]


def test_the_group_field_travels_to_the_scored_rows_and_its_absence_is_one_line_naming_the_key() -> None:
    card = _card(group="dialogue")
    raw = [{"id": "a", "text": "t1", "answer": "{}", "category": "billing", "dialogue": 7},
           {"id": "b", "text": "t2", "answer": "{}", "category": "billing", "dialogue": 7}]
    rows = map_fields(card.data, raw)
    assert [r["group"] for r in rows] == ["7", "7"]
    scored, _ = score_answers(card, rows, ["{}", "{}"])
    assert [r["group"] for r in scored] == ["7", "7"]
    assert "group" not in map_fields(_card().data, raw)[0]  # no group field: rows as before
    with pytest.raises(DataError, match=r"no field 'dialog_id' \(data\.fields\.group.*set data\.fields\.group: null") as err:
        map_fields(_card(group="dialog_id").data, raw)
    assert isinstance(err.value, LabkitError) and "\n" not in str(err.value)


def test_a_per_example_metric_without_rows_is_not_judged() -> None:
    card = _card()
    rows = _pairs(np.ones(5), np.ones(5))
    decision = verdict(card, _metrics(rows[0]), _metrics(rows[1]))
    assert decision["decision"] == "not judged" and decision["confirmed"] is False
    assert "per-example predictions" in decision["verdict"]
    other = [{**r, "id": "x" + r["id"]} for r in rows[1]]  # not the same examples: no paired interval
    mismatch = verdict(card, _metrics(rows[0]), _metrics(other), reference_rows=rows[0], tuned_rows=other)
    assert mismatch["decision"] == "not judged" and "not evaluated on the same split" in mismatch["verdict"]
    absent = verdict(card, _metrics(rows[0]), {"n": 5, "overall": {}, "per_category": {}}, reference_rows=rows[0],
                     tuned_rows=rows[1])
    assert absent["decision"] == "not confirmed" and "field_accuracy is not available for this run" in absent["verdict"]
    assert absent["primary"]["rule"] == "interval" and "run metric" not in absent["verdict"]
