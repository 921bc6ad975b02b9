"""The values autograd keeps per decoder layer and per token for the backward pass, by tensor, for the blocks the
memory estimate models (`labkit.preflight.memory.ARCHITECTURES`) and the attention kernel the model trains with.

SDPA (and the flash / flex kernels) keep the rotated queries, the keys and values, the output and one log-sum-exp per
head and position, plus the padding mask. Eager attention keeps the softmax's float32 output and the probabilities
it multiplies with the values: two (heads × sequence length) tensors per token, which at a few thousand tokens
outweigh the rest of the layer. labkit's eager attention with float32 scores (`labkit.model.attention`, Phi in
float16) also keeps float32 copies of the queries and keys. Counted with autograd's saved-tensor hooks on
transformers 5's attention functions.
"""

from __future__ import annotations

from typing import Any

from labkit.card.schema import Card
from labkit.model.attention import FP32_SCORES

EAGER = ("eager", FP32_SCORES)


def attention_units(shape: Any, attention: str, seq_len: int, padded: bool, act_bytes: int,
                    float32: bool = False) -> dict[str, float]:
    """Values the attention of one layer keeps per token (in `act_bytes` units).

    Args:
        shape: the model widths (`labkit.preflight.memory.Shape`).
        attention: the attn_implementation ("sdpa", "eager", `FP32_SCORES`, "flash_attention_2", …).
        seq_len: tokens per row (eager keeps a score per key position).
        padded: whether batches carry padding (SDPA repeats the GQA heads and keeps the mask).
        act_bytes: bytes of one activation value.
        float32: the attention computes in float32 (then the probabilities are the softmax's output, not a copy).
    Returns:
        {tensor: values per token per layer}.
    """
    h, a, kv = shape.hidden, shape.heads, shape.kv
    if attention not in EAGER:
        units = {"query after rotary": h, "attention output": h, "attention log-sum-exp": a,
                 "keys, values": 2 * h if padded else 2 * kv}
        if padded:
            units["padding mask"] = seq_len
        return units
    fp32 = 4 / act_bytes
    units = {"attention softmax (float32)": a * seq_len * fp32, "values (heads repeated)": h}
    if not float32:  # cast to the values' dtype for the product with the values: a second copy
        units["attention probabilities"] = a * seq_len
    if attention == FP32_SCORES:
        units["queries, keys (float32 copies)"] = 2 * h * fp32
    else:
        units["queries, keys"] = 2 * h
    return units


def eager_transient_bytes(shape: Any, attention: str, rows: int, seq_len: int) -> float:
    """The float32 score tensors eager attention builds and frees within one layer (the scores and, in the backward,
    their gradient): what the peak adds on top of the kept activations; 0 for fused kernels.

    Args:
        shape: the model widths.
        attention: the attn_implementation.
        rows: rows in the micro-batch.
        seq_len: tokens per row.
    Returns:
        bytes.
    """
    return 2 * 4 * rows * shape.heads * seq_len * seq_len if attention in EAGER else 0.0


def activation_units(shape: Shape, card: Card, params: dict[str, Any], seq_len: int, padded: bool = True,
                     block: str = "llama", attention: str = "sdpa", act_bytes: int = 2,
                     float32: bool = False) -> dict[str, float]:
    """Values autograd keeps per decoder layer and per token, by tensor (in activation-dtype units).

    Args:
        shape: model widths.
        card: the card (method: rank, dropout).
        params: from `parameter_bytes` (which linears carry adapters or train fully).
        seq_len: sequence length (the padding mask costs one value per key position).
        padded: whether batches carry padding (dynamic padding almost always does).
        block: "llama" (Llama, Mistral, Qwen2) or "phi" (`architecture`).
        attention: the attn_implementation the model trains with (`attention_units`).
        act_bytes: bytes of one activation value (the unit).
        float32: the attention computes in float32 (`attention_units`).
    Returns:
        {tensor: values per token per layer}.
    """
    h, i = shape.hidden, shape.intermediate
    adapted = set(params["adapted"])
    if block == "phi":
        # one LayerNorm (input, mean, rstd) feeds attention and the MLP in parallel; the tanh-GELU keeps fc1's output,
        # the tanh, ½x and 1 + tanh (counted with autograd's saved-tensor hooks on transformers 5's PhiDecoderLayer)
        units: dict[str, float] = {"layer input (LayerNorm)": h, "norm statistics": 2,
                                   "fc1 output, GELU": 4 * i}
        if adapted & {"q_proj", "k_proj", "v_proj", "fc1"}:
            units["normed input (q/k/v, fc1)"] = h
        if "dense" in adapted:
            units["attention output, reshaped (dense)"] = h
        if "fc2" in adapted:
            units["GELU output (fc2)"] = i
    else:
        units = {"layer input (norm)": h, "post-attention residual (norm)": h, "norm scales": 2,
                 "gate, SiLU, up": 3 * i}
        if adapted & {"q_proj", "k_proj", "v_proj"}:
            units["normed input (q/k/v)"] = h
        if adapted & {"gate_proj", "up_proj"}:
            units["normed input (gate/up)"] = h
        if "down_proj" in adapted:
            units["gated product (down)"] = i
    units.update(attention_units(shape, attention, seq_len, padded, act_bytes, float32))
    if params["norms_trainable"]:
        units["normalised, before the norm weight"] = 2 * h
    method = card.method
    if method.kind in {"lora", "qlora"}:
        units["LoRA A outputs"] = method.r * len(adapted)
        if method.dropout > 0:
            # each adapter has its own dropout: the dropped input and its mask (1 byte per value)
            units["LoRA dropout"] = sum(i if m in {"down_proj", "fc2"} else h for m in adapted) * 1.25
    return units
