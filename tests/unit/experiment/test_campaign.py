"""The campaign plan of a 3-, 7- or 30-day rental over a grid of four variants, on given timings."""

from __future__ import annotations

import pytest
from conftest import REPO

from labkit.card.load import load_card
from labkit.experiment.campaign import build_campaign, format_campaign, grid_cards, variant_of

TIMINGS = {"seconds": {"baseline": 600.0, "preprocessing": 60.0, "parameter_check": 900.0, "process_start": 10.0,
                       "train_setup": 120.0, "evaluation": 600.0, "seconds_per_step": 2.0},
           "sources": {"seconds_per_step": "stage 04 runtime / steps; median of 2 run(s): a, b"},
           "card": {"steps": 20000, "validation_rows": 500, "test_rows": 500, "step_size": 4 * 384}}
GRID = [{"variant": f"v{i}", "steps": 20000, "step_ratio": 1.0, "save_steps": 5000} for i in range(4)]
# variant: 20000 × 2 + 600 + 120 + 2×10 + 130 (reload) = 40870 s; fixed: set-up 3600 + checks 1560 + 30
# + final 20 + 1200 + export 260 = 6670 s; continuation 2 × 40000 + 870 = 80870 s


@pytest.mark.parametrize("days, variants, continuation, limited_by", [
    (3, 4, False, "the grid"),  # 220320 usable: 6670 + 4 × 40870 = 170150; 50170 left < 80870
    (7, 4, True, "the grid"),
    (30, 4, True, "the grid"),  # never more than listed, however long the rental
])
def test_phases_over_a_grid_of_four(days, variants, continuation, limited_by) -> None:
    plan = build_campaign(TIMINGS, days, 2.0, GRID)
    assert (plan["variants"], plan["continuation"], plan["limited_by"]) == (variants, continuation, limited_by)
    hours = {p["phase"]: p["hours"] for p in plan["phases"]}
    assert hours["set-up"] == 1.0 and hours["initial checks (01–03)"] == pytest.approx(1590 / 3600)
    assert hours["variant v0"] == pytest.approx(40870 / 3600)
    assert hours["continuation of the best"] == pytest.approx(80870 / 3600 if continuation else 0.0)
    assert hours["final (compare + test split)"] == pytest.approx(1220 / 3600)
    assert hours["margin"] == pytest.approx(days * 24 * 0.15)
    assert sum(hours.values()) == pytest.approx(days * 24)  # the phases add up to the rental
    ck = {p["phase"]: p["checkpoint_steps"] for p in plan["phases"]}
    assert ck["variant v0"] == 450 and ck["set-up"] is None  # 15 min / 2 s per step
    assert plan["assumed"]["set-up"] == "1 h" and "interval width" in plan["assumed"]
    assert "seconds_per_step" in plan["measured"]
    text = format_campaign(plan)
    assert f"{variants} of 4 listed variant(s) planned" in text and "checkpoint every 450 steps" in text


def test_the_validation_split_caps_the_variants() -> None:
    plan = build_campaign(TIMINGS, 30, 2.0, GRID, width=0.05, spread=0.1)  # ⌊0.1 / 0.05⌋ + 1 = 3
    assert plan["distinguishable"] == 3 and plan["planned"] == ["v0", "v1", "v2"]
    assert plan["limited_by"] == "the validation split" and "interval width" not in plan["assumed"]


def test_a_short_rental_is_limited_by_time_and_a_tiny_one_has_a_problem() -> None:
    plan = build_campaign(TIMINGS, 1, 2.0, GRID)  # 73440 − 6670 = 66770: one variant
    assert plan["variants"] == 1 and plan["limited_by"] == "the rental's time" and not plan["continuation"]
    tiny = build_campaign(TIMINGS, 0.2, 2.0, GRID)
    assert not tiny["feasible"] and tiny["problem"].startswith("no variant fits")


def test_grid_entries_from_cards(tmp_path) -> None:
    cards = grid_cards([str(REPO / "params" / "examples")])
    assert len(cards) >= 4
    four = [variant_of(load_card(p).card, 240, TIMINGS["card"]) for p in cards[:4]]
    assert all(v["steps"] >= 1 and v["step_ratio"] > 0 for v in four)


def test_a_variant_with_replicates_costs_one_run_per_seed() -> None:
    grid = [{**GRID[0], "replicates": 3}, *GRID[1:]]
    plan = build_campaign(TIMINGS, 30, 2.0, grid)
    hours = {p["phase"]: p for p in plan["phases"]}
    assert hours["variant v0"]["seconds"] == pytest.approx(3 * 40870) and "3 seeds × (" in hours["variant v0"]["notes"]
    assert hours["variant v1"]["seconds"] == pytest.approx(40870)
    assert hours["continuation of the best"]["seconds"] == pytest.approx(80870)  # one longer run, not three
    card = load_card(REPO / "params" / "examples" / "ticket-replicates.yaml").card
    assert variant_of(card, 240, TIMINGS["card"] | {"step_size": 4 * 384})["replicates"] == 3
