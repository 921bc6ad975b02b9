"""Stage 03's time plan: the trainer's batches replayed at the measured step times, packed rows, evaluation passes."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from labkit.card.load import load_card
from labkit.card.schema import Card
from labkit.card.update import updated
from labkit.preflight.timeplan import packed_lengths, row_lengths, time_plan

REPO = Path(__file__).resolve().parents[3]
# one micro-batch costs L / 100 seconds at padded length L; the first step took 0.5 s more (optimiser states)
MEASURED = [{"seq_len": 100, "seconds_per_step": 1.0, "grad_accum": 1, "step_seconds": [1.5, 1.0]},
            {"seq_len": 200, "seconds_per_step": 2.0, "grad_accum": 1, "step_seconds": [2.5, 2.0]}]


def _card(**train) -> Card:
    raw = copy.deepcopy(load_card(REPO / "params" / "smoke.yaml").resolved)
    raw["train"].update(train)
    return Card.model_validate(raw)


def test_padded_batches_and_validation_passes() -> None:
    card = _card(max_steps=8, micro_batch=4, grad_accum=1, eval_steps=None)
    plan = time_plan(card, [100] * 36, [100] * 8, MEASURED)
    # 8 steps × 1 s, + 0.5 s first step, + 8 // 2 = 4 validation passes of 8 rows: 8 / 4 micro-batches × 1 s / 3
    assert plan["steps"] == 8 and plan["evaluations"] == 4
    assert plan["train_seconds"] == pytest.approx(8 + 0.5 + 4 * 2 / 3)
    # a batch costs its longest row: one 200-token row in every batch of four doubles each step
    longer = time_plan(card, [100, 100, 100, 200] * 9, [100] * 8, [{**m, "step_seconds": []} for m in MEASURED])
    assert longer["seconds_per_step"] > 1.0 and longer["train_seconds"] > plan["train_seconds"] - 0.5


def test_packed_rows_are_what_the_trainer_batches() -> None:
    card = _card(packing=True, max_steps=None, epochs=1.0, micro_batch=1, grad_accum=4, eval_steps=100)
    lengths = [100] * 40  # four examples fill a 400-token row: 10 packed rows
    assert row_lengths(card, lengths) == [400] * 10
    assert packed_lengths(card, lengths) == {"p95": 400, "max": 400}
    plan = time_plan(card, lengths, [], MEASURED)
    # 10 rows / (1 × 4) → 3 optimiser steps (the last one short), each micro-batch a 400-token row: 4 s
    assert plan["packed"] and plan["rows_per_epoch"] == 10 and plan["steps"] == 3
    assert plan["train_seconds"] == pytest.approx(10 * 4.0 + 0.5)
    assert plan["examples_per_step"] == pytest.approx(40 / 3)
    assert plan["train_tokens"] == 4000


def test_validation_passes_cost_the_timed_evaluation_per_padded_token() -> None:
    card = updated(_card(max_steps=8, micro_batch=4, grad_accum=1, eval_steps=4), {"eval.batch_size": 4})
    # stage 03 timed one evaluation of 4 rows × 100 tokens in 0.8 s: 0.002 s per padded token
    timed = [{**m, "eval_seconds": 0.8, "eval_tokens": 400} for m in MEASURED]
    plan = time_plan(card, [100] * 36, [100, 100, 100, 200, 50, 50], timed)
    # 2 passes; batches [100, 100, 100, 200] → 4 × 200 tokens and [50, 50] → 2 × 50: 900 tokens × 0.002 s
    assert plan["evaluations"] == 2
    assert plan["evaluation_seconds"] == pytest.approx(2 * 900 * 0.002)
    untimed = time_plan(card, [100] * 36, [100, 100, 100, 200, 50, 50], MEASURED)  # no timed evaluation: the rule
    assert untimed["evaluation_seconds"] != pytest.approx(plan["evaluation_seconds"])


def test_processes_share_the_epoch_at_the_assumed_efficiency() -> None:
    """2 processes: each replays half the epoch's micro-batches, its steps ÷ 0.9 (assumed within a machine), and
    the validation passes are shared; one process's plan is unchanged."""
    one = _card(max_steps=None, epochs=1, micro_batch=4, grad_accum=1, eval_steps=None)
    two = updated(one, {"distributed": {"launcher": "accelerate", "strategy": "ddp", "num_processes": 2}})
    single = time_plan(one, [100] * 36, [100] * 8, MEASURED)
    plan = time_plan(two, [100] * 36, [100] * 8, MEASURED)
    assert (single["steps"], single["processes"], single["scaling_efficiency"]) == (9, 1, 1.0)
    assert single["train_seconds"] == pytest.approx(9 * 1.0 + 0.5 + single["evaluation_seconds"])
    assert (plan["steps"], plan["processes"], plan["scaling_efficiency"]) == (5, 2, 0.9)  # ceil(36 / 8) micro-batches
    one_pass = single["evaluation_seconds"] / single["evaluations"] / 2
    assert plan["evaluations"] == 2 and plan["evaluation_seconds"] == pytest.approx(2 * one_pass)
    assert plan["train_seconds"] == pytest.approx(5 * 1.0 / 0.9 + 0.5 + 2 * one_pass)
