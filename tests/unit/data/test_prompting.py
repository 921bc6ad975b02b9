"""Tokenisation with loss positions, and the checks that catch template / mask / EOS bugs."""

from __future__ import annotations

import pytest
from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.data.prompting import IGNORE, check_encoded, encode_example, prompt_ids
from labkit.show.tokens import render_page

ANSWER = '{"category": "billing", "priority": "low", "product": "Orbit Phone"}'


@pytest.fixture(scope="module")
def card():
    return load_card(REPO / "params" / "smoke.yaml").card


@pytest.fixture
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model.location)


def test_loss_only_on_completion_ending_with_eos(tok, card) -> None:
    enc = encode_example(tok, card, "my orbit phone bill is wrong", ANSWER)
    prompt = prompt_ids(tok, card, "my orbit phone bill is wrong")
    assert enc.input_ids[: len(prompt)] == prompt and enc.prefix_ok
    assert all(label == IGNORE for label in enc.labels[: len(prompt)])
    assert enc.labels[len(prompt):] == enc.input_ids[len(prompt):]
    assert enc.input_ids[-1] == tok.eos_token_id and enc.labels[-1] == tok.eos_token_id
    assert tok.decode(enc.input_ids[len(prompt):], skip_special_tokens=True) == ANSWER
    rows = [{"id": "a"}]
    assert all(c["ok"] for c in check_encoded(tok, rows, [enc]) if "truncated" not in c["check"])


def test_template_without_eos_gets_one(tok, card) -> None:
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant:{% endif %}")
    enc = encode_example(tok, card, "hello", ANSWER)
    assert enc.input_ids[-1] == tok.eos_token_id and enc.labels[-1] == tok.eos_token_id


def test_mismatched_generation_prompt_is_caught(tok, card) -> None:
    # the generation prompt says "ASSISTANT:" but turns are rendered "assistant:": trained context != inference context
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}ASSISTANT:{% endif %}")
    enc = encode_example(tok, card, "hello", ANSWER)
    checks = {c["check"]: c for c in check_encoded(tok, [{"id": "x"}], [enc])}
    assert not checks["prompt alone is a token prefix of prompt + completion"]["ok"]
    assert checks["prompt alone is a token prefix of prompt + completion"]["failed_ids"] == ["x"]


def test_checks_fail_when_nothing_carries_loss(tok, card) -> None:
    card = updated(card, {"data.max_length": 20})
    enc = encode_example(tok, card, "a very long ticket " * 20, ANSWER)
    checks = {c["check"]: c for c in check_encoded(tok, [{"id": "long"}], [enc])}
    assert not checks["every example has loss positions"]["ok"]
    assert checks["every example has loss positions"]["failed_ids"] == ["long"]
    assert not checks["no example truncated by max_length"]["ok"]


def test_token_view_marks_loss_positions(tok, card) -> None:
    enc = encode_example(tok, card, "my orbit phone", ANSWER)
    page = render_page(tok, [("row a", enc)])
    body = page.split('<div class="lk-ex">', 1)[1]  # after the legend
    assert body.count('class="lk-t lk-loss') == enc.loss_tokens
    assert body.count("lk-t lk-mask") == len(enc.input_ids) - enc.loss_tokens
    assert "lk-special" in page and "row a" in page
