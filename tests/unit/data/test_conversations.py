"""Conversations as inputs (`data.prompt.conversation: true`): the turns are read and checked at their row, rendered
through the chat template as they are with the loss on the answer alone, compared as text by the leakage search, and
the export's snippet renders the same prompt."""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.data.conversations import read_conversation, spoken, transcript
from labkit.data.prompting import IGNORE, encode_example, messages, prompt_ids
from labkit.data.sources import map_fields
from labkit.errors import CardError, DataError

SYSTEM = {"role": "system", "content": "You are the support desk."}
CHAT = [{"role": "user", "content": "I ordered a lamp, order 4821."},
        {"role": "assistant", "content": "Found order 4821. How can I help?"},
        {"role": "user", "content": "When will it arrive?"},
        {"role": "assistant", "content": "Your lamp (order 4821) arrives on Friday."}]


@pytest.fixture(scope="module")
def card():
    smoke = load_card(REPO / "params" / "smoke.yaml").card
    return updated(smoke, {"data.prompt.conversation": True, "data.prompt.system": None,
                           "data.prompt.instruction": "{input}", "data.fields.input": "messages",
                           "data.fields.target": "messages"})


def test_the_last_turn_is_the_answer_and_the_turns_before_it_the_input() -> None:
    text, answer = read_conversation([SYSTEM, *CHAT], "chats.jsonl:1", "messages", True, False)
    assert answer == "Your lamp (order 4821) arrives on Friday." and json.loads(text) == [SYSTEM, *CHAT[:3]]
    text, answer = read_conversation(CHAT[:3], "chats.jsonl:1", "messages", False, False)  # the answer in its own column
    assert answer is None and json.loads(text) == CHAT[:3]
    assert transcript(text).splitlines()[0] == "user: I ordered a lamp, order 4821."
    assert spoken(text) == "\n".join(turn["content"] for turn in CHAT[:3])


@pytest.mark.parametrize(("turns", "answer_last", "card_system", "message"), [
    ("hello", True, False, "is not a conversation .* got str; map a conversation column"),
    ([{"role": "tool", "content": "{}"}, *CHAT], True, False, "turn 1 has role 'tool'; labkit reads system, user, assistant"),
    ([{"role": "user", "content": 7}], False, False, "turn 1's content is int, not text"),
    ([SYSTEM, *CHAT], True, True, "opens with its own system turn and data.prompt.system is set too"),
    (CHAT[:3], True, False, "the last turn is the user's, and data.fields.target names this column too"),
    (CHAT, False, False, "must end with the user's \\(they end with the assistant's\\)"),
    ([SYSTEM, CHAT[1], *CHAT], True, False, "turn 2 is the assistant's where the user's comes"),
    ([SYSTEM, CHAT[-1]], True, False, "must end with the user's \\(they end with no user turn\\)"),
])
def test_a_bad_conversation_is_refused_at_its_row(turns, answer_last, card_system, message) -> None:
    with pytest.raises(DataError, match=rf"^chats\.jsonl:4: field 'messages' \(data\.fields\.input, data\.prompt\."
                                        rf"conversation: true\).*{message}"):
        read_conversation(turns, "chats.jsonl:4", "messages", answer_last, card_system)


def test_rows_map_from_a_messages_column(card) -> None:
    rows = map_fields(card.data, [{"id": "a", "messages": [SYSTEM, *CHAT], "category": "c", "__where__": "chats.jsonl:1"}])
    assert rows[0]["target"] == CHAT[-1]["content"] and json.loads(rows[0]["input"]) == [SYSTEM, *CHAT[:3]]
    own = updated(card, {"data.fields.target": "answer"})  # the answer in a column of its own
    rows = map_fields(own.data, [{"id": "a", "messages": CHAT[:3], "answer": "Friday.", "category": "c"}])
    assert rows[0]["target"] == "Friday." and json.loads(rows[0]["input"]) == CHAT[:3]
    with pytest.raises(DataError, match="data.fields.target\\) holds a conversation .* the answer is text"):
        map_fields(own.data, [{"id": "a", "messages": CHAT[:3], "answer": CHAT, "category": "c"}])


def test_the_turns_go_through_the_template_with_the_loss_on_the_answer_alone(card, tiny_model) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model.location)
    wrapped = updated(card, {"data.prompt.instruction": "Answer briefly.\n{input}"})
    text = json.dumps(CHAT[:3])
    assert messages(wrapped.data.prompt, text) == [*CHAT[:2], {"role": "user", "content": "Answer briefly.\nWhen will it "
                                                                                          "arrive?"}]
    encoded = encode_example(tok, wrapped, text, CHAT[-1]["content"])
    rendered = tok.decode(encoded.input_ids[:encoded.prompt_len])
    assert all(turn["content"].split("\n")[-1] in rendered for turn in CHAT[:3]) and encoded.prefix_ok
    answer = [t for t, label in zip(encoded.input_ids, encoded.labels) if label != IGNORE]
    assert tok.decode(answer, skip_special_tokens=True) == CHAT[-1]["content"]  # the earlier answer carries no loss
    assert prompt_ids(tok, wrapped, text) == encoded.input_ids[:encoded.prompt_len]


def test_a_system_turn_opens_the_first_user_turn_where_the_template_has_no_system_role(card) -> None:
    folded = messages(updated(card, {"data.prompt.system_in": "user"}).data.prompt, json.dumps([SYSTEM, *CHAT[:3]]))
    assert folded[0] == {"role": "user", "content": f"{SYSTEM['content']}\n\n{CHAT[0]['content']}"} and len(folded) == 3
    carded = messages(updated(card, {"data.prompt.system": "Be brief."}).data.prompt, json.dumps(CHAT[:3]))
    assert carded[0] == {"role": "system", "content": "Be brief."} and carded[1:] == CHAT[:3]
    shots = messages(card.data.prompt, json.dumps(CHAT[2:3]), shots=[(json.dumps([SYSTEM, CHAT[0]]), "Noted.")])
    assert shots == [CHAT[0], {"role": "assistant", "content": "Noted."}, CHAT[2]]  # a shot's system turn is left out


def test_a_conversation_needs_the_chat_format(tmp_path) -> None:
    path = tmp_path / "card.yaml"
    path.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\nexperiment: {{variant: plain}}\n"
                    "data: {prompt: {format: plain, conversation: true, system: null}}\n")
    with pytest.raises(CardError, match="conversation: true needs format: chat"):
        load_card(path)


def _said(*contents: str) -> list[dict[str, str]]:
    return [{"role": ("user", "assistant")[i % 2], "content": text} for i, text in enumerate(contents)]


def test_the_leakage_search_compares_what_is_said_not_the_json(card, tiny_model, tmp_path) -> None:
    """Two short conversations share their JSON keys and roles: as JSON text they are 0.67 alike, as what is said
    0.44; at a threshold of 0.6 they are not a pair, and a copy of one (case and spacing aside) is."""
    from labkit.data.prepare import checked_splits
    from labkit.model.loading import load_tokenizer

    lamp = _said("hi", "hello, how can I help?", "my lamp, order 12", "checking", "when does it come?", "Friday.")
    kettle = _said("hi", "hello, how can I help?", "my kettle, order 98", "checking", "when does it come?", "Monday.")
    others = [_said(f"question {i} about topic {i * 7}", f"answer {i}", f"more on {i}", f"reply {i}") for i in range(6)]
    rows = [(lamp, "train"), (kettle, "validation"), *((c, "train") for c in others[:4]), (others[4], "validation"),
            (others[5], "test")]
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"id": f"c{i}", "messages": c, "category": "a", "split": split}) + "\n"
                            for i, (c, split) in enumerate(rows)))
    text_card = updated(card, {"data.source": {"path": str(data)}, "data.split": {"field": "split"},
                               "data.target_format": {"kind": "text"}, "data.leakage.near_duplicate_threshold": 0.6,
                               "experiment.target.primary_metric": "rougeL", "experiment.guardrails": []})
    tokenizer = load_tokenizer(tiny_model, text_card)
    derived, _ = checked_splits(text_card, tokenizer)
    assert derived.leakage["cross_split_pairs"] == 0 and len(derived.splits["validation"]) == 2
    copy = [{**turn, "content": turn["content"].upper().replace(" ", "  ")} for turn in lamp]
    data.write_text(data.read_text() + json.dumps({"id": "copy", "messages": copy, "category": "a", "split": "test"}))
    derived, _ = checked_splits(text_card, tokenizer)
    assert derived.leakage["cross_split_pairs"] == 1


def test_a_system_turn_the_template_refuses_names_the_fix(card) -> None:
    from labkit.model.loading import load_tokenizer
    from labkit.model.sources import resolve

    gemma = updated(card, {"model.source": "tiny:gemma2"})
    tokenizer = load_tokenizer(resolve("tiny:gemma2"), gemma)
    with pytest.raises(DataError, match=r"^the chat template refuses the conversation system/user/assistant/user/"
                                        r"assistant \(System role not supported\): .* data\.prompt\.system_in: user$"):
        encode_example(tokenizer, gemma, json.dumps([SYSTEM, *CHAT[:3]]), CHAT[-1]["content"])
    user = updated(gemma, {"data.prompt.system_in": "user"})
    encoded = encode_example(tokenizer, user, json.dumps([SYSTEM, *CHAT[:3]]), CHAT[-1]["content"])
    assert SYSTEM["content"] in tokenizer.decode(encoded.input_ids) and encoded.prefix_ok


def test_a_baseline_template_gets_the_turns_as_text_and_few_shot_turns_stay_turns(card, tiny_model) -> None:
    from transformers import AutoTokenizer

    from labkit.card.baseline_prompts import FewShotPrompt, TemplatePrompt
    from labkit.data.prompting import render
    from labkit.data.prompting_baseline import baseline_prompt_ids

    tok = AutoTokenizer.from_pretrained(tiny_model.location)
    text = json.dumps(CHAT[:3])
    ids = baseline_prompt_ids(tok, card, TemplatePrompt(template="Chat:\n{input}\nassistant:"), text)
    assert tok.decode(ids, skip_special_tokens=True).endswith("user: When will it arrive?\nassistant:")
    shot = {"input": json.dumps(CHAT[2:3]), "target": "Friday."}
    ids = baseline_prompt_ids(tok, card, FewShotPrompt(few_shot=1), text, [shot])
    expected = [CHAT[2], {"role": "assistant", "content": "Friday."}, *CHAT[:3]]
    assert ids == list(render(tok, card.data.prompt, expected, add_generation_prompt=True, tokenize=True,
                              return_dict=True)["input_ids"])


def _loss_spans(tokenizer, encoded) -> list[str]:
    spans, run = [], []
    for token, label in [*zip(encoded.input_ids, encoded.labels), (None, IGNORE)]:
        if label != IGNORE:
            run.append(token)
        elif run:
            spans, run = [*spans, tokenizer.decode(run)], []
    return spans


@pytest.mark.parametrize(("model", "extra", "end"), [
    ("tiny:llama", {}, "<|im_end|>"),  # ChatML, the end token is the EOS
    ("tiny:gemma2", {"data.prompt.system_in": "user"}, "<end_of_turn>\n"),  # a stop token that is not the EOS
    ("tiny:mistral", {"data.prompt.chat_template": "chatml"}, "<|im_end|>"),  # ChatML added to a base model
])
def test_every_answer_puts_the_loss_on_each_assistant_turn_in_the_same_tokens(card, model, extra, end) -> None:
    from labkit.model.loading import load_tokenizer
    from labkit.model.sources import resolve

    last = updated(card, {"model.source": model, **extra})
    every = updated(last, {"data.prompt.loss_on": "every_answer"})
    tokenizer = load_tokenizer(resolve(model), every)
    chat = [*CHAT, {"role": "user", "content": "Can it come sooner?"},
            {"role": "assistant", "content": "Yes: Thursday, for a fee."}]
    text = json.dumps([SYSTEM, *chat[:-1]])
    once, each = (encode_example(tokenizer, c, text, chat[-1]["content"]) for c in (last, every))
    assert each.input_ids == once.input_ids and each.prompt_len == once.prompt_len and each.prefix_ok
    assert each.prompt_format.endswith(", the loss on every answer of the conversation")
    answers = [turn["content"] for turn in chat if turn["role"] == "assistant"]
    spans = _loss_spans(tokenizer, each)
    assert spans[:-1] == [answer + end for answer in answers[:-1]], spans  # each earlier answer and its end token
    assert spans[-1] == _loss_spans(tokenizer, once)[0] and spans[-1].startswith(answers[-1])
    assert [label for label in each.labels[once.prompt_len:]] == once.labels[once.prompt_len:]


def test_every_answer_is_refused_where_the_template_rewrites_an_earlier_answer(card) -> None:
    """Qwen3's template drops the think block of an answer once a later user turn follows it: the earlier answer as
    trained would not be what the model sees or generates at that turn."""
    from labkit.model.loading import load_tokenizer
    from labkit.model.sources import resolve

    qwen3 = updated(card, {"model.source": "tiny:qwen3", "data.prompt.chat_template_kwargs": {"enable_thinking": False},
                           "data.prompt.loss_on": "every_answer"})
    tokenizer = load_tokenizer(resolve("tiny:qwen3"), qwen3)
    with pytest.raises(DataError, match=r"^data\.prompt\.loss_on: every_answer: the chat template renders the "
                                        r"conversation's answer 1 differently .* set data\.prompt\.loss_on: last_answer$"):
        encode_example(tokenizer, qwen3, json.dumps(CHAT[:3]), CHAT[-1]["content"])
    one = encode_example(tokenizer, qwen3, json.dumps(CHAT[:1]), CHAT[1]["content"])  # no earlier answer: nothing to find
    assert one.loss_tokens == encode_example(tokenizer, updated(qwen3, {"data.prompt.loss_on": "last_answer"}),
                                             json.dumps(CHAT[:1]), CHAT[1]["content"]).loss_tokens


def test_every_answer_needs_a_conversation(tmp_path) -> None:
    path = tmp_path / "card.yaml"
    path.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\nexperiment: {{variant: every}}\n"
                    "data: {prompt: {loss_on: every_answer}}\n")
    with pytest.raises(CardError, match=r"card\.yaml:3: .*loss_on: every_answer needs conversation: true"):
        load_card(path)


def test_an_every_answer_variant_shares_its_siblings_data_version_and_protocol(tmp_path, tiny_model) -> None:
    """The rows and prompts evaluated are the same: only the training labels differ (recorded in the manifest)."""
    from labkit.core import runs as R
    from labkit.core.protocol import protocol_changes
    from labkit.data.prepare import prepare
    from labkit.model.loading import load_tokenizer

    manifests, resolved = {}, {}
    for name in ("support-chat.yaml", "support-chat-every-answer.yaml"):
        path = tmp_path / name
        path.write_text(f"parent: {REPO / 'params' / 'examples' / name}\n"
                        "model: {source: 'tiny:llama', dtype: float32}\n")
        loaded = load_card(path)
        run = R.new_run(loaded, tmp_path / "runs")
        manifests[name] = prepare(loaded.card, run, load_tokenizer(tiny_model, loaded.card), tiny_model.revision)
        resolved[name] = loaded.resolved
    last, every = manifests.values()
    assert last["data_version"] == every["data_version"] and last["split"] == every["split"]
    assert last["tokenised_sha256"]["train"] != every["tokenised_sha256"]["train"]
    sections = [{"data": card["data"]} for card in resolved.values()]
    assert sections[0]["data"]["prompt"]["loss_on"] != sections[1]["data"]["prompt"]["loss_on"]
    assert protocol_changes(*sections) == {}
