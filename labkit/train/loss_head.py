"""The SFT loss scored on the completion positions only, where TRL's fused LM head has no kernel.

TRL's SFTTrainer computes the loss with a chunked "fused" LM head. On CUDA/XPU its Triton kernel
projects only the positions that carry a loss. Elsewhere (the CPU, Apple's MPS) it falls back to
torch operations over every position of the batch — prompt and padding included — although
usually fewer than a fifth of them carry a loss, so the LM head and its softmax over the whole
vocabulary dominate a CPU step. There, labkit's trainer gathers the hidden states of the scored
positions before the LM head (a forward pre-hook on the model's output embedding, active only
inside `compute_loss`) and lets the model's own loss function (`ForCausalLMLoss`, given the
matching `shift_labels`) score them: the same loss, the same normalisation
(`num_items_in_batch`), through the model's own forward — so DDP and PEFT wrappers stay in the
path. tests/unit/train/test_loss_head.py checks loss and gradients against TRL's path.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.utils import is_triton_available
from trl import SFTTrainer

from labkit.data.prompting import IGNORE
from labkit.train.token_count import CountedBatches


def scores_completion_only_natively(device: Any) -> bool:
    """Whether TRL's fused LM head already scores only the completion positions on `device` (Triton devices).

    Args:
        device: a torch.device or a device string.
    Returns:
        True on CUDA/XPU with Triton available, False on the CPU, MPS and devices without Triton.
    """
    return torch.device(device).type in ("cuda", "xpu") and is_triton_available()


class CompletionSFTTrainer(CountedBatches, SFTTrainer):
    """TRL's SFTTrainer, whose loss projects only the positions that carry a loss when TRL's kernel cannot (and whose
    batches `labkit.train.token_count` counts)."""

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        """The completion-only causal LM loss of one micro-batch (TRL's own path on Triton devices).

        Args:
            model: the (possibly DDP-wrapped) model.
            inputs: the collated batch (input_ids, labels, attention_mask, optional position_ids).
            return_outputs: also return the model outputs (their logits cover the scored positions only).
            num_items_in_batch: loss tokens of the whole accumulated batch (None: this micro-batch's mean).
        Returns:
            the loss, or (loss, outputs).
        """
        labels = inputs.get("labels")
        if labels is None or scores_completion_only_natively(labels.device):
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        shifted = labels[:, 1:]
        scored = shifted != IGNORE
        if num_items_in_batch is None and not bool(scored.any()):  # a mean over no token: TRL's path returns 0
            return super().compute_loss(model, inputs, return_outputs=return_outputs)
        head = self.accelerator.unwrap_model(model).get_output_embeddings()

        def gather_scored(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
            hidden = args[0]
            if hidden.dim() != 3 or tuple(hidden.shape[:2]) != tuple(labels.shape):
                raise RuntimeError(
                    f"labkit's completion-only loss expected the LM head's input to be the hidden states of every "
                    f"position {tuple(labels.shape)}, got {tuple(hidden.shape)}: this model's forward calls its "
                    "head differently; train it on a device where TRL's fused kernel runs, or report the model")
            return (hidden[:, :-1][scored].unsqueeze(0),) + tuple(args[1:])

        handle = head.register_forward_pre_hook(gather_scored)
        router = {"output_router_logits": True} if getattr(self, "aux_loss_enabled", False) else {}
        try:
            outputs = model(**{k: v for k, v in inputs.items() if k != "labels"}, labels=labels,
                            shift_labels=shifted[scored].unsqueeze(0), num_items_in_batch=num_items_in_batch,
                            use_cache=False, **router)
        finally:
            handle.remove()
        loss, aux = outputs.loss, getattr(outputs, "aux_loss", None) if router else None
        if aux is not None:  # the model's forward added its load-balancing term to its loss: weighted below as TRL does
            loss = loss - _forward_coefficient(self.accelerator.unwrap_model(model), self.router_aux_loss_coef) * aux
        # as TRL's path: with num_items_in_batch counting every rank's tokens, DDP's gradient average is undone
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * self.accelerator.num_processes
        if aux is not None:  # a mixture of experts' load-balancing loss, a per-micro-batch mean: averaged over the
            # accumulated micro-batches (as in TRL's path) and, by DDP's gradient average, over the ranks
            steps = self.current_gradient_accumulation_steps if num_items_in_batch is not None else 1
            loss = loss + self.router_aux_loss_coef * aux / steps
        return (loss, outputs) if return_outputs else loss


def _forward_coefficient(model: Any, default: float) -> float:
    """The load-balancing coefficient a mixture of experts' forward adds its aux loss with (set when the model was
    built; TRL's `router_aux_loss_coef` only reaches its config)."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    coef = getattr(model, "router_aux_loss_coef", None)
    return default if coef is None else float(coef)
