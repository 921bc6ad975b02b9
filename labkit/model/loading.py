"""Load the tokenizer and the model a card names, on the best device present.

The device is chosen for the machine the notebook runs on (CUDA GPU, Apple MPS, else CPU), so the
same notebook runs on a laptop, Colab, Kaggle or a rented GPU.
"""

from __future__ import annotations

from typing import Any

from labkit.card.schema import Card
from labkit.errors import ModelSourceError
from labkit.model.sources import ResolvedModel

# torch, transformers take seconds to import: imported inside the functions that use them, so `labkit` commands and
# card checks start fast

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def pick_device() -> str:
    """Return "cuda" when a GPU is present, "mps" on Apple silicon, else "cpu"."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def pick_dtype(requested: str, device: str) -> Any:
    """Resolve the card's dtype ("auto" → bfloat16 on a GPU that supports it, else float32)."""
    import torch

    if requested == "auto":
        if device == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return getattr(torch, _DTYPES[requested])


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


def quantization_config(card: Card) -> Any:
    """The BitsAndBytesConfig of a qlora card, else None."""
    if card.method.kind != "qlora":
        return None
    import torch
    from transformers import BitsAndBytesConfig

    q = card.method.quantisation
    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type=q.type, bnb_4bit_use_double_quant=q.double_quant,
        bnb_4bit_compute_dtype=getattr(torch, q.compute_dtype))


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
    from transformers import AutoModelForCausalLM

    device = device or pick_device()
    dtype = pick_dtype(card.model.dtype, device)
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": card.model.trust_remote_code,
                              **resolved.from_pretrained_kwargs()}
    qconfig = quantization_config(card) if quantize else None
    if qconfig is not None:
        kwargs.update(quantization_config=qconfig, device_map={"": device if device != "cuda" else 0})
    try:
        model = AutoModelForCausalLM.from_pretrained(resolved.location, **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise ModelSourceError(f"{resolved.source}: model does not load ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    if qconfig is None:
        model.to(device)
    model.eval()
    return model
