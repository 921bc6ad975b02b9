"""Stopping measured: `stopped` and `answer_tokens` per answer from real generation, stop_rate and mean_answer_tokens
in the metrics and the bootstrap, and the default stop_rate guardrail of text and JSON cards."""

from __future__ import annotations

import pytest
from conftest import REPO, smoke_rows

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.data.prompting import prompt_ids
from labkit.evaluate.generation import generate_with_stops, stop_ids
from labkit.evaluate.procedure import evaluate_rows
from labkit.evaluate.verdict import DEFAULT_STOP_RATE, guardrail_checks, verdict
from labkit.model.loading import load_model, load_tokenizer
from labkit.scoring.bootstrap import paired_intervals
from labkit.scoring.stopping import answer_end, stopping_line, stopping_rows

LIMIT = 6


@pytest.fixture(scope="module")
def setup(tiny_model):
    card = updated(load_card(REPO / "params" / "smoke.yaml").card, {"eval.batch_size": 4, "eval.max_new_tokens": LIMIT})
    tokenizer = load_tokenizer(tiny_model, card)
    return card, tokenizer, smoke_rows(8)


def _model(tiny_model, card):
    return load_model(tiny_model, card, "cpu")  # a fresh model: the tests change its generation config


def test_answer_end_counts_the_tokens_before_the_stop() -> None:
    assert answer_end([5, 6, 2, 0, 0], [2], 0, 5) == (True, 2)  # stopped; the stop token and the padding not counted
    assert answer_end([2, 2, 2], [9, 2], 2, 3) == (True, 0)  # stopped at once (pad = EOS)
    assert answer_end([5, 6, 7, 8], [2], 0, 4) == (False, 4)  # ran to the limit
    assert answer_end([5, 6, 7, 2], [2], 0, 4) == (True, 3)  # the stop token as the last allowed token: stopped
    assert answer_end([5, 6, 0, 0], [2], 0, 4) == (True, 2)  # a stop string ended it: padded out before the limit


def test_a_model_whose_stop_tokens_are_suppressed_never_stops(tiny_model, setup) -> None:
    card, tokenizer, rows = setup
    model = _model(tiny_model, card)
    model.generation_config.suppress_tokens = stop_ids(model, tokenizer)  # generate itself rules them out
    scored, metrics = evaluate_rows(model, tokenizer, card, rows, "suppressed")
    assert [r["stopped"] for r in scored] == [False] * len(rows)
    assert [r["answer_tokens"] for r in scored] == [LIMIT] * len(rows)
    assert metrics["overall"]["stop_rate"] == 0.0 and metrics["overall"]["mean_answer_tokens"] == LIMIT


def test_a_model_biased_to_its_eos_stops_every_answer(tiny_model, setup) -> None:
    card, tokenizer, rows = setup
    model = _model(tiny_model, card)
    model.generation_config.sequence_bias = [[[tokenizer.eos_token_id], 100.0]]  # the EOS wins every step …
    model.generation_config.min_new_tokens = 3  # … once generate lets it (after 3 tokens)
    scored, metrics = evaluate_rows(model, tokenizer, card, rows, "biased")
    assert [(r["stopped"], r["answer_tokens"]) for r in scored] == [(True, 3)] * len(rows)
    assert metrics["overall"]["stop_rate"] == 1.0 and metrics["overall"]["mean_answer_tokens"] == 3.0
    assert all(cat["stop_rate"] == 1.0 for cat in metrics["per_category"].values())


def test_answer_tokens_equal_a_count_of_each_answer_generated_alone(tiny_model, setup) -> None:
    """Answers that stop at different places: with no token repeated (generate's no_repeat_ngram_size=1) the tiny
    model writes a different answer to each prompt, and a token some answers hold joins the stop list. Each count
    equals the tokens a lone, unpadded `generate` of that prompt produced before its first stop token."""
    import torch

    card, tokenizer, rows = setup
    card = updated(card, {"eval.max_new_tokens": 12})
    model = _model(tiny_model, card)
    model.generation_config.no_repeat_ngram_size = 1

    def alone(stops: list[int]) -> list[list[int]]:
        outs = []
        for row in rows:
            ids = torch.tensor([prompt_ids(tokenizer, card, row["input"])])
            outs.append(model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                       max_new_tokens=12, eos_token_id=stops,
                                       pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:].tolist())
        return outs

    free = alone(stop_ids(model, tokenizer))
    held = [{t for t in out[1:]} for out in free]  # a token after the first one: the answer stops part-way
    token = next(t for out in free for t in out[1:] if 0 < sum(t in h for h in held) < len(rows))
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, token]
    stops = stop_ids(model, tokenizer)
    counted = []
    for out in alone(stops):
        ends = [i for i, t in enumerate(out) if t in stops]
        counted.append((bool(ends), ends[0] if ends else len(out)))
    answers = generate_with_stops(model, tokenizer, card, rows)  # batched, left-padded
    assert [(a["stopped"], a["answer_tokens"]) for a in answers] == counted
    assert {s for s, _ in counted} == {True, False}, counted  # both kinds present, so the mean is not trivial
    _, metrics = evaluate_rows(model, tokenizer, card, rows, "counted")
    assert metrics["overall"]["mean_answer_tokens"] == pytest.approx(sum(n for _, n in counted) / len(rows))
    assert metrics["overall"]["stop_rate"] == pytest.approx(sum(s for s, _ in counted) / len(rows))


def test_the_bootstrap_reproduces_the_stop_metrics() -> None:
    base = [{"id": f"r{i}", "category": "a", "stopped": i < 2, "answer_tokens": 10 if i < 2 else 64} for i in range(8)]
    tuned = [{**r, "stopped": True, "answer_tokens": 12} for r in base]
    iv = paired_intervals(base, tuned, ["stop_rate", "mean_answer_tokens"], resamples=200)
    assert iv["overall"]["stop_rate"]["baseline"]["value"] == 0.25 and iv["overall"]["stop_rate"]["tuned"]["value"] == 1.0
    assert iv["overall"]["mean_answer_tokens"]["baseline"]["value"] == pytest.approx((2 * 10 + 6 * 64) / 8)
    assert iv["overall"]["stop_rate"]["diff"]["low"] > 0  # every resample stops more often


def test_stopping_rows_and_line() -> None:
    named = {"baseline": {"n": 10, "overall": {"stop_rate": 0.4, "mean_answer_tokens": 50.0}},
             "tuned": {"n": 10, "overall": {"stop_rate": 1.0, "mean_answer_tokens": 20.25}}, "old": {"n": 10, "overall": {}}}
    rows = stopping_rows(named, 64)
    assert rows[0] == {"model": "baseline", "stop_rate": 0.4, "ran to the limit": "6 of 10", "mean_answer_tokens": 50.0,
                       "max_new_tokens": 64}
    assert rows[2]["stop_rate"] is None
    line = stopping_line(named, 64)
    assert line.startswith("Stopped before max_new_tokens (64): baseline 0.40 (6 of 10 ran to the limit, 50.0 tokens")
    assert "tuned 1.00 (0 of 10" in line and "old not measured" in line


# --- the default guardrail ----------------------------------------------------------------------------------------


def _m(stop_rate: float | None, **overall: float) -> dict:
    values = {"exact_match": 0.0, "rougeL": 0.5, "field_accuracy": 0.5, "json_valid_rate": 1.0, "accuracy": 0.5,
              "macro_f1": 0.5}
    if stop_rate is not None:
        values.update(stop_rate=stop_rate, mean_answer_tokens=30.0)
    return {"n": 20, "overall": {**values, **overall}, "per_category": {}}


def _card(name: str):
    return load_card(REPO / "params" / name).card


@pytest.mark.parametrize("name", ["quickstart.yaml", "examples/dialogue-summary-smollm2.yaml"])  # JSON, text
def test_text_and_json_cards_get_the_default_stop_guardrail(name: str) -> None:
    card = _card(name)
    assert card.data.target_format.kind in ("json", "text")
    cases = [(1.0, 0.96, True), (1.0, 0.94, False), (0.5, 0.5, True), (0.5, 0.45, False), (0.0, 0.0, True)]
    for base, tuned, ok in cases:
        rows = [r for r in guardrail_checks(card, _m(base), _m(tuned)) if r["metric"] == "stop_rate"]
        assert len(rows) == 1 and rows[0]["guardrail"] == f"stop_rate: default (≥ min(base, {DEFAULT_STOP_RATE}))"
        assert (rows[0]["ok"], rows[0]["value"], rows[0]["reference"]) == (ok, tuned, base), (base, tuned)
        assert bool(rows[0]["why"]) is not ok
    failed = next(r for r in guardrail_checks(card, _m(1.0), _m(0.9)) if r["metric"] == "stop_rate")
    assert failed["why"].startswith("0.900 < 0.950 = min(base 1.000, 0.95)")
    per_example = ("field_accuracy", "rougeL", "exact_match")
    base_rows = [{"id": str(i), **{k: 0.0 for k in per_example}} for i in range(40)]
    tuned_rows = [{"id": str(i), **{k: 1.0 for k in per_example}} for i in range(40)]
    decision = verdict(card, _m(1.0), _m(0.9, field_accuracy=1.0, rougeL=1.0, exact_match=1.0),
                       reference_rows=base_rows, tuned_rows=tuned_rows)
    assert decision["confirmed"] is False and "stop_rate 0.900 < 0.950" in decision["verdict"]
    sure = {"mean_length_ratio": 1.0}
    confirmed = verdict(card, _m(0.0, field_accuracy=0.0, rougeL=0.0, exact_match=0.0, **sure),
                        _m(1.0, field_accuracy=1.0, rougeL=1.0, exact_match=1.0, **sure),
                        reference_rows=base_rows, tuned_rows=tuned_rows)
    assert confirmed["decision"] == "confirmed", confirmed["verdict"]
    assert "stop_rate 0.00 → 1.00 (answers that ended before eval.max_new_tokens)" in confirmed["verdict"]
    assert "n = 40 examples" in confirmed["verdict"]


def test_label_cards_old_runs_and_declared_guardrails_have_no_default() -> None:
    label = _card("examples/own-data.yaml")
    assert label.data.target_format.kind == "label"
    assert not [r for r in guardrail_checks(label, _m(1.0), _m(0.0)) if r["metric"] == "stop_rate"]
    card = _card("quickstart.yaml")
    for base, tuned in ((None, 0.5), (1.0, None)):  # answers generated before labkit recorded stopping
        assert not [r for r in guardrail_checks(card, _m(base), _m(tuned)) if r["metric"] == "stop_rate"]
    own = updated(card, {"experiment.guardrails": [*[g.model_dump() for g in card.experiment.guardrails],
                                                   {"metric": "stop_rate", "min": 0.5}]})
    rows = [r for r in guardrail_checks(own, _m(1.0), _m(0.6)) if r["metric"] == "stop_rate"]
    assert [(r["guardrail"], r["ok"]) for r in rows] == [("stop_rate: min 0.5", True)]  # the card's replaces the default


def test_mean_answer_tokens_has_no_good_direction() -> None:
    from labkit.errors import CardError

    card = _card("quickstart.yaml")
    with pytest.raises((CardError, ValueError), match="no good direction"):
        updated(card, {"experiment.target.primary_metric": "mean_answer_tokens"})
    bounded = updated(card, {"experiment.guardrails": [{"metric": "mean_answer_tokens", "max": 40}]})
    (row,) = [r for r in guardrail_checks(bounded, _m(1.0), _m(1.0, mean_answer_tokens=45.0))
              if r["metric"] == "mean_answer_tokens"]
    assert row["ok"] is False and "> max 40" in row["why"]


def test_early_stopping_may_stop_on_stop_rate(tiny_model, setup) -> None:
    from labkit.card.schema import EarlyStopping
    from labkit.errors import CardError
    from labkit.train.early_stopping import score

    card, tokenizer, rows = setup
    stopping = updated(card, {"train.early_stopping": EarlyStopping(metric="stop_rate", patience=2)})
    model = _model(tiny_model, card)
    model.generation_config.suppress_tokens = stop_ids(model, tokenizer)
    assert score(model, tokenizer, stopping, rows, "stop_rate") == 0.0  # scored as stages 01 and 05 score
    model.generation_config.suppress_tokens = None
    model.generation_config.sequence_bias = [[[tokenizer.eos_token_id], 100.0]]
    assert score(model, tokenizer, stopping, rows, "stop_rate") == 1.0
    with pytest.raises((CardError, ValueError), match="not a single number with a good direction"):
        updated(card, {"train.early_stopping": EarlyStopping(metric="mean_answer_tokens", patience=2)})
