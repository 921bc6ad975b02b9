"""A non-finite logit during evaluation is an error naming the row, never an answer that gets scored."""

from __future__ import annotations

import pytest
import torch
from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.data import sources as D
from labkit.errors import NonFiniteError
from labkit.evaluate.generation import generate_answers
from labkit.evaluate.procedure import evaluate_rows, non_finite
from labkit.model.loading import load_model, load_tokenizer


def _setup(tiny_model):
    card = updated(load_card(REPO / "params" / "smoke.yaml").card, {"eval.batch_size": 2, "eval.max_new_tokens": 4})
    rows = [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()][:3]
    return card, rows, load_tokenizer(tiny_model, card), load_model(tiny_model, card, "cpu")


def test_nan_logits_fail_the_evaluation_with_the_row(tiny_model) -> None:
    card, rows, tokenizer, model = _setup(tiny_model)
    answers = evaluate_rows(model, tokenizer, card, rows, "tuned")  # finite: scored
    assert len(answers[0]) == 3
    calls = []

    def poison(_module, _inputs, out):  # the second generated token of the batch's first row turns NaN
        calls.append(1)
        if len(calls) == 2:
            out = out.clone()
            out[0, -1, 5] = float("nan")
        return out

    model.lm_head.register_forward_hook(poison)
    with pytest.raises(NonFiniteError) as raised:
        evaluate_rows(model, tokenizer, card, rows, "tuned")
    message = str(raised.value)
    assert message.startswith("tuned: generating: non-finite logits (nan) at generated token 2 of row(s) [")
    assert "is not scored" in message and "fix:" in message and "\n" not in message
    first_batch = sorted(range(len(rows)), key=lambda i: (len(tokenizer(rows[i]["input"]).input_ids), i))
    assert repr(rows[first_batch[0]]["id"]) in message or str(rows[first_batch[0]]["id"]) in message


def test_inf_logits_fail_but_a_suppressed_token_does_not(tiny_model) -> None:
    card, rows, tokenizer, model = _setup(tiny_model)
    handle = model.lm_head.register_forward_hook(lambda _m, _i, out: out.index_fill(-1, torch.tensor([3]), -torch.inf))
    assert len(generate_answers(model, tokenizer, card, rows)) == 3  # one -inf logit: a token ruled out, not an error
    handle.remove()
    model.lm_head.register_forward_hook(lambda _m, _i, out: out.index_fill(-1, torch.tensor([3]), float("inf")))
    with pytest.raises(NonFiniteError, match=r"non-finite logits \(inf\) at generated token 1"):
        generate_answers(model, tokenizer, card, rows, desc="baseline")


def test_non_finite_names_the_path_of_each_bad_number() -> None:
    assert non_finite({"overall": {"rougeL": 0.5, "n": 3}, "per": [1.0, float("nan")]}) == ["per[1] = nan"]
    assert non_finite({"a": {"b": float("inf")}, "s": "nan"}) == ["a.b = inf"]
    assert non_finite(0.25) == []
