"""Load the tokenizer and the model a card names, on the best device present.

The device is chosen for the machine the notebook runs on (CUDA or ROCm GPU, Apple MPS, else CPU), so the
same notebook runs on a laptop, Colab, Kaggle or a rented GPU; dtypes and the attention implementation are
`labkit.model.placement.decide`'s, read from the machine's device profile.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from typing import Any

from labkit.card.schema import Card
from labkit.core.device import DeviceProfile, capture
from labkit.errors import MethodError, ModelSourceError
from labkit.model.placement import Decisions, decide
from labkit.model.sources import ResolvedModel

# torch, transformers take seconds to import: imported inside the functions that use them, so `labkit` commands and
# card checks start fast

_PRINTED: set[str] = set()


def pick_device() -> str:
    """Return "cuda" when a GPU is present (NVIDIA or ROCm), "mps" on Apple silicon, else "cpu"."""
    return profile_of(None).device


@lru_cache(maxsize=4)
def profile_of(device: str | None) -> DeviceProfile:
    """The device profile of this machine for `device` ("cuda", "cuda:0", "cpu", "mps"; None: the best one)."""
    return capture(device.split(":")[0] if device else None)


def decisions(card: Card, device: str | None = None) -> Decisions:
    """`labkit.model.placement.decide` for this card on this machine's `device`; its notes are printed once."""
    made = decide(card, profile_of(device))
    for note in made.notes:
        if note not in _PRINTED:
            _PRINTED.add(note)
            print(f"note: {note}")
    return made


def pick_dtype(card: Card, device: str) -> Any:
    """The torch dtype the card's weights load in on `device` (`model.dtype: auto` resolved by the placement)."""
    import torch

    return getattr(torch, decisions(card, device).weight_dtype)


def load_tokenizer(resolved: ResolvedModel, card: Card) -> Any:
    """Load the tokenizer of the resolved model (pad token falls back to EOS).

    Args:
        resolved: the resolved model source.
        card: the card (for trust_remote_code).
    Returns:
        a transformers tokenizer with a pad token and a chat template.
    """
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            resolved.location, trust_remote_code=card.model.trust_remote_code, **resolved.from_pretrained_kwargs())
    except Exception as exc:  # noqa: BLE001
        raise ModelSourceError(f"{resolved.source}: tokenizer does not load ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if card.data.prompt.chat_template == "model" and not tokenizer.chat_template:
        raise ModelSourceError(f"{resolved.source}: the tokenizer has no chat template (data.prompt.chat_template: model needs one)")
    return tokenizer


def quantization_config(card: Card, device: str | None = None) -> Any:
    """The BitsAndBytesConfig of a qlora card, else None."""
    if card.method.kind != "qlora":
        return None
    if importlib.util.find_spec("bitsandbytes") is None:  # an optional dependency: the [gpu] extra
        raise MethodError("method.kind: qlora needs bitsandbytes, which is not installed: pip install 'labkit[gpu]' "
                          "(on a CUDA machine), or use method.kind: lora")
    import torch
    from transformers import BitsAndBytesConfig

    q = card.method.quantisation
    made = decisions(card, device)
    storage = {}
    if card.distributed.strategy == "fsdp":
        # FSDP shards flat tensors of one dtype: the packed 4-bit codes are stored in the weights' dtype
        storage = {"bnb_4bit_quant_storage": getattr(torch, made.weight_dtype)}
    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type=q.type, bnb_4bit_use_double_quant=q.double_quant,
        bnb_4bit_compute_dtype=getattr(torch, made.compute_dtype), **storage)


def baseline_quantize(card: Card) -> bool:
    """Whether the baseline loads the base model 4-bit: as training does, unless the card asks for it unquantised."""
    return card.method.kind == "qlora" and not card.method.quantisation.unquantised_baseline


def baseline_numerics(card: Card, device: str | DeviceProfile) -> dict[str, Any]:
    """What makes the baseline's numbers those of one numeric model: device type, weights' dtype, quantisation.

    Args:
        card: the card.
        device: this machine's device ("cuda", "cpu"), or a device profile.
    Returns:
        {"device", "dtype", "attention", "quantisation": {"type", "double_quant", "compute_dtype"} | None}.
    """
    made = decide(card, device, world_size=1, kernels={}) if isinstance(device, DeviceProfile) else decisions(card, device)
    quantised = baseline_quantize(card)
    q = card.method.quantisation if quantised else None
    return {"device": made.device, "dtype": made.weight_dtype, "attention": made.attention,
            "quantisation": None if q is None else {"type": q.type, "double_quant": q.double_quant,
                                                    "compute_dtype": made.compute_dtype}}


def load_model(resolved: ResolvedModel, card: Card, device: str | None = None, quantize: bool = True) -> Any:
    """Load the base model for causal LM, quantised when the card's method is qlora.

    Args:
        resolved: the resolved model source.
        card: the card (dtype, method, trust_remote_code).
        device: target device; picked when None.
        quantize: load in 4 bits for a qlora card (False to load the plain base, e.g. for the baseline).
    Returns:
        the model, in eval mode, on the device.
    """
    import torch
    from transformers import AutoModelForCausalLM

    device = device or pick_device()
    made = decisions(card, device)
    kwargs: dict[str, Any] = {"dtype": getattr(torch, made.weight_dtype), "attn_implementation": made.attention,
                              "trust_remote_code": card.model.trust_remote_code, **resolved.from_pretrained_kwargs()}
    qconfig = quantization_config(card, device) if quantize else None
    if qconfig is not None:
        kwargs.update(quantization_config=qconfig, device_map={"": device if device != "cuda" else 0})
    try:
        model = AutoModelForCausalLM.from_pretrained(resolved.location, **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise ModelSourceError(f"{resolved.source}: model does not load ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    if qconfig is None:
        model.to(device)
    model.eval()
    model.labkit_decisions = made.as_dict()
    return model
