"""The prompts of the baseline (`eval.baseline_prompts`): what the base model sees under each, token for token.

The training prompt is `labkit.data.prompting`'s (the tuned model's); the others are the tokenizer's own chat
template, a card-given completion template and k examples of the training split before the question (few-shot).
"""

from __future__ import annotations

import random
from typing import Any

from labkit.card.baseline_prompts import INPUT, BaselinePrompt, FewShotPrompt, TemplatePrompt
from labkit.card.schema import Card
from labkit.data import conversations
from labkit.data.prompting import _ids, _plain_ids, messages, plain_prompt, prompt_ids, render


def chat_template_skip(tokenizer: Any, card: Card) -> str | None:
    """Why the `chat_template` baseline prompt cannot be measured (None: it can).

    Args:
        tokenizer: the base model's tokenizer, as stage 01 loaded it.
        card: the card (its training prompt).
    Returns:
        the reason, in words, or None.
    """
    prompt = card.data.prompt
    if prompt.format == "chat" and prompt.chat_template == "model":
        return "the training prompt already is the tokenizer's chat template (data.prompt.chat_template: model)"
    if prompt.format == "chat" and prompt.chat_template == "chatml":
        return "the training prompt replaced the tokenizer's template with ChatML (data.prompt.chat_template: chatml)"
    if not getattr(tokenizer, "chat_template", None):
        return "the tokenizer has no chat template"
    return None


def draw_shots(train_rows: list[dict[str, Any]], k: int, seed: int) -> list[dict[str, Any]]:
    """k examples of the training split for a few-shot prompt, drawn with `seed` (the same for every question).

    Args:
        train_rows: the training split's prepared rows (never the evaluation split's).
        k: how many.
        seed: the draw's seed.
    Returns:
        up to k rows as {"id", "input", "target"}, in the order drawn.
    """
    chosen = random.Random(seed).sample(range(len(train_rows)), min(k, len(train_rows)))
    return [{"id": train_rows[i].get("id"), "input": train_rows[i]["input"], "target": train_rows[i]["target"]}
            for i in chosen]


def fill(template: str, text: str) -> str:
    """The card template with the row's input in place of {input}."""
    return template.replace(INPUT, text)


def _answered(template: str, text: str, target: str) -> str:
    """One worked example in a completion template: the filled template, a space (unless it ends in one), the answer."""
    head = fill(template, text)
    return head + ("" if head[-1:].isspace() else " ") + target


def baseline_prompt_ids(tokenizer: Any, card: Card, item: BaselinePrompt, text: str,
                        shots: list[dict[str, Any]] | None = None) -> list[int]:
    """Token ids of one baseline prompt for one input, ending where the answer starts.

    Args:
        tokenizer: the base model's tokenizer.
        card: the card (its training prompt).
        item: the baseline prompt (`eval.baseline_prompts` item).
        text: the row's input.
        shots: the few-shot examples (`draw_shots`), for a few_shot item.
    Returns:
        the prompt's token ids.
    """
    if item == "training":
        return prompt_ids(tokenizer, card, text)
    if item == "chat_template":
        return _ids(tokenizer.apply_chat_template(messages(card.data.prompt, text), add_generation_prompt=True,
                                                  tokenize=True))
    said = conversations.transcript if card.data.prompt.conversation else str  # a template's {input}: plain text
    if isinstance(item, TemplatePrompt):
        return _plain_ids(tokenizer, fill(item.template, said(text)))
    assert isinstance(item, FewShotPrompt)
    shots = shots or []
    if item.template is not None:
        worked = [_answered(item.template, said(s["input"]), s["target"]) for s in shots]
        return _plain_ids(tokenizer, "\n\n".join([*worked, fill(item.template, said(text))]))
    prompt = card.data.prompt
    if prompt.format == "plain":
        worked = [plain_prompt(prompt, s["input"]) + s["target"] for s in shots]
        return _plain_ids(tokenizer, "\n\n".join([*worked, plain_prompt(prompt, text)]))
    turns = messages(prompt, text, shots=[(s["input"], s["target"]) for s in shots])
    return _ids(render(tokenizer, prompt, turns, add_generation_prompt=True, tokenize=True))


def stop_strings(item: BaselinePrompt) -> list[str]:
    """The strings generation stops on under a baseline prompt (none for training and chat_template)."""
    return [] if isinstance(item, str) else list(item.stop)


def describe(item: BaselinePrompt) -> str:
    """A baseline prompt in words, for tables and verdicts."""
    if item == "training":
        return "the training prompt"
    if item == "chat_template":
        return "the tokenizer's chat template"
    if isinstance(item, TemplatePrompt):
        return f"the card template {item.template!r}"
    return f"{item.few_shot} training example{'s' if item.few_shot > 1 else ''} before the question" + (
        f" in {item.template!r}" if item.template else " in the training prompt")
