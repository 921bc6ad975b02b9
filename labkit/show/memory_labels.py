"""The display label of each identifier key of the memory estimate, and nowhere else.

`labkit.preflight.memory.estimate_step` keys its breakdown, phases and alternatives, and
`labkit.preflight.sizing.overheads` its GPU margins, by identifiers (`labkit.preflight.records`); the labels a
reader sees (`labkit estimate`, stage 03's table, the memory plot of `labkit.show.plots`) are here. This module
imports no model library, so the plots of the stages that never train load none.
"""

from __future__ import annotations

from labkit.preflight.records import OPTIMIZER_STATES_PREFIX, UPCAST_PREFIX

__all__ = ["LABELS", "SHORT", "label"]

LABELS = {
    # breakdown
    "weights_frozen": "weights (frozen)", "weights_4bit": "weights (4-bit)", "trainable_parameters": "trainable parameters",
    "gradients": "gradients", "optimizer_states": "optimiser states", "activations": "activations",
    "loss_head_buffers": "loss head buffers",
    # phases
    "end_of_forward": "end of forward", "start_of_backward": "start of backward (loss head)",
    "optimizer_update": "optimiser update", "reference_forward": "reference forward (no grad)",
    "recomputed_layer_backward": "backward of a recomputed layer",
    # alternatives
    "activations_plain": "activations, no checkpointing",
    "activations_checkpointed": "activations, checkpointing (+ one recomputed layer)",
    # what a phase holds (labkit.preflight.records.PHASE_TERMS)
    "loss_head_forward": "loss head, forward", "loss_head_backward": "loss head, backward",
    "layer_transient": "one layer's attention scores", "reference_layer": "one layer, reference forward",
    "recomputed_layer": "one layer, recomputed", "head_gradients": "loss head's gradients",
    # GPU margins (labkit.preflight.sizing.overheads)
    "fragmentation": "allocator fragmentation", "cuda_context": "CUDA context and kernels", "nccl_buffers": "NCCL buffers",
    "ddp_buckets": "DDP gradient buckets",
    # per GPU under a layout (labkit.preflight.layouts)
    "gathered_layer": "gathered layer (whole)",
    # the layouts (labkit.preflight.records.LAYOUTS)
    "single": "one process", "ddp": "ddp (replicated)", "fsdp": "fsdp (full shard)", "zero2": "deepspeed ZeRO-2",
    "zero3": "deepspeed ZeRO-3", "zero2_offload": "deepspeed ZeRO-2, optimiser offload to CPU",
    "zero3_offload": "deepspeed ZeRO-3, optimiser and weights offload to CPU",
}
SHORT = {"single": "one process", "ddp": "ddp", "fsdp": "fsdp", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
         "zero2_offload": "ZeRO-2 + CPU offload", "zero3_offload": "ZeRO-3 + CPU offload"}


def label(key: str) -> str:
    """The display label of a memory term's identifier (`optimizer_states_adamw_8bit` → "optimiser states, adamw_8bit").

    Args:
        key: an identifier of the estimate's breakdown, phases, alternatives or of the GPU margins.
    Returns:
        the label; an unknown key as it is.
    """
    if key in LABELS:
        return LABELS[key]
    if key.startswith(OPTIMIZER_STATES_PREFIX):
        return f"optimiser states, {key[len(OPTIMIZER_STATES_PREFIX):]}"
    if key.startswith(UPCAST_PREFIX):
        return f"weights (frozen), method.quantisation.upcast: {key[len(UPCAST_PREFIX):]}"
    return key
