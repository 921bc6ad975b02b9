"""One source of truth for what the model sees: messages, tokens and where the loss is computed.

The same functions build the prompt for training, evaluation and inference, so the prompt a model
is trained on is token for token the prompt it is evaluated with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.card.schema import Card

IGNORE = -100


def messages(card: Card, text: str) -> list[dict[str, str]]:
    """Chat messages of the prompt for one input text (system message when the card has one)."""
    out = []
    if card.data.prompt.system:
        out.append({"role": "system", "content": card.data.prompt.system.strip()})
    out.append({"role": "user", "content": card.data.prompt.instruction.replace("{input}", text)})
    return out


def _ids(encoded: Any) -> list[int]:
    """apply_chat_template(tokenize=True) returns a list or a BatchEncoding depending on the version."""
    if isinstance(encoded, dict) or hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    return list(encoded)


def prompt_ids(tokenizer: Any, card: Card, text: str) -> list[int]:
    """Token ids of the prompt, ending with the assistant header (what generation starts from)."""
    return _ids(tokenizer.apply_chat_template(messages(card, text), add_generation_prompt=True, tokenize=True))


def prompt_text(tokenizer: Any, card: Card, text: str) -> str:
    """The prompt as text after the chat template."""
    return tokenizer.apply_chat_template(messages(card, text), add_generation_prompt=True, tokenize=False)


@dataclass
class Encoded:
    """A tokenised training example.

    Attributes:
        input_ids: prompt + completion tokens (ending at EOS, possibly truncated).
        labels: IGNORE on prompt tokens, the token id where the loss is computed.
        prompt_len: number of prompt tokens.
        full_len: length before truncation.
        truncated: whether max_length cut the example.
        prefix_ok: whether the prompt alone is a token prefix of prompt+completion.
    """

    input_ids: list[int]
    labels: list[int]
    prompt_len: int
    full_len: int
    truncated: bool
    prefix_ok: bool

    @property
    def loss_tokens(self) -> int:
        return sum(label != IGNORE for label in self.labels)


def encode_example(tokenizer: Any, card: Card, text: str, target: str) -> Encoded:
    """Tokenise prompt + completion with the chat template; loss on the completion only.

    The sequence ends at the completion's EOS (template text after it, such as a trailing newline,
    is dropped: the model never generates past EOS).

    Args:
        tokenizer: the model's tokenizer.
        card: the card (prompt settings, max_length).
        text: the input text.
        target: the reference answer.
    Returns:
        Encoded.
    """
    prompt = prompt_ids(tokenizer, card, text)
    convo = messages(card, text) + [{"role": "assistant", "content": target}]
    full = _ids(tokenizer.apply_chat_template(convo, tokenize=True))
    prefix_ok = full[: len(prompt)] == prompt
    eos = tokenizer.eos_token_id
    positions = [i for i in range(len(prompt), len(full)) if full[i] == eos]
    if positions:
        full = full[: positions[-1] + 1]
    elif eos is not None:
        full = full + [eos]  # a template without EOS after the answer: add it so generation learns to stop
    labels = [IGNORE] * len(prompt) + full[len(prompt):]
    full_len = len(full)
    limit = card.data.max_length
    return Encoded(input_ids=full[:limit], labels=labels[:limit], prompt_len=len(prompt), full_len=full_len,
                   truncated=full_len > limit, prefix_ok=prefix_ok)


def encode_rows(tokenizer: Any, card: Card, rows: list[dict[str, Any]]) -> list[Encoded]:
    """Encode prepared rows (each with `input` and `target`)."""
    return [encode_example(tokenizer, card, r["input"], r["target"]) for r in rows]


def check_encoded(tokenizer: Any, rows: list[dict[str, Any]], encoded: list[Encoded]) -> list[dict[str, Any]]:
    """Checks that catch the common template/mask bugs, per row.

    Args:
        tokenizer: the tokenizer (for the EOS id).
        rows: prepared rows (with `id`).
        encoded: their encodings.
    Returns:
        a list of {"check", "ok", "failed_ids", "explanation"}.
    """
    eos = tokenizer.eos_token_id
    no_loss, no_eos, not_prefix, truncated = [], [], [], []
    for row, enc in zip(rows, encoded, strict=True):
        if enc.loss_tokens == 0:
            no_loss.append(row["id"])
        if not enc.truncated and (enc.input_ids[-1] != eos or enc.labels[-1] != eos):
            no_eos.append(row["id"])
        if not enc.prefix_ok:
            not_prefix.append(row["id"])
        if enc.truncated:
            truncated.append(row["id"])
    return [
        {"check": "every example has loss positions", "ok": not no_loss, "failed_ids": no_loss,
         "explanation": "an example with no completion tokens teaches nothing (prompt longer than max_length?)"},
        {"check": "completion ends with EOS and the EOS carries loss", "ok": not no_eos, "failed_ids": no_eos,
         "explanation": "without a trained EOS the model does not learn to stop and rambles at inference"},
        {"check": "prompt alone is a token prefix of prompt + completion", "ok": not not_prefix, "failed_ids": not_prefix,
         "explanation": "otherwise the model is trained on a context it never sees at inference"},
        {"check": "no example truncated by max_length", "ok": not truncated, "failed_ids": truncated,
         "explanation": "a truncated completion loses its EOS and part of the answer; raise max_length or drop long rows"},
    ]
