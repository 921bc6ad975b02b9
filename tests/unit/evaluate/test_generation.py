"""Generation stops on every token of the model's generation-config stop list, not only the tokenizer's EOS."""

from __future__ import annotations

from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.data import sources as D
from labkit.data.prompting import prompt_ids
from labkit.evaluate.generation import generate_answers, stop_ids
from labkit.model.loading import load_model, load_tokenizer


def test_a_second_stop_token_in_the_generation_config_ends_the_answer(tiny_model) -> None:
    import torch

    card = updated(load_card(REPO / "params" / "smoke.yaml").card, {"eval.batch_size": 1, "eval.max_new_tokens": 8})
    tokenizer, model = load_tokenizer(tiny_model, card), load_model(tiny_model, card, "cpu")
    rows = [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()][:1]
    with torch.no_grad():  # the random tiny model's first greedy token (not its EOS)
        first = int(model(torch.tensor([prompt_ids(tokenizer, card, rows[0]["input"])])).logits[0, -1].argmax())
    assert first != tokenizer.eos_token_id
    steps = []
    model.lm_head.register_forward_hook(lambda *_: steps.append(1))  # one call per generated token
    generate_answers(model, tokenizer, card, rows)
    assert len(steps) == 8  # no stop token met: all max_new_tokens
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, first]  # as Llama 3 Instruct lists two
    assert stop_ids(model, tokenizer) == [tokenizer.eos_token_id, first]
    steps.clear()
    generate_answers(model, tokenizer, card, rows)
    assert len(steps) == 1  # stopped at the listed token at once
    model.generation_config.eos_token_id = 7
    assert stop_ids(model, tokenizer) == [7, tokenizer.eos_token_id]
