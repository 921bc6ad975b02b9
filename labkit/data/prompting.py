"""One source of truth for what the model sees: messages, tokens and where the loss is computed.

The same functions build the prompt for training, evaluation and inference, so the prompt a model
is trained on is token for token the prompt it is evaluated with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jinja2.exceptions import TemplateError

from labkit.card.schema import Card
from labkit.card.experiment_and_data import Prompt
from labkit.data import conversations
from labkit.errors import DataError

IGNORE = -100


def _asked(prompt: Prompt, text: str) -> list[dict[str, str]]:
    """The turns of one input, ending with the user's: the input through `instruction`, or (`conversation: true`) the
    row's turns with `instruction` around the last (`labkit.data.conversations`)."""
    if not prompt.conversation:
        return [{"role": "user", "content": prompt.instruction.replace("{input}", text)}]
    *before, last = conversations.turns(text)
    return [*before, {"role": "user", "content": prompt.instruction.replace("{input}", last["content"])}]


def messages(prompt: Prompt, text: str, shots: Sequence[tuple[str, str]] = ()) -> list[dict[str, str]]:
    """Chat messages of the prompt for one input.

    Args:
        prompt: the card's `data.prompt`: its `system` text (or a conversation's own system turn) is a system message,
            or (`system_in: user`) opens the first user message, followed by a blank line, for templates without a
            system role.
        text: the input text (`conversation: true`: the JSON text of the turns before the answer).
        shots: (input, answer) pairs shown first as earlier turns (a few-shot baseline prompt).
    Returns:
        the messages, ending with the user message of `text`.
    """
    asked = _asked(prompt, text)
    system = prompt.system.strip() if prompt.system else ""
    if asked[0]["role"] == "system":  # a conversation's own (never beside the card's: conversations.read_conversation)
        system, asked = asked[0]["content"], asked[1:]
    out: list[dict[str, str]] = []
    for given, answer in shots:
        out += [turn for turn in _asked(prompt, given) if turn["role"] != "system"]
        out.append({"role": "assistant", "content": answer})
    out += asked
    if system and prompt.system_in == "system":
        out.insert(0, {"role": "system", "content": system})
    elif system:
        out[0] = {**out[0], "content": f"{system}\n\n{out[0]['content']}"}
    return out


def plain_prompt(prompt: Prompt, text: str) -> str:
    """The prompt text of `data.prompt.format: plain`: the template with {system} and {instruction} filled.

    Without a system text, `{system}` is removed together with the blank line that follows it
    (`"{system}\n\n"`), so the default template gives `### Instruction:\n<instruction>\n\n### Response:\n`.

    Args:
        prompt: the card's `data.prompt`.
        text: the input text.
    Returns:
        the prompt text.
    """
    template = prompt.plain_template
    system = (prompt.system or "").strip()
    if not system:
        template = template.replace("{system}\n\n", "").replace("{system}", "")
    instruction = prompt.instruction.replace("{input}", text)
    return template.replace("{system}", system).replace("{instruction}", instruction)


def render(tokenizer: Any, prompt: Prompt, conversation: list[dict[str, str]], **kwargs: Any) -> Any:
    """`tokenizer.apply_chat_template` of a conversation with the card's `data.prompt.chat_template_kwargs` (every
    render of the chat template goes through here, so the prompt and the answer see the same variables)."""
    return tokenizer.apply_chat_template(conversation, **prompt.chat_template_kwargs, **kwargs)


def _ids(encoded: Any) -> list[int]:
    """apply_chat_template(tokenize=True) returns a list or a BatchEncoding depending on the version."""
    if isinstance(encoded, dict) or hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    return list(encoded)


def _plain_ids(tokenizer: Any, text: str) -> list[int]:
    """Tokens of plain text, with the tokenizer's own BOS when it adds one (never twice)."""
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    bos = tokenizer.bos_token_id
    if bos is not None and len(ids) > 1 and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]
    return ids


def prompt_ids(tokenizer: Any, card: Card, text: str) -> list[int]:
    """Token ids of the prompt, ending with the assistant header or the response marker (what generation starts from)."""
    prompt = card.data.prompt
    if prompt.format == "plain":
        return _plain_ids(tokenizer, plain_prompt(prompt, text))
    return _ids(render(tokenizer, prompt, messages(prompt, text), add_generation_prompt=True, tokenize=True))


def prompt_text(tokenizer: Any, prompt: Prompt, text: str) -> str:
    """The prompt as text after the chat template (or the plain template), for the card's `data.prompt`."""
    if prompt.format == "plain":
        return plain_prompt(prompt, text)
    return render(tokenizer, prompt, messages(prompt, text), add_generation_prompt=True, tokenize=False)


def format_name(prompt: Prompt) -> str:
    """The prompt format (`data.prompt`) in words, as stage 02 shows it: `chat (model's template)`, `chat (ChatML
    added)`, `plain`; with `loss_on: every_answer`, that too."""
    if prompt.format == "plain":
        return "plain (template + EOS after the answer)"
    name = "chat (ChatML added to the tokenizer)" if prompt.chat_template == "chatml" else "chat (the model's template)"
    return name + (", the loss on every answer of the conversation" if prompt.loss_on == "every_answer" else "")


@dataclass
class Encoded:
    """A tokenised training example.

    Attributes:
        input_ids: prompt + completion tokens (ending at EOS, possibly truncated).
        labels: IGNORE on prompt tokens, the token id where the loss is computed (`loss_on: every_answer`: the
            conversation's earlier answers too).
        prompt_len: number of prompt tokens.
        full_len: length before truncation.
        truncated: whether max_length cut the example.
        prefix_ok: whether the prompt alone is a token prefix of prompt+completion.
        prompt_format: the prompt format in words (`format_name`), shown with the rendered samples.
        before_answer: the text the chat template writes between the prompt and the answer ("" when the answer follows
            the prompt; None when the answer's text is not found in the completion, e.g. a template that rewrites it).
    """

    input_ids: list[int]
    labels: list[int]
    prompt_len: int
    full_len: int
    truncated: bool
    prefix_ok: bool
    prompt_format: str = ""
    before_answer: str | None = ""

    @property
    def loss_tokens(self) -> int:
        return sum(label != IGNORE for label in self.labels)

    @property
    def last_answer_labels(self) -> list[int]:
        """The labels with the loss on the last answer alone (what `loss_on: last_answer` encodes)."""
        return [IGNORE] * min(self.prompt_len, len(self.labels)) + self.labels[self.prompt_len:]


def encode_example(tokenizer: Any, card: Card, text: str, target: str) -> Encoded:
    """Tokenise prompt + completion in the card's prompt format; loss on the completion only.

    format chat: the chat template renders the conversation; the sequence ends at the completion's EOS
    (template text after it, such as a trailing newline, is dropped: the model never generates past EOS).
    format plain: the plain prompt followed by the answer, tokenised as one text, then EOS appended.
    `conversation: true` with `loss_on: every_answer`: the same tokens, the earlier assistant turns carrying loss too.

    Args:
        tokenizer: the model's tokenizer.
        card: the card (prompt settings, max_length).
        text: the input text.
        target: the reference answer.
    Returns:
        Encoded.
    """
    if card.data.prompt.format == "plain":
        prompt = prompt_ids(tokenizer, card, text)
        full = _plain_ids(tokenizer, plain_prompt(card.data.prompt, text) + target)
    else:
        convo = messages(card.data.prompt, text) + [{"role": "assistant", "content": target}]
        try:
            prompt = prompt_ids(tokenizer, card, text)
            full = _ids(render(tokenizer, card.data.prompt, convo, tokenize=True))
        except TemplateError as exc:  # a conversation's turns (a card's own are checked when the tokenizer loads)
            fix = (": a system turn under a template without a system role takes data.prompt.system_in: user"
                   if convo[0]["role"] == "system" else "")
            raise DataError(f"the chat template refuses the conversation {'/'.join(t['role'] for t in convo)} "
                            f"({exc}){fix}") from None
    prefix_ok = full[: len(prompt)] == prompt
    before = _before_answer(tokenizer, full[len(prompt):], target) if prefix_ok and card.data.prompt.format == "chat" else ""
    eos = tokenizer.eos_token_id
    positions = [i for i in range(len(prompt), len(full)) if full[i] == eos]
    if positions:
        full = full[: positions[-1] + 1]
    elif eos is not None:
        full = full + [eos]  # a template without EOS after the answer: add it so generation learns to stop
    labels = [IGNORE] * len(prompt) + full[len(prompt):]
    if card.data.prompt.loss_on == "every_answer" and prefix_ok:
        for start, end in _earlier_answers(tokenizer, card.data.prompt, convo, full):
            labels[start:end] = full[start:end]
    full_len = len(full)
    limit = card.data.max_length
    return Encoded(input_ids=full[:limit], labels=labels[:limit], prompt_len=len(prompt), full_len=full_len,
                   truncated=full_len > limit, prefix_ok=prefix_ok,
                   prompt_format=format_name(card.data.prompt), before_answer=before)


def _earlier_answers(tokenizer: Any, prompt: Prompt, convo: list[dict[str, str]],
                     full: list[int]) -> list[tuple[int, int]]:
    """Where the assistant turns before the last lie in `full` (the tokens of `convo`): per turn, from the end of the
    turns before it with the assistant header (what generation starts from) to its end token (`loss_on:
    every_answer`).

    Args:
        tokenizer: the model's tokenizer.
        prompt: the card's `data.prompt`.
        convo: the rendered messages, ending with the last answer.
        full: their token ids.
    Returns:
        [start, end) token positions per earlier assistant turn.
    Raises:
        DataError: the template renders an earlier turn differently once later turns follow (so the tokens the model
            would generate for it are not the ones in the conversation).
    """
    eos, spans = tokenizer.eos_token_id, []
    for at in [at for at, turn in enumerate(convo[:-1]) if turn["role"] == "assistant"]:
        start = _ids(render(tokenizer, prompt, convo[:at], add_generation_prompt=True, tokenize=True))
        through = _ids(render(tokenizer, prompt, convo[: at + 1], tokenize=True))
        if full[: len(start)] != start or full[: len(through)] != through:
            raise DataError(f"data.prompt.loss_on: every_answer: the chat template renders the conversation's answer "
                            f"{len(spans) + 1} differently once later turns follow it (Qwen3's drops an earlier "
                            "answer's think block, Mistral's moves the system text to the last user turn), so what "
                            "the model would see and generate there is not in the conversation; set "
                            "data.prompt.loss_on: last_answer")
        ends = [i for i in range(len(start), len(through)) if full[i] == eos]
        spans.append((len(start), ends[-1] + 1 if ends else len(through)))
    return spans


def _before_answer(tokenizer: Any, completion: list[int], target: str) -> str | None:
    """What the rendered completion holds before the answer's text (Qwen3's template writes an empty think block
    there), or None when the answer's text is not in it."""
    text, answer = tokenizer.decode(completion), target.strip()
    at = text.find(answer) if answer else 0
    return text[:at] if at >= 0 else None


def encode_rows(tokenizer: Any, card: Card, rows: list[dict[str, Any]]) -> list[Encoded]:
    """Encode prepared rows (each with `input` and `target`)."""
    return [encode_example(tokenizer, card, r["input"], r["target"]) for r in rows]


def padding_check(tokenizer: Any, encoded: list[Encoded]) -> tuple[bool, list[int]]:
    """Whether padding is masked and the EOS keeps its loss in a batch padded by the SFT trainer's collator.

    With pad ≠ EOS nothing can mix them up. With pad = EOS (a common fallback) the shortest and the longest
    example are padded together by TRL's `DataCollatorForLanguageModeling`, as training pads them: every
    padded position must carry no loss and no attention, and the shorter example's EOS must keep its loss.

    Returns:
        (ok, indices of the examples that failed).
    """
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    usable = [i for i, e in enumerate(encoded) if not e.truncated and e.input_ids]
    if pad != eos or len(usable) < 2:
        return True, []
    # late: trl's SFT module loads peft, bitsandbytes and accelerate (seconds; bitsandbytes logs as it loads), and
    # only a tokenizer whose pad is its EOS needs the collator; data preparation (`labkit check --data`) stays light
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    short = min(usable, key=lambda i: len(encoded[i].input_ids))
    long = max(usable, key=lambda i: len(encoded[i].input_ids))
    if len(encoded[short].input_ids) == len(encoded[long].input_ids):
        return True, []
    batch = DataCollatorForLanguageModeling(pad_token_id=pad)(
        [{"input_ids": encoded[i].input_ids, "labels": encoded[i].labels} for i in (short, long)])
    n = len(encoded[short].input_ids)
    labels, mask = batch["labels"][0].tolist(), batch["attention_mask"][0].tolist()
    # TRL pads on the right: the real tokens first, then the padding
    ok = (labels[:n] == encoded[short].labels and all(x == IGNORE for x in labels[n:])
          and all(mask[:n]) and not any(mask[n:]) and labels[n - 1] == eos)
    return ok, [] if ok else [short]


def check_encoded(tokenizer: Any, rows: list[dict[str, Any]], encoded: list[Encoded]) -> list[dict[str, Any]]:
    """Checks that catch the common template/mask bugs, per row, for every prompt format.

    Args:
        tokenizer: the tokenizer (for the EOS, BOS and pad ids).
        rows: prepared rows (with `id`).
        encoded: their encodings.
    Returns:
        a list of {"check", "ok", "failed_ids", "explanation"}.
    """
    eos, bos = tokenizer.eos_token_id, tokenizer.bos_token_id
    no_loss, no_eos, not_prefix, truncated, two_bos, inserted = [], [], [], [], [], {}
    for row, enc in zip(rows, encoded, strict=True):
        if enc.loss_tokens == 0:
            no_loss.append(row["id"])
        if not enc.truncated and (enc.input_ids[-1] != eos or enc.labels[-1] != eos):
            no_eos.append(row["id"])
        if not enc.prefix_ok:
            not_prefix.append(row["id"])
        if enc.truncated:
            truncated.append(row["id"])
        if bos is not None and enc.input_ids[:2] == [bos, bos]:
            two_bos.append(row["id"])
        if enc.before_answer and enc.before_answer.strip():
            inserted[row["id"]] = enc.before_answer
    pad_ok, pad_failed = padding_check(tokenizer, encoded)
    same = "pad = EOS" if tokenizer.pad_token_id == eos else "pad ≠ EOS"
    return [
        {"check": "every example has loss positions", "ok": not no_loss, "failed_ids": no_loss,
         "explanation": "an example with no completion tokens teaches nothing: an empty answer, or a prompt that fills "
                        "data.max_length (raise max_length, or drop such rows: data.cleaning {drop_longer_than_tokens: N})"},
        {"check": "completion ends with EOS and the EOS carries loss", "ok": not no_eos, "failed_ids": no_eos,
         "explanation": "without a trained EOS the model does not learn to stop and rambles at inference"},
        {"check": "prompt alone is a token prefix of prompt + completion", "ok": not not_prefix, "failed_ids": not_prefix,
         "explanation": "otherwise the model is trained on a context it never sees at inference"},
        {"check": "no example truncated by max_length", "ok": not truncated, "failed_ids": truncated,
         "explanation": "a truncated completion loses its EOS and part of the answer; raise max_length or drop long rows "
                        "(data.cleaning {drop_longer_than_tokens: N}: stage 02 plots the lengths)"},
        {"check": "the answer follows the prompt directly", "ok": not inserted, "failed_ids": list(inserted),
         "explanation": (f"the chat template writes {next(iter(inserted.values()))!r} between the prompt and the answer: "
                         "the model learns to generate it before every answer, and the evaluation reads it as part of "
                         "the answer; for Qwen3's empty think block set data.prompt.chat_template_kwargs: "
                         "{enable_thinking: false}, which moves it into the prompt") if inserted else
                        "the completion after the prompt is the answer, then its end token"},
        {"check": "BOS appears once at the start", "ok": not two_bos, "failed_ids": two_bos,
         "explanation": "the template writes a BOS and the tokenizer adds another: the model sees a doubled BOS it was "
                        "never pre-trained on"},
        {"check": f"padding carries no loss, the EOS does ({same})", "ok": pad_ok,
         "failed_ids": [rows[i]["id"] for i in pad_failed],
         "explanation": "with pad = EOS a collator that masks the pad id also masks the EOS: the model never learns "
                        "to stop"},
    ]
