"""What an export tells its user to run: the generation config and the model card's usage snippet.

Both follow the evaluation exactly:
- `generation_config.json`: greedy decoding, `eval.max_new_tokens`, and as `eos_token_id` the evaluation's stop list
  (`labkit.evaluate.generation.stop_ids`: the base's own stop ids and the tokenizer's EOS), so `generate` with the
  exported config alone stops where the evaluation stopped;
- the snippet renders the training prompt of the card's `data.prompt` (`labkit.data.prompting`): the chat template
  with the system message and the instruction, or the plain template filled in, tokenised as training tokenised it
  (one BOS), and passes the stop ids to `generate`. It names no path of the machine that exported: the weights are
  `adapter/` (or `model/`) relative to the export folder, the base is the hub id or labkit's source string.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from labkit.data.prompting import plain_prompt
from labkit.evaluate.generation import stop_ids
from labkit.export.publish import hub_base


def save_tokenizer_and_generation(adapter_dir: Path, card: Any, resolved: Any, dest: Path,
                                  max_new_tokens: int) -> tuple[Any, GenerationConfig]:
    """The run's tokenizer (as training saved it) and the evaluation's greedy generation config, saved into dest.

    Args:
        adapter_dir: the run's training/adapter folder (the tokenizer training saved).
        card: the card (trust_remote_code).
        resolved: the resolved base model (its generation_config.json, else its config's stop ids).
        dest: the folder to write.
        max_new_tokens: the evaluation's `eval.max_new_tokens`.
    Returns:
        (tokenizer, generation config).
    """
    tokenizer = AutoTokenizer.from_pretrained(str(adapter_dir), trust_remote_code=card.model.trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # as labkit.model.loading.load_tokenizer does
    tokenizer.save_pretrained(str(dest))
    kwargs = resolved.from_pretrained_kwargs()
    try:  # the base's own generation settings stay (the evaluation ran with them), decoding is made greedy
        generation = GenerationConfig.from_pretrained(resolved.location, **kwargs)
    except OSError:  # what from_pretrained gives a model without generation_config.json
        generation = GenerationConfig.from_model_config(
            AutoConfig.from_pretrained(resolved.location, trust_remote_code=card.model.trust_remote_code, **kwargs))
    stops = stop_ids(SimpleNamespace(generation_config=generation), tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    generation.update(do_sample=False, num_beams=1, temperature=None, top_p=None, top_k=None,
                      max_new_tokens=max_new_tokens, eos_token_id=stops, pad_token_id=pad)
    generation.save_pretrained(str(dest))
    return tokenizer, generation


def _base_lines(base: dict[str, Any], dtype: str, card: Any) -> list[str]:
    """Lines loading the base model as the evaluation did (its dtype; 4 bits for qlora)."""
    args = f"dtype=torch.{dtype}"
    lines = []
    if card.method.kind == "qlora":
        q = card.method.quantisation
        lines.append("from transformers import BitsAndBytesConfig")
        lines.append(f"quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type={q.type!r}, "
                     f"bnb_4bit_use_double_quant={q.double_quant!r}, bnb_4bit_compute_dtype=torch.{card.compute_dtype})")
        args += ", quantization_config=quant"
    hub = hub_base(base)
    if base.get("hf_repo"):
        lines.append(f"base = AutoModelForCausalLM.from_pretrained({base['hf_repo']!r}, revision={base['revision']!r}, {args})")
        return lines
    if hub:  # the same GGUF file on the Hub: transformers dequantises it as labkit did
        lines.append(f"# without labkit: AutoModelForCausalLM.from_pretrained({hub['hub_id']!r}, gguf_file={hub['gguf_file']!r}, "
                     f"revision={hub['revision']!r}, {args})")
    lines += ["from labkit.model.sources import resolve",
              f"base_dir = resolve({base['source']!r}, {base['revision']!r}).location  # checks the exact revision",
              f"base = AutoModelForCausalLM.from_pretrained(base_dir, {args})"]
    return lines


def prompt_lines(card: Any) -> list[str]:
    """Lines that turn `text` (a conversation card: `turns`) into `ids`, the training prompt's token ids
    (`labkit.data.prompting.prompt_ids`).

    Args:
        card: the card (`data.prompt`).
    Returns:
        the snippet's lines.
    """
    prompt = card.data.prompt
    if prompt.format == "plain":
        return [f"prompt = {plain_prompt(prompt, '{input}')!r}.replace('{{input}}', text)  # the plain training prompt",
                "ids = tokenizer(prompt)['input_ids']",
                "if tokenizer.bos_token_id is not None and ids[:2] == [tokenizer.bos_token_id] * 2:",
                "    ids = ids[1:]  # one BOS, as in training"]
    render = ("ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, "
              + "".join(f"{k}={v!r}, " for k, v in prompt.chat_template_kwargs.items())  # as in training
              + "return_dict=True)['input_ids'])")
    if prompt.conversation:
        return [*_conversation_lines(prompt), render]
    in_system = prompt.system and prompt.system_in == "system"
    system = [f"messages = [{{'role': 'system', 'content': {prompt.system.strip()!r}}}]"] if in_system else ["messages = []"]
    opening = f"{prompt.system.strip() + chr(10) * 2!r} + " if prompt.system and not in_system else ""  # system_in: user
    return [*system, f"messages.append({{'role': 'user', 'content': {opening}{prompt.instruction!r}.replace('{{input}}', text)}})",
            render]


def _conversation_lines(prompt: Any) -> list[str]:
    """`prompt_lines`' messages of a `conversation: true` card, from `turns` (the turns before the answer)."""
    lines = ["messages = [dict(turn) for turn in turns]"]
    if prompt.instruction != "{input}":  # the instruction wraps the last user turn
        lines.append(f"messages[-1]['content'] = {prompt.instruction!r}.replace('{{input}}', messages[-1]['content'])")
    system = prompt.system.strip() if prompt.system else ""
    if system and prompt.system_in == "system":
        return [*lines, f"messages.insert(0, {{'role': 'system', 'content': {system!r}}})"]
    if system:
        return [*lines, f"messages[0]['content'] = {system + chr(10) * 2!r} + messages[0]['content']"]
    if prompt.system_in == "user":  # the conversation's own system turn opens its first user turn, as in training
        return [*lines, "if messages[0]['role'] == 'system':",
                "    opening = messages.pop(0)['content']",
                "    messages[0]['content'] = opening + '\\n\\n' + messages[0]['content']"]
    return lines


def load_snippet(weights: str, base: dict[str, Any], card: Any, dtype: str,
                 stops: list[int], compute_dtype: str | None = None) -> list[str]:
    """The model card's usage snippet: load the export, render the training prompt, generate as the evaluation did.

    Args:
        weights: "adapter" or "model" (method full).
        base: labkit_base_model.json of the export.
        card: the card (prompt, method).
        dtype: the dtype the evaluation loaded the weights in.
        stops: the evaluation's stop ids (generation_config.json's eos_token_id).
        compute_dtype: the 4-bit compute dtype of a qlora card.
    Returns:
        the lines of Python; run as they are in the export folder (with `text` set, or `turns` for a conversation
        card), they print the evaluation's answer.
    """
    if weights == "model":
        load = [f"model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.{dtype}).eval()"]
    else:
        shown = SimpleNamespace(method=card.method, compute_dtype=compute_dtype)
        load = ["from peft import PeftModel", *_base_lines(base, dtype, shown),
                "model = PeftModel.from_pretrained(base, where).eval()"]
    return ["import torch", "from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig", "",
            f"where = {weights!r}  # in the export folder; once uploaded, your Hub repo's id", *load,
            "tokenizer = AutoTokenizer.from_pretrained(where)",
            "generation = GenerationConfig.from_pretrained(where)  # greedy, as evaluated",
            f"stop = {list(stops)!r}  # the evaluation's stop ids (generation_config.json's eos_token_id)",
            "turns = [{'role': 'user', 'content': 'your input here'}]  # the conversation, ending with the user's turn"
            if card.data.prompt.conversation else "text = 'your input here'", *prompt_lines(card),
            "inputs = {'input_ids': torch.tensor([ids]), 'attention_mask': torch.ones(1, len(ids), dtype=torch.long)}",
            "inputs = {k: v.to(model.device) for k, v in inputs.items()}",
            "out = model.generate(**inputs, generation_config=generation, eos_token_id=stop)",
            "print(tokenizer.decode(out[0, len(ids):], skip_special_tokens=True).strip())"]
