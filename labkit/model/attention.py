"""Eager attention with float32 scores: what the Phi architecture needs in float16.

Phi-2's queries and keys reach a few hundred, so their dot products overflow float16 (65504) and the logits turn NaN
(transformers issues 28163, 28673; its 4.37 Phi attention upcast the queries and keys for this). transformers 5.24's
Phi `eager_attention_forward` computes `query @ key` in the model's dtype and upcasts only the softmax, after the
overflow; its sdpa, flash and flex kernels compute in float16 too. `eager_fp32_scores` computes the scores and the
softmax in float32 (autocast off, so fp16 mixed precision cannot cast them back) and multiplies the probabilities with
the values in the values' dtype. It is registered with transformers' `AttentionInterface` (and the eager mask with
`AttentionMaskInterface`) under `FP32_SCORES`, the `attn_implementation` that `labkit.model.placement.for_architecture`
decides for Phi in float16.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv
from transformers.masking_utils import AttentionMaskInterface, eager_mask

FP32_SCORES = "labkit_eager_fp32"


def eager_fp32_scores(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
                      **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' eager attention with `query @ key` and the softmax in float32.

    Args:
        module: the attention module (its `num_key_value_groups`, `training`).
        query: (batch, heads, q_len, head_dim).
        key: (batch, kv_heads, kv_len, head_dim).
        value: (batch, kv_heads, kv_len, head_dim).
        attention_mask: the additive (float) or boolean 4D mask, or None.
        scaling: the scores' scale (1/sqrt(head_dim)).
        dropout: attention dropout probability (training only).
        kwargs: the rest of transformers' attention arguments (unused).
    Returns:
        (output (batch, q_len, heads, head_dim) in the values' dtype, attention probabilities).
    """
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    with torch.autocast(device_type=query.device.type, enabled=False):
        scores = torch.matmul(query.float(), key.float().transpose(2, 3)) * scaling
        if attention_mask is not None:
            mask = attention_mask[:, :, :, : key.shape[-2]]
            if mask.dtype == torch.bool:
                scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
            else:
                scores = scores + mask.float()
        probabilities = torch.softmax(scores, dim=-1).to(value.dtype)
        probabilities = torch.nn.functional.dropout(probabilities, p=dropout, training=module.training)
        output = torch.matmul(probabilities, value)
    return output.transpose(1, 2).contiguous(), probabilities


def register() -> str:
    """Register `eager_fp32_scores` (and the eager mask) with transformers under `FP32_SCORES`; idempotent.

    Returns:
        the `attn_implementation` name to load a model with.
    """
    AttentionInterface.register(FP32_SCORES, eager_fp32_scores)
    AttentionMaskInterface.register(FP32_SCORES, eager_mask)
    return FP32_SCORES
