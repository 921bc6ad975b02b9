"""Load the tokenizer and the model a card names, on the best device present.

The device is chosen for the machine the notebook runs on (CUDA or ROCm GPU, Apple MPS, else CPU), so the
same notebook runs on a laptop, Colab, Kaggle or a rented GPU; dtypes and the attention implementation are
`labkit.model.placement.decide`'s, read from the machine's device profile, then adjusted for the architecture
(`labkit.model.placement.for_architecture`: Phi in float16 gets eager attention with float32 scores).
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from typing import Any

import torch
from accelerate import init_empty_weights
from jinja2.exceptions import TemplateError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
from transformers.integrations import is_deepspeed_zero3_enabled, is_fsdp_enabled
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from labkit.card.experiment_and_data import Prompt
from labkit.card.schema import Card
from labkit.core.device import DeviceProfile, capture
from labkit.core.progress import task
from labkit.data.conversations import one_turn
from labkit.data.prompting import messages, render
from labkit.errors import CardError, MethodError, ModelSourceError
from labkit.model import attention
from labkit.model.placement import Decisions, decide, for_architecture
from labkit.model.sources import ResolvedModel


def pick_device() -> str:
    """Return "cuda" when a GPU is present (NVIDIA or ROCm), "mps" on Apple silicon, else "cpu"."""
    return profile_of(None).device


@lru_cache(maxsize=4)
def profile_of(device: str | None) -> DeviceProfile:
    """The device profile of this machine for `device` ("cuda", "cuda:0", "cpu", "mps"; None: the best one)."""
    return capture(device.split(":")[0] if device else None)


def decisions(card: Card, device: str | None = None) -> Decisions:
    """`labkit.model.placement.decide` for this card on this machine's `device`.

    Computed once per (card, device type, world size) in a process, and its notes printed then: the loader, the
    trainer and the memory checks of one stage all get the same decisions back.

    Args:
        card: the card.
        device: "cuda", "cuda:0", "cpu", "mps"; None: the best one present.
    Returns:
        the decisions.
    Raises:
        CardError: a card key that cannot work on this device.
    """
    return _decisions(card, (device or pick_device()).split(":")[0], int(os.environ.get("WORLD_SIZE", "1")))


@lru_cache(maxsize=16)
def _decisions(card: Card, device: str, world_size: int) -> Decisions:
    made = decide(card, profile_of(device), world_size=world_size)
    for note in made.notes:
        print(f"note: {note}")
    return made


def pick_dtype(card: Card, device: str) -> Any:
    """The torch dtype the card's weights load in on `device` (`model.dtype: auto` resolved by the placement)."""
    return getattr(torch, decisions(card, device).weight_dtype)


CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (  # TRL's former `setup_chat_format` ChatML template
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def add_chatml(tokenizer: Any) -> list[int]:
    """Give a tokenizer the ChatML format as TRL's `setup_chat_format` did (TRL 1.16 keeps only
    `clone_chat_template`, which needs a second tokenizer to copy from).

    <|im_start|> and <|im_end|> become special tokens (added when missing), BOS <|im_start|>, EOS and pad <|im_end|>,
    and the ChatML template. The model's embeddings follow with `resize_for_tokenizer`.

    Returns:
        the ids of the two ChatML tokens (the embedding and LM-head rows LoRA must train: `labkit.model.method`).
    """
    start, end = CHATML_TOKENS
    tokenizer.add_special_tokens({"additional_special_tokens": list(CHATML_TOKENS)})
    tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token = start, end, end
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer.convert_tokens_to_ids(list(CHATML_TOKENS))


def chatml_ids(card: Card, tokenizer: Any) -> list[int]:
    """The ChatML token ids of a `chat_template: chatml` card (empty for any other prompt format)."""
    prompt = card.data.prompt
    if prompt.format != "chat" or prompt.chat_template != "chatml":
        return []
    return tokenizer.convert_tokens_to_ids(list(CHATML_TOKENS))


def load_tokenizer(resolved: ResolvedModel, card: Card) -> Any:
    """Load the tokenizer of the resolved model, in the card's prompt format.

    The pad token falls back to EOS. `data.prompt.chat_template: chatml` adds ChatML (`add_chatml`);
    `chat_template: model` needs the tokenizer's own template; `format: plain` needs none.

    Args:
        resolved: the resolved model source.
        card: the card (prompt format, trust_remote_code).
    Returns:
        a transformers tokenizer with a pad token (and a chat template for format chat).
    Raises:
        ModelSourceError: the tokenizer does not load, has no chat template for `chat_template: model`, or its
            template refuses a user / assistant conversation.
        CardError: the template refuses the card's system message (`check_template`).
    """
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            resolved.location, trust_remote_code=card.model.trust_remote_code, **resolved.from_pretrained_kwargs())
    except Exception as exc:  # noqa: BLE001
        raise ModelSourceError(f"{resolved.source}: tokenizer does not load ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    prompt = card.data.prompt
    if prompt.format == "chat" and prompt.chat_template == "chatml":
        add_chatml(tokenizer)
    elif prompt.format == "chat" and not tokenizer.chat_template:
        raise ModelSourceError(
            f"{resolved.source}: the tokenizer has no chat template (data.prompt.chat_template: model needs one): "
            "set data.prompt.format: plain, or data.prompt.chat_template: chatml to add ChatML")
    if prompt.format == "chat":
        check_template(tokenizer, prompt, resolved.source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_template(tokenizer: Any, prompt: Prompt, source: str) -> None:
    """The chat template renders the card's conversation (a refusal the template raises itself, such as Gemma 2's
    "System role not supported", stops the run when the tokenizer loads, naming the key that fixes it).

    Args:
        tokenizer: the tokenizer, its chat template set.
        prompt: the card's `data.prompt` (format chat).
        source: the model source, for the message.
    Raises:
        CardError: the template refuses the system message (`data.prompt.system_in: user` places it).
        ModelSourceError: the template refuses a user / assistant conversation.
    """
    try:
        asked = one_turn("x") if prompt.conversation else "x"  # an input of the card's shape
        render(tokenizer, prompt, [*messages(prompt, asked), {"role": "assistant", "content": "y"}], tokenize=False)
    except TemplateError as exc:
        if prompt.system and prompt.system_in == "system":
            raise CardError(f"data.prompt.system: the chat template of {source} refuses a system message ({exc}); set "
                            "data.prompt.system_in: user (the text opens the user message) or remove "
                            "data.prompt.system") from None
        raise ModelSourceError(f"{source}: the chat template refuses a user / assistant conversation ({exc}); set "
                               "data.prompt.format: plain, or data.prompt.chat_template: chatml") from None


def resize_for_tokenizer(model: Any, card: Card, tokenizer: Any) -> None:
    """Grow the model's embeddings (and LM head) to the tokenizer of a `chat_template: chatml` card, and make the
    model's BOS / EOS / pad ids the tokenizer's, as TRL's `setup_chat_format` did.

    The new rows are transformers' mean resizing (drawn around the old rows' mean and covariance) under a fixed seed,
    so every load gives the same rows: the baseline, training and the comparison see one model. Nothing changes for
    other prompt formats, or when the embeddings already have a row for every token.
    """
    if not chatml_ids(card, tokenizer):
        return

    weight = model.get_input_embeddings().weight
    if len(tokenizer) > getattr(weight, "ds_shape", weight.shape)[0]:  # ZeRO-3: the partitioned weight's whole shape
        with torch.random.fork_rng():
            torch.manual_seed(0)  # on the meta device (an FSDP rank but 0) only the shape: rank 0's rows are broadcast
            model.resize_token_embeddings(len(tokenizer), mean_resizing=weight.device.type != "meta")
    model.labkit_trainable_tokens = chatml_ids(card, tokenizer)  # the rows LoRA trains (labkit.model.method)
    for config in (model.config.get_text_config(), getattr(model, "generation_config", None)):
        if config is not None:
            config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
            config.pad_token_id = tokenizer.pad_token_id


def quantization_config(card: Card, device: str | None = None) -> Any:
    """The BitsAndBytesConfig of a qlora card, else None.

    Under `distributed.strategy: fsdp` or DeepSpeed ZeRO-3 the 4-bit codes are stored in the weights' dtype
    (`bnb_4bit_quant_storage`), so they shard with the other weights.
    """
    if card.method.kind != "qlora":
        return None
    if importlib.util.find_spec("bitsandbytes") is None:  # an optional dependency: the [gpu] extra
        raise MethodError("method.kind: qlora needs bitsandbytes, which is not installed: pip install 'labkit[gpu]' "
                          "(on a CUDA machine), or use method.kind: lora")

    q = card.method.quantisation
    made = decisions(card, device)
    storage = {}
    d = card.distributed
    if d.strategy == "fsdp" or (d.strategy == "deepspeed" and d.zero_stage == 3):
        # FSDP and ZeRO-3 shard flat tensors of one dtype: the packed 4-bit codes are stored in the weights' dtype
        # (PEFT's FSDP-QLoRA and DeepSpeed-ZeRO-3-QLoRA recipes; accelerate 1.15 leaves uint8 codes out of FSDP2)
        storage = {"bnb_4bit_quant_storage": getattr(torch, made.weight_dtype)}
    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type=q.type, bnb_4bit_use_double_quant=q.double_quant,
        bnb_4bit_compute_dtype=getattr(torch, made.compute_dtype), **storage)


def baseline_quantize(card: Card) -> bool:
    """Whether the baseline loads the base model 4-bit: as training does, unless the card asks for it unquantised."""
    return card.method.kind == "qlora" and not card.method.quantisation.unquantised_baseline


def baseline_numerics(card: Card, device: str | DeviceProfile, model_type: str | None = None) -> dict[str, Any]:
    """What makes the baseline's numbers those of one numeric model: device type, weights' dtype, attention (as the
    architecture has it: `for_architecture`), quantisation.

    Args:
        card: the card.
        device: this machine's device ("cuda", "cpu"), or a device profile.
        model_type: the model config's model_type (Phi in float16 computes its attention scores in float32).
    Returns:
        {"device", "dtype", "attention", "quantisation": {"type", "double_quant", "compute_dtype"} | None}.
    """
    made = decide(card, device, world_size=1, kernels={}) if isinstance(device, DeviceProfile) else decisions(card, device)
    made = for_architecture(made, card, model_type)
    quantised = baseline_quantize(card)
    q = card.method.quantisation if quantised else None
    return {"device": made.device, "dtype": made.weight_dtype, "attention": made.attention,
            "quantisation": None if q is None else {"type": q.type, "double_quant": q.double_quant,
                                                    "compute_dtype": made.compute_dtype}}


def model_decisions(resolved: ResolvedModel, card: Card, device: str | None = None) -> Decisions:
    """`decisions` for this card on `device`, adjusted for the resolved model's architecture (its config's
    model_type: `labkit.model.placement.for_architecture`), the architecture's note printed.

    Args:
        resolved: the resolved model source (its config is read, not its weights).
        card: the card.
        device: "cuda", "cpu", …; None: the best one present.
    Returns:
        the decisions the model loads and trains with.
    Raises:
        CardError: an attention kernel the architecture cannot use at this precision.
        ModelSourceError: transformers does not load the model as a causal LM (`causal_lm_refusal`: a vision-language
            checkpoint), before its weights are read or downloaded.
    """
    made = decisions(card, device)
    try:
        config = AutoConfig.from_pretrained(resolved.location, trust_remote_code=card.model.trust_remote_code,
                                            **resolved.from_pretrained_kwargs())
    except Exception:  # noqa: BLE001 - from_pretrained reports an unloadable model with its cause
        return made
    refusal = causal_lm_refusal(config)
    if refusal is not None:
        raise ModelSourceError(f"model.source {resolved.source}: {refusal}")
    adjusted = for_architecture(made, card, getattr(config, "model_type", None))
    for note in adjusted.notes[len(made.notes):]:
        print(f"note: {note}")
    return adjusted


def causal_lm_refusal(config: Any) -> str | None:
    """Why transformers cannot build `config`'s model as a causal LM (`AutoModelForCausalLM`), or None when it can.

    Args:
        config: the base model's transformers config.
    Returns:
        None, or one clause naming the model type and the fix: a vision-language checkpoint (Mistral Small 3.1,
        Ministral 3: `mistral3`) whose text decoder is a causal LM is told to use a text-only copy of that decoder.
    """
    own = getattr(config, "auto_map", None) or {}  # the repository's own classes (model.trust_remote_code decides)
    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING or "AutoModelForCausalLM" in own:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    why = (f"its config is {config.model_type} ({type(config).__name__}), which transformers does not load as a causal "
           "LM (AutoModelForCausalLM)")
    if text is not config and type(text) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return why + f"; its text decoder ({text.model_type}) is one: point model.source at a text-only copy of it"
    return why + ": point model.source at a decoder-only language model"


def sharded_loading() -> str | None:
    """Which sharded loading transformers sees in this process: "fsdp" (`is_fsdp_enabled`: a process group, and
    accelerate's ACCELERATE_USE_FSDP and FSDP_CPU_RAM_EFFICIENT_LOADING), "zero3" (`is_deepspeed_zero3_enabled`: a live
    HfDeepSpeedConfig of stage 3), else None. `labkit.train.process_state.prepare` sets this up before the model loads.
    """
    return "fsdp" if is_fsdp_enabled() else "zero3" if is_deepspeed_zero3_enabled() else None


def _empty(resolved: ResolvedModel, kwargs: dict[str, Any]) -> Any:
    """The model with its parameters on the meta device and its buffers real (accelerate's `init_empty_weights`): what
    an FSDP rank other than 0 holds until FSDP broadcasts rank 0's weights (accelerate's `cpu_ram_efficient_loading`,
    which keeps each rank's non-persistent buffers, such as rotary frequencies)."""
    hub = {k: v for k, v in kwargs.items() if k not in ("dtype", "attn_implementation")}
    config = AutoConfig.from_pretrained(resolved.location, **hub)
    with init_empty_weights(include_buffers=False):
        return AutoModelForCausalLM.from_config(config, dtype=kwargs["dtype"], attn_implementation=kwargs["attn_implementation"],
                                                trust_remote_code=kwargs["trust_remote_code"])


def load_model(resolved: ResolvedModel, card: Card, device: str | None = None, quantize: bool = True) -> Any:
    """Load the base model for causal LM, quantised when the card's method is qlora.

    Args:
        resolved: the resolved model source.
        card: the card (dtype, method, trust_remote_code).
        device: target device; picked when None.
        quantize: load in 4 bits for a qlora card (False to load the plain base, e.g. for the baseline).
    Returns:
        the model, in eval mode, on the device; under FSDP's loading path (`sharded_loading`) every rank but 0 gets
            its parameters on the meta device (FSDP broadcasts rank 0's weights when the trainer prepares the model),
            and under FSDP or ZeRO-3 the model is not moved (no `device_map`, no `.to(device)`).
    """
    device = device or pick_device()
    made = model_decisions(resolved, card, device)
    if made.attention == attention.FP32_SCORES:
        attention.register()
    kwargs: dict[str, Any] = {"dtype": getattr(torch, made.weight_dtype), "attn_implementation": made.attention,
                              "trust_remote_code": card.model.trust_remote_code, **resolved.from_pretrained_kwargs()}
    qconfig = quantization_config(card, device) if quantize else None
    sharded = sharded_loading()
    if qconfig is not None and sharded is None:
        kwargs.update(quantization_config=qconfig, device_map={"": device if device != "cuda" else 0})
    elif qconfig is not None:  # bitsandbytes places it on this process's GPU (accelerate's PartialState set it)
        kwargs.update(quantization_config=qconfig)
    empty = sharded == "fsdp" and qconfig is None and torch.distributed.get_rank() != 0
    # a hub model is downloaded here on first use (into the hub cache): the event says so before the wait
    label = f"loading model {resolved.source}" + (" (from the hub cache, downloaded if missing)" if resolved.kind == "hf"
                                                 else "") + f" on {'meta (FSDP: rank 0 loads)' if empty else device}" + (
                                                     " in 4 bits" if qconfig else "")
    try:
        with task(label):
            model = _empty(resolved, kwargs) if empty else AutoModelForCausalLM.from_pretrained(resolved.location, **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise ModelSourceError(f"{resolved.source}: model does not load ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    if card.data.prompt.format == "chat" and card.data.prompt.chat_template == "chatml":
        resize_for_tokenizer(model, card, load_tokenizer(resolved, card))
    if qconfig is None and sharded is None:  # FSDP / ZeRO-3 place (and shard) the weights when the trainer prepares
        model.to(device)
    model.eval()
    model.labkit_decisions = made.as_dict()
    return model
