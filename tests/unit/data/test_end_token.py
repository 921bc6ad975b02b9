"""Stage 02's end-token check: every rendered example ends its answer with a token generation stops on, inside the
loss mask — for every prompt format and tiny architecture labkit has; a missing or masked end token fails the stage
with a one-line cause naming the token and the fix."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import REPO, smoke_rows

from labkit.card.schema import Card
from labkit.data.checks import raise_on_failed
from labkit.data.end_token import end_token_check
from labkit.data.prompting import IGNORE, encode_rows
from labkit.errors import PreprocessingCheckFailed
from labkit.model.loading import load_tokenizer
from labkit.model.sources import resolve
from labkit.model.tiny import SIZES
from labkit.stages.preprocessing import end_token_checks, generation_stops

SMOKE = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
FORMATS = {"chat (model's template)": {"format": "chat", "chat_template": "model"},
           "chat (ChatML added)": {"format": "chat", "chat_template": "chatml"},
           "plain": {"format": "plain"}}


def card_for(name: str, prompt: dict) -> Card:
    raw = copy.deepcopy(SMOKE)
    raw["model"]["source"] = f"tiny:{name}"
    keep = {k: v for k, v in raw["data"]["prompt"].items() if k not in ("chat_template", "format")}
    raw["data"]["prompt"] = {**keep, **prompt}
    return Card.model_validate(raw)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return smoke_rows(6)


def _setup(name: str, fmt: str):
    refuses_system = fmt == "chat (model's template)" and name == "gemma2"  # Gemma 2's template has no system role
    card = card_for(name, {**FORMATS[fmt], **({"system_in": "user"} if refuses_system else {})})
    resolved = resolve(f"tiny:{name}")
    tokenizer = load_tokenizer(resolved, card)
    return card, resolved, tokenizer


COMBOS = [(name, fmt) for name in SIZES for fmt in FORMATS
          if not (fmt == "chat (model's template)" and SIZES[name].get("template") is False)]


@pytest.mark.parametrize(("name", "fmt"), COMBOS)
def test_every_prompt_format_and_tiny_architecture_passes(name: str, fmt: str, rows: list[dict]) -> None:
    card, resolved, tokenizer = _setup(name, fmt)
    stops = generation_stops(resolved, tokenizer, card)
    assert tokenizer.eos_token_id in stops
    encoded = encode_rows(tokenizer, card, rows)
    check = end_token_check(tokenizer, rows, encoded, stops)
    assert check["ok"] and check["failed_ids"] == [], check
    assert check["check"].startswith("every answer ends with a token generation stops on, inside the loss mask (")


def test_a_masked_end_token_fails_with_its_cause(rows: list[dict]) -> None:
    card, resolved, tokenizer = _setup("llama", "chat (model's template)")
    stops = generation_stops(resolved, tokenizer, card)
    encoded = encode_rows(tokenizer, card, rows)
    end = max(i for i, t in enumerate(encoded[1].input_ids) if t in stops)
    encoded[1].labels[end] = IGNORE  # the collator bug: the end token masked like padding
    (check,) = end_token_checks(tokenizer, card, {"train": rows}, {"train": encoded}, stops)
    assert not check["ok"] and check["failed_ids"] == [rows[1]["id"]] and check["failed"] == 1
    assert check["explanation"] == (
        f"row {rows[1]['id']}: the end token '<|im_end|>' (id {tokenizer.eos_token_id}) after the answer is masked out "
        f"of the loss (label -100 at position {end}); fix: keep the end token's label (it teaches the model to stop): a "
        "template, collator or pad = EOS masking that sets it to -100 must leave the answer's end token in the loss")
    with pytest.raises(PreprocessingCheckFailed) as failed:
        raise_on_failed([check])
    assert "\n" not in str(failed.value) and "masked out of the loss" in str(failed.value)


def test_a_missing_end_token_fails_with_its_cause(rows: list[dict]) -> None:
    """A tokenizer without an eos_token under format plain: nothing closes the answer, yet the model (Phi's config)
    stops only on <|endoftext|>."""
    card, resolved, tokenizer = _setup("phi", "plain")
    tokenizer.eos_token = None  # the broken setting: the plain format has no EOS to append
    stops = generation_stops(resolved, tokenizer, card)
    assert stops == [tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    encoded = encode_rows(tokenizer, card, rows)
    check = end_token_check(tokenizer, rows, encoded, stops)
    assert not check["ok"] and check["failed_ids"] == [r["id"] for r in rows]
    last = tokenizer.convert_ids_to_tokens(encoded[0].input_ids[-1])
    assert check["explanation"].startswith(
        f"row {rows[0]['id']}: the answer ends with {last!r} (id {encoded[0].input_ids[-1]}) and no token generation "
        "stops on follows it; fix: close the answer with an end token generation stops on")
    assert "'<|endoftext|>'" in check["check"]


def test_a_truncated_example_is_left_to_the_truncation_check(rows: list[dict]) -> None:
    card, resolved, tokenizer = _setup("llama", "chat (model's template)")
    short = card.model_copy(update={"data": card.data.model_copy(update={"max_length": 40})})
    encoded = encode_rows(tokenizer, short, rows)
    assert all(e.truncated for e in encoded)
    assert end_token_check(tokenizer, rows, encoded, generation_stops(resolved, tokenizer, card))["ok"]
