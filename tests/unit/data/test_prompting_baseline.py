"""The baseline's prompts (`eval.baseline_prompts`): the card keys and their one-line refusals, what the base model
sees under each prompt, few-shot examples from the training split only, the chat template skipped with its reason."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from labkit.card.baseline_prompts import FewShotPrompt, TemplatePrompt, parse, prompt_names, spec
from labkit.card.load import load_card
from labkit.card.schema import Card
from labkit.data.prompting import plain_prompt, prompt_ids
from labkit.data.prompting_baseline import (
    baseline_prompt_ids,
    chat_template_skip,
    describe,
    draw_shots,
    stop_strings,
)
from labkit.errors import CardError
from labkit.model.loading import load_tokenizer
from labkit.model.sources import resolve

SMOKE = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
PHI = "Instruct: Summarise.\n{input}\nOutput:"


def card_with(source: str = "tiny:llama", prompts: list | None = None, **prompt) -> Card:
    raw = copy.deepcopy(SMOKE)
    raw["model"]["source"] = source
    keep = {k: v for k, v in raw["data"]["prompt"].items() if k != "chat_template"}
    raw["data"]["prompt"] = {**keep, **prompt}
    if prompts is not None:
        raw["eval"]["baseline_prompts"] = prompts
    return Card.model_validate(raw)


def _write(tmp_path: Path, prompts: list) -> Path:
    raw = copy.deepcopy(SMOKE)
    raw["eval"]["baseline_prompts"] = prompts
    path = tmp_path / "card.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def test_default_is_the_training_prompt_and_every_shipped_card_keeps_it_or_declares_its_own() -> None:
    assert card_with().eval.baseline_prompts == ["training"]
    card = card_with(prompts=["training", "chat_template", {"template": PHI, "stop": ["\nInstruct:"]}, {"few_shot": 3},
                              {"few_shot": 1, "template": PHI, "name": "phi_1shot"}])
    items = card.eval.baseline_prompts
    assert isinstance(items[2], TemplatePrompt) and items[2].stop == ["\nInstruct:"]
    assert isinstance(items[3], FewShotPrompt) and items[3].few_shot == 3 and items[3].template is None
    assert prompt_names(items) == ["training", "chat_template", "template", "few_shot_3", "phi_1shot"]
    assert [parse(spec(i)) for i in items] == items  # the record reads back as the card's item


def test_a_template_without_the_placeholder_is_a_one_line_error_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(CardError) as err:
        load_card(_write(tmp_path, ["training", {"template": "Instruct: {text}\nOutput:"}]))
    text = str(err.value)
    assert len(text.splitlines()) == 1 and "eval.baseline_prompts.1" in text and "{input}" in text
    with pytest.raises(CardError, match="write \\{input\\} where the row's input goes"):
        load_card(_write(tmp_path, [{"few_shot": 2, "template": "Q: x\nA:"}]))


@pytest.mark.parametrize(("prompts", "says"), [
    (["training", "chat"], "expected one of 'training' or 'chat_template'"),
    ([{"template": "Q: {input}\nA:", "stops": ["\n"]}], "stops: unknown key"),
    ([{"few_shot": 0}], "few_shot"),
    (["training", "training"], "names 'training' twice"),
    ([], "eval.baseline_prompts is empty"),
    ([{"template": "Q: {input}", "name": "a/b"}], "name"),
])
def test_unknown_keys_and_bad_values_are_refused(tmp_path: Path, prompts: list, says: str) -> None:
    with pytest.raises(CardError, match=says) as err:
        load_card(_write(tmp_path, prompts))
    assert len(str(err.value).splitlines()) == 1


def test_what_the_base_model_sees_under_each_prompt(tiny_model) -> None:
    card = card_with(format="plain", instruction="Ticket:\n{input}")
    tok = load_tokenizer(tiny_model, card)
    text = "my orbit phone bill is wrong"
    assert baseline_prompt_ids(tok, card, "training", text) == prompt_ids(tok, card, text)
    chat = tok.decode(baseline_prompt_ids(tok, card, "chat_template", text))
    assert chat.endswith("<|im_start|>assistant\n") and "Ticket:\nmy orbit phone bill is wrong" in chat
    own = TemplatePrompt(template=PHI, stop=["\nInstruct:"])
    assert tok.decode(baseline_prompt_ids(tok, card, own, text)) == PHI.replace("{input}", text)
    assert stop_strings(own) == ["\nInstruct:"] and stop_strings("training") == []
    assert "the card template" in describe(own) and describe("training") == "the training prompt"


def test_few_shot_renders_k_training_examples_before_the_question(tiny_model) -> None:
    train = [{"id": f"t{i}", "input": f"train input {i}", "target": f"answer {i}"} for i in range(10)]
    shots = draw_shots(train, 3, seed=0)
    assert len(shots) == 3 and len({s["id"] for s in shots}) == 3 and all(s in train for s in shots)
    assert draw_shots(train, 3, seed=0) == shots and draw_shots(train, 30, seed=0) != shots  # seeded; k capped
    plain = card_with(format="plain", instruction="Ticket:\n{input}")
    tok = load_tokenizer(tiny_model, plain)
    rendered = tok.decode(baseline_prompt_ids(tok, plain, FewShotPrompt(few_shot=3), "the question", shots),
                          skip_special_tokens=True)
    parts = [plain_prompt(plain.data.prompt, s["input"]) + s["target"] for s in shots]
    assert rendered == "\n\n".join([*parts, plain_prompt(plain.data.prompt, "the question")])
    in_template = tok.decode(baseline_prompt_ids(tok, plain, FewShotPrompt(few_shot=3, template=PHI), "the question",
                                                 shots), skip_special_tokens=True)
    assert in_template.count("Instruct:") == 4 and in_template.endswith("the question\nOutput:")
    assert all(f"{s['input']}\nOutput: {s['target']}" in in_template for s in shots)
    chat = card_with()  # the training prompt is the chat template: the examples are earlier turns of the conversation
    chat_tok = load_tokenizer(tiny_model, chat)
    turns = chat_tok.decode(baseline_prompt_ids(chat_tok, chat, FewShotPrompt(few_shot=3), "the question", shots))
    assert turns.count("<|im_start|>assistant\n") == 4 and turns.count("<|im_start|>system") == 1
    assert all(s["target"] in turns for s in shots)
    assert turns.endswith("the question<|im_end|>\n<|im_start|>assistant\n")
    opened = card_with(system_in="user")  # the system text opens the first user message only, never each example's
    first = chat_tok.decode(baseline_prompt_ids(chat_tok, opened, FewShotPrompt(few_shot=3), "the question", shots))
    system = opened.data.prompt.system.strip()
    assert first.count(system) == 1 and f"<|im_start|>user\n{system}\n\n" in first
    assert first.index(system) < first.index(shots[0]["input"])


def test_the_chat_template_is_skipped_with_its_reason() -> None:
    plain_phi = card_with("tiny:phi", format="plain")
    assert chat_template_skip(load_tokenizer(resolve("tiny:phi"), plain_phi), plain_phi) == \
        "the tokenizer has no chat template"
    chat = card_with()
    assert "already is the tokenizer's chat template" in chat_template_skip(load_tokenizer(resolve("tiny:llama"), chat),
                                                                            chat)
    plain_llama = card_with(format="plain")
    assert chat_template_skip(load_tokenizer(resolve("tiny:llama"), plain_llama), plain_llama) is None
