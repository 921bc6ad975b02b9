"""Stage 03's memory measurement: one trainer measures every length, memory first, then time, and reads what a fresh
trainer at each length reads."""

from __future__ import annotations

import pytest
from conftest import REPO, smoke_rows

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.preflight.memory import estimate_step
from labkit.preflight.memory_check import measure, measure_lengths, step_plan
from labkit.preflight.shared import SharedModel


@pytest.fixture(scope="module")
def card():
    # micro-batch 16: a step of ~80 MiB on the tiny model, well above the process's own noise (~10 MiB)
    return updated(load_card(REPO / "params" / "smoke.yaml").card, {"data.max_length": 512, "train.micro_batch": 16})


def test_memory_is_measured_before_any_timed_step_and_each_length_once() -> None:
    assert step_plan([160, 172]) == [("memory", 160)] * 2 + [("memory", 172)] + [("time", 172)] * 2 + [("time", 160)]
    assert step_plan([384, 384]) == [("memory", 384)] * 2 + [("time", 384)] * 2
    assert step_plan([300, 100, 200], steps=3) == ([("memory", 100)] * 3 + [("memory", 200), ("memory", 300)]
                                                   + [("time", 300)] * 3 + [("time", 200), ("time", 100)])


def test_one_trainer_reads_each_length_as_a_fresh_trainer_does(card, tiny_model) -> None:
    tokenizer, rows = load_tokenizer(tiny_model, card), smoke_rows()
    def make():
        return apply_method(load_model(tiny_model, card, "cpu"), card)

    measure(card, make, tokenizer, rows, 384)  # the process's first step carries its one-time costs (~12 MiB here)
    fresh = {n: measure(card, make, tokenizer, rows, n) for n in (256, 384)}
    shared = SharedModel(apply_method(load_model(tiny_model, card, "cpu"), card))
    lengths = {"p95": 256, "max": 384}
    estimates = [estimate_step(shared.model.config, card, n, device="cpu") for n in lengths.values()]
    report = measure_lengths(card, shared, tokenizer, rows, None, lengths, estimates, "cpu", eval_rows=rows[:8])
    short, long = report["measured"]
    assert (short["seq_len"], long["seq_len"]) == (256, 384)
    assert len(short["memory_pass_seconds"]) == 2 and len(long["memory_pass_seconds"]) == 1
    assert len(long["step_seconds"]) == 2 and len(short["step_seconds"]) == 1
    assert short["seconds_per_step"] > 0 and long["seconds_per_step"] > 0 and len(short["loss"]) == 2
    assert short["eval_seconds"] > 0 and short["eval_tokens"] > 0 and long["eval_seconds"] is None  # timed once
    for got in (short, long):
        expected = fresh[got["seq_len"]]
        assert got["weights_bytes"] == expected["weights_bytes"]
        assert got["memory"]["baseline_bytes"] == short["memory"]["baseline_bytes"]  # one baseline: the weights alone
        step, want = got["memory"]["delta_bytes"], expected["memory"]["delta_bytes"]
        assert abs(step - want) <= max(0.2 * want, 8 * 2**20), (got["seq_len"], step, want)
        assert got["peak_bytes"] == got["weights_bytes"] + step
    assert [r["seq_len"] for r in report["comparison"]] == [256, 384]
    assert shared.changed()  # the trainer trained it: the next check restores it


def test_two_equal_lengths_are_one_measurement(card, tiny_model) -> None:
    tokenizer, rows = load_tokenizer(tiny_model, card), smoke_rows()
    shared = SharedModel(apply_method(load_model(tiny_model, card, "cpu"), card))
    lengths = {"p95": 128, "max": 128}
    estimates = [estimate_step(shared.model.config, card, 128, device="cpu")] * 2
    report = measure_lengths(card, shared, tokenizer, rows, None, lengths, estimates, "cpu")
    first, second = report["measured"]
    assert first is second and len(first["step_seconds"]) == 2 and len(first["memory_pass_seconds"]) == 2
    assert first["eval_seconds"] is None  # no evaluation rows given
