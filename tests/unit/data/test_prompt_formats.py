"""Each prompt format (`data.prompt.format: chat | plain`, `chat_template: model | chatml`): its text, its tokens and
loss positions, and stage 02's checks catching what goes wrong in it."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import REPO

from labkit.card.schema import Card
from labkit.data.prompting import IGNORE, check_encoded, encode_example, plain_prompt, prompt_ids, prompt_text
from labkit.errors import CardError, ModelSourceError
from labkit.model.loading import add_chatml, check_template, load_model, load_tokenizer
from labkit.model.sources import resolve
from labkit.show.tokens import render_page

ANSWER = '{"category": "billing", "priority": "low", "product": "Orbit Phone"}'
SMOKE = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())


def card_with(source: str = "tiny:llama", **prompt) -> Card:
    raw = copy.deepcopy(SMOKE)
    raw["model"]["source"] = source
    keep = {k: v for k, v in raw["data"]["prompt"].items() if k != "chat_template"}
    raw["data"]["prompt"] = {**keep, **prompt}
    return Card.model_validate(raw)


def failed(tok, encodings) -> dict[str, bool]:
    rows = [{"id": f"r{i}"} for i in range(len(encodings))]
    return {c["check"]: c["ok"] for c in check_encoded(tok, rows, encodings)}


@pytest.fixture(scope="module")
def phi():
    return resolve("tiny:phi")


@pytest.fixture(scope="module")
def mistral():
    return resolve("tiny:mistral")


# --- the card keys -----------------------------------------------------------------------------------------------


def test_card_keys_and_their_refusals() -> None:
    assert card_with().data.prompt.format == "chat" and card_with().data.prompt.chat_template == "model"
    with pytest.raises(ValueError, match="chat_template: chatml is only for format: chat"):
        card_with(format="plain", chat_template="chatml")
    with pytest.raises(ValueError, match="template is only for format: plain"):
        card_with(template="Q: {instruction}\nA: ")
    with pytest.raises(ValueError, match="must contain \\{instruction\\}"):
        card_with(format="plain", template="Q: {system}\nA: ")
    with pytest.raises(ValueError, match="Input should be 'model' or 'chatml'"):
        card_with(chat_template="llama")
    with pytest.raises(ValueError, match="system_in is only for format: chat"):
        card_with(format="plain", system_in="user")
    with pytest.raises(ValueError, match="system_in: user places `system`, which is not set"):
        card_with(system_in="user", system=None)


# --- plain -------------------------------------------------------------------------------------------------------


def test_plain_default_template_with_and_without_system() -> None:
    card = card_with(format="plain")
    assert plain_prompt(card.data.prompt, "my bill") == (
        "### Instruction:\nReply with one JSON object and nothing else.\n\nTicket:\nmy bill\n\n### Response:\n")
    bare = card_with(format="plain", system=None)
    assert plain_prompt(bare.data.prompt, "my bill") == "### Instruction:\nTicket:\nmy bill\n\n### Response:\n"
    own = card_with(format="plain", system=None, template="{system}Question: {instruction}\nAnswer:")
    assert plain_prompt(own.data.prompt, "x") == "Question: Ticket:\nx\nAnswer:"


def test_plain_tokens_loss_and_eos(phi) -> None:
    card = card_with("tiny:phi", format="plain")
    tok = load_tokenizer(phi, card)
    assert not tok.chat_template and tok.pad_token_id == tok.eos_token_id == tok.bos_token_id
    enc = encode_example(tok, card, "my orbit phone bill is wrong", ANSWER)
    prompt = prompt_ids(tok, card, "my orbit phone bill is wrong")
    assert prompt_text(tok, card.data.prompt, "x").endswith("### Response:\n")
    assert enc.input_ids[: len(prompt)] == prompt and enc.prefix_ok
    assert all(label == IGNORE for label in enc.labels[: len(prompt)])
    assert enc.labels[len(prompt):] == enc.input_ids[len(prompt):]
    assert enc.input_ids[-1] == tok.eos_token_id and enc.labels[-1] == tok.eos_token_id  # EOS appended, trained
    assert tok.decode(enc.input_ids[len(prompt):-1]) == ANSWER
    short = encode_example(tok, card, "hi", "ok")
    assert all(failed(tok, [enc, short]).values())
    page = render_page(tok, [("a", enc)])
    assert "Prompt format: <b>plain" in page and "### Response:" in page


def test_plain_bos_added_once(phi) -> None:
    """A tokenizer that adds its BOS (Llama, Mistral) gets it once; a template that writes it too is caught."""
    from tokenizers import processors

    card = card_with("tiny:phi", format="plain", template="### Instruction:\n{system}\n\n{instruction}\n\n### Response:\n")
    tok = load_tokenizer(phi, card)
    tok.add_special_tokens({"bos_token": "<s>"})
    bos = tok.bos_token_id
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    enc = encode_example(tok, card, "my bill", "ok")
    assert enc.input_ids[0] == bos and enc.input_ids[1] != bos and enc.prefix_ok
    twice = card_with("tiny:phi", format="plain", template="<s>### Instruction:\n{instruction}\n\n### Response:\n")
    doubled = encode_example(tok, twice, "my bill", "ok")
    assert doubled.input_ids[0] == bos and doubled.input_ids[1] != bos  # the tokenizer's second BOS is dropped
    doubled.input_ids.insert(0, bos)
    doubled.labels.insert(0, IGNORE)
    assert failed(tok, [doubled])["BOS appears once at the start"] is False


# --- chat: model and chatml --------------------------------------------------------------------------------------


def test_model_template_refused_without_one(phi) -> None:
    with pytest.raises(ModelSourceError, match="data.prompt.chat_template: model needs one.*format: plain.*chatml"):
        load_tokenizer(phi, card_with("tiny:phi"))


def test_a_template_refusing_the_system_message_names_system_in(tiny_model) -> None:
    """Gemma 2's template raises "System role not supported": the run stops when the tokenizer loads, naming the key;
    `system_in: user` opens the user message with the system text (a blank line between), in every prompt built."""
    gemma = resolve("tiny:gemma2")
    with pytest.raises(CardError, match=r"^data.prompt.system: the chat template of tiny:gemma2 refuses a system "
                       r"message \(System role not supported\); set data.prompt.system_in: user \(the text opens the "
                       r"user message\) or remove data.prompt.system$"):
        load_tokenizer(gemma, card_with("tiny:gemma2"))
    card = card_with("tiny:gemma2", system_in="user")
    tok = load_tokenizer(gemma, card)
    assert prompt_text(tok, card.data.prompt, "hello") == (
        "<bos><start_of_turn>user\nReply with one JSON object and nothing else.\n\nTicket:\nhello<end_of_turn>\n"
        "<start_of_turn>model\n")
    enc = encode_example(tok, card, "hello", ANSWER)
    assert all(failed(tok, [enc, encode_example(tok, card, "a longer input text", ANSWER)]).values())
    assert enc.input_ids[:2] != [tok.bos_token_id] * 2  # the template's BOS, not the tokenizer's as well
    chatml = card_with("tiny:llama", system_in="user")  # a template with a system role places it as asked, too
    assert prompt_text(load_tokenizer(tiny_model, chatml), chatml.data.prompt, "hi").startswith(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nReply with one JSON object")
    with pytest.raises(ModelSourceError, match=r"^tiny:gemma2: the chat template refuses a user / assistant "
                       r"conversation \(Conversation roles must alternate"):
        check_template(_AssistantFirst(tok), card.data.prompt, "tiny:gemma2")


def test_qwen3_think_block_before_the_answer_is_caught_and_moved_into_the_prompt() -> None:
    """Qwen3's template opens the last assistant turn with an empty think block: trained as is, the model learns to
    write it before every answer. Stage 02 fails naming it; `chat_template_kwargs: {enable_thinking: false}` renders
    the block at the end of the prompt, in training, evaluation and the export's snippet alike."""
    qwen3 = resolve("tiny:qwen3")
    card = card_with("tiny:qwen3")
    tok = load_tokenizer(qwen3, card)
    enc = encode_example(tok, card, "hello", ANSWER)
    assert enc.prefix_ok and enc.before_answer == "<think>\n\n</think>\n\n"
    (check,) = [c for c in check_encoded(tok, [{"id": "r0"}], [enc]) if c["check"] == "the answer follows the prompt directly"]
    assert not check["ok"] and check["failed_ids"] == ["r0"] and check["explanation"].startswith(
        "the chat template writes '<think>\\n\\n</think>\\n\\n' between the prompt and the answer") and \
        check["explanation"].endswith("set data.prompt.chat_template_kwargs: {enable_thinking: false}, which moves it "
                                      "into the prompt")
    off = card_with("tiny:qwen3", chat_template_kwargs={"enable_thinking": False})
    tok = load_tokenizer(qwen3, off)
    assert prompt_text(tok, off.data.prompt, "hello").endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    enc = encode_example(tok, off, "hello", ANSWER)
    assert enc.before_answer == "" and tok.decode(enc.input_ids[enc.prompt_len:]) == ANSWER + "<|im_end|>"
    assert all(failed(tok, [enc, encode_example(tok, off, "a longer input", ANSWER)]).values())


def test_chat_template_kwargs_refusals() -> None:
    with pytest.raises(ValueError, match="chat_template_kwargs is only for format: chat"):
        card_with(format="plain", chat_template_kwargs={"enable_thinking": False})
    for bad in ("tokenize", "not a name"):
        with pytest.raises(ValueError, match=f"chat_template_kwargs: '{bad}' is not a template variable"):
            card_with(chat_template_kwargs={bad: True})


class _AssistantFirst:
    """A tokenizer whose conversations open with an assistant turn (what Gemma's template refuses)."""

    def __init__(self, tok) -> None:
        self.tok = tok

    def apply_chat_template(self, conversation, **kwargs):
        return self.tok.apply_chat_template([{"role": "assistant", "content": "hi"}, *conversation], **kwargs)


def test_chatml_added_to_a_base_model(mistral) -> None:
    card = card_with("tiny:mistral", chat_template="chatml")
    tok = load_tokenizer(mistral, card)
    base = load_tokenizer(mistral, card_with("tiny:mistral", format="plain"))
    assert len(tok) == len(base) + 2 and tok.eos_token == tok.pad_token == "<|im_end|>" and tok.bos_token == "<|im_start|>"
    assert prompt_text(tok, card.data.prompt, "x").endswith("<|im_start|>assistant\n")
    enc = encode_example(tok, card, "my orbit phone bill is wrong", ANSWER)
    assert enc.input_ids[-1] == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>") and enc.labels[-1] == enc.input_ids[-1]
    assert all(failed(tok, [enc, encode_example(tok, card, "hi", "ok")]).values())
    model = load_model(mistral, card, "cpu")
    first = model.get_input_embeddings().weight.detach().clone()
    assert first.shape[0] == len(tok) and model.get_output_embeddings().weight.shape[0] == len(tok)
    assert model.config.eos_token_id == tok.eos_token_id and model.generation_config.eos_token_id == tok.eos_token_id
    again = load_model(mistral, card, "cpu").get_input_embeddings().weight
    assert (first == again).all()  # the new rows are the same on every load (baseline, training, comparison)
    assert "chat (ChatML added" in render_page(tok, [("a", enc)])


def test_padding_check_catches_a_collator_that_masks_eos(tiny_model) -> None:
    """pad = EOS: the check pads as TRL's collator does; a label built by masking the pad id would drop the EOS."""
    card = card_with()
    tok = load_tokenizer(tiny_model, card)
    assert tok.pad_token_id == tok.eos_token_id
    short, long = encode_example(tok, card, "hi", "ok"), encode_example(tok, card, "my orbit phone bill", ANSWER)
    assert failed(tok, [short, long])["padding carries no loss, the EOS does (pad = EOS)"]
    short.labels = [IGNORE if t == tok.pad_token_id else label for t, label in zip(short.input_ids, short.labels)]
    result = failed(tok, [short, long])
    assert not result["padding carries no loss, the EOS does (pad = EOS)"]
    assert not result["completion ends with EOS and the EOS carries loss"]


def test_add_chatml_keeps_existing_tokens(tiny_model) -> None:
    """On a tokenizer that already has the ChatML tokens (tiny:llama), nothing is added: no new rows."""
    tok = load_tokenizer(tiny_model, card_with())
    n = len(tok)
    ids = add_chatml(tok)
    assert len(tok) == n and ids == tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
