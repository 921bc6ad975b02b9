"""Stage 03's memory measurement: one trainer measures every length, memory first, then time, and reads what a fresh
trainer at each length reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, smoke_rows

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.preflight.memory import estimate_step
from labkit.preflight.memory_check import measure, measure_lengths, step_plan
from labkit.preflight.shared import SharedModel


def _card():
    # micro-batch 16: a step of ~80 MiB on the tiny model, well above the process's own noise (~10 MiB)
    return updated(load_card(REPO / "params" / "smoke.yaml").card, {"data.max_length": 512, "train.micro_batch": 16})


@pytest.fixture(scope="module")
def card():
    return _card()


def test_memory_is_measured_before_any_timed_step_and_each_length_once() -> None:
    assert step_plan([160, 172]) == [("memory", 160)] * 2 + [("memory", 172)] + [("time", 172)] * 2 + [("time", 160)]
    assert step_plan([384, 384]) == [("memory", 384)] * 2 + [("time", 384)] * 2
    assert step_plan([300, 100, 200], steps=3) == ([("memory", 100)] * 3 + [("memory", 200), ("memory", 300)]
                                                   + [("time", 300)] * 3 + [("time", 200), ("time", 100)])


def _in_a_fresh_process(*args: str) -> list[dict]:
    """This file's `__main__` in a new process: a fresh process's first measurement, as stage 03 makes it (a memory
    measurement after other steps in one process can read the heap they left behind, which a reference must not)."""
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_one_trainer_reads_each_length_as_a_fresh_trainer_does() -> None:
    fresh = {n: _in_a_fresh_process("fresh", str(n))[0] for n in (256, 384)}
    short, long = _in_a_fresh_process("lengths", "256", "384")
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


def test_two_equal_lengths_are_one_measurement(card, tiny_model) -> None:
    tokenizer, rows = load_tokenizer(tiny_model, card), smoke_rows()
    shared = SharedModel(apply_method(load_model(tiny_model, card, "cpu"), card))
    lengths = {"p95": 128, "max": 128}
    estimates = [estimate_step(shared.model.config, card, 128, device="cpu")] * 2
    report = measure_lengths(card, shared, tokenizer, rows, None, lengths, estimates, "cpu")
    first, second = report["measured"]
    assert first is second and len(first["step_seconds"]) == 2 and len(first["memory_pass_seconds"]) == 2
    assert first["eval_seconds"] is None  # no evaluation rows given


if __name__ == "__main__":  # one measurement in this fresh process (`_in_a_fresh_process`): its result as JSON
    from labkit.model.sources import resolve
    from labkit.preflight.measure import release_promptly

    release_promptly()  # as stage 03 sets it when it opens
    card, tiny = _card(), resolve("tiny:llama")
    tokenizer, rows = load_tokenizer(tiny, card), smoke_rows()
    model = SharedModel(apply_method(load_model(tiny, card, "cpu"), card))
    numbers = [int(n) for n in sys.argv[2:]]
    if sys.argv[1] == "fresh":
        got = [measure(card, model, tokenizer, rows, numbers[0])]
    else:
        lengths = {"p95": numbers[0], "max": numbers[1]}
        estimates = [estimate_step(model.model.config, card, n, device="cpu") for n in numbers]
        got = measure_lengths(card, model, tokenizer, rows, None, lengths, estimates, "cpu", eval_rows=rows[:8])["measured"]
    print(json.dumps(got, default=str))
