"""Model FLOPs per trained token and the device's peak FLOP/s: the two sides of model FLOPs utilisation (MFU).

MFU (Chowdhery et al. 2022, PaLM, Appendix B) is the model's FLOPs per token × the tokens trained per second, over
the peak FLOP/s of the hardware. The model's FLOPs count each matrix multiply once (2 FLOPs per weight per token
forward), never the recomputation of activation checkpointing, and leave out the attention-score products (Q·Kᵀ,
scores·V), as the 6N rule does (Kaplan et al. 2020, §2.1). docs/cost.md states the convention and its sources.

- `forward_parameters`: N, the weights the forward multiplies by (embedding lookups excluded, the LM head included,
  tied or not), and how many of them train.
- `flops_per_token`: 2N forward + 2N activation gradients + 2N_trainable weight gradients = 6N for full training,
  4N + 6N_adapter for LoRA/QLoRA (N then counts the adapters too); DPO adds the reference model's forward.
- `peak_flops`: dense peak of one GPU from its spec sheet (TRL's table, `trl.trainer.utils.get_peak_flops`, with
  the GPUs it lacks in `EXTRA_PEAKS`); on the CPU a measured matrix-multiply rate (`measured_cpu_peak`).
"""

from __future__ import annotations

import functools
import math
import re
import time
from typing import Any

import torch
from trl.trainer.utils import get_peak_flops

# dense (no 2:4 sparsity) tensor-core peak FLOP/s with FP32 accumulation, for GPUs TRL 1.16's table lacks;
# TRL's covers T4, L4, A10/A10G, A100, H100 SXM/PCIe/NVL, H200, L40S, A6000, B200 and AMD MI250X/MI300X/MI355X
EXTRA_PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("V100S", {"float16": 130e12}),  # NVIDIA V100 datasheet (V100S PCIe)
    ("V100-PCIE", {"float16": 112e12}),  # NVIDIA V100 datasheet (PCIe)
    ("V100", {"float16": 125e12}),  # NVIDIA V100 datasheet (SXM2)
    ("RTX 4090", {"float16": 165.2e12, "bfloat16": 165.2e12}),  # NVIDIA Ada GPU architecture whitepaper, table 2
    ("RTX 3090", {"float16": 71e12, "bfloat16": 71e12}),  # NVIDIA Ampere GA102 GPU architecture whitepaper, table 9
)
PRECISION_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
CPU_MATMUL_SIZE = 1024  # the measured CPU peak: square matrices of this size (2·1024³ ≈ 2.1 GFLOP per product)


def _numel(param: Any) -> int:
    """A parameter's number of weights (a bitsandbytes 4-bit parameter stores two per byte: its quant_state knows;
    a ZeRO-3 partitioned one holds an empty local tensor: DeepSpeed's ds_numel counts the whole)."""
    if hasattr(param, "ds_numel"):
        return int(param.ds_numel)
    state = getattr(param, "quant_state", None)
    shape = getattr(state, "shape", None)
    return math.prod(shape) if shape is not None else param.numel()


def forward_parameters(model: Any) -> tuple[int, int]:
    """N and N_trainable: the weights the forward pass multiplies by, and those of them that train.

    Embedding tables are lookups (no FLOPs) and are left out, except the output head's weight when the input
    embedding shares it (tied): the head is a matrix multiply either way. Shared parameters count once.

    Args:
        model: the model being trained (PEFT- or otherwise wrapped).
    Returns:
        (N, N_trainable).
    """
    base = model.module if hasattr(model, "module") and isinstance(model, torch.nn.parallel.DistributedDataParallel) \
        else model
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    head_weight = id(head.weight) if head is not None and getattr(head, "weight", None) is not None else None
    lookups = {id(p) for m in base.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    total = trainable = 0
    seen: set[int] = set()
    for param in base.parameters():
        key = id(param)
        if key in seen or (key in lookups and key != head_weight):
            continue
        seen.add(key)
        total += _numel(param)
        trainable += _numel(param) if param.requires_grad else 0
    return total, trainable


def flops_per_token(parameters: int, trainable: int, reference_parameters: int = 0) -> float:
    """Model FLOPs of training on one token: 2N forward, 2N backward through the activations, 2N_trainable for the
    weight gradients (6N when every weight trains, 4N + 6N_adapter for LoRA), plus 2N_ref for a reference forward.

    Args:
        parameters: N (`forward_parameters`).
        trainable: N_trainable.
        reference_parameters: N of a reference model run forward on the same tokens (DPO), else 0.
    Returns:
        FLOPs per token.
    """
    return 4.0 * parameters + 2.0 * trainable + 2.0 * reference_parameters


def convention(parameters: int, trainable: int, reference_parameters: int = 0) -> str:
    """The FLOPs-per-token rule that applies, in words (recorded with the count)."""
    rule = "6N (full training)" if trainable >= parameters else "4N + 2N_trainable (adapters: 4N_base + 6N_adapter)"
    return rule + (" + 2N_ref (reference forward)" if reference_parameters else "") + \
        "; attention scores and recomputation excluded"


def gpu_peak(name: str, dtype: str) -> tuple[float, str] | None:
    """One GPU's dense peak FLOP/s for a dtype from its spec sheet (TRL's table, then `EXTRA_PEAKS`).

    Args:
        name: the device name as torch reports it ("NVIDIA H100 80GB HBM3", "Tesla T4").
        dtype: "bfloat16", "float16" or "float32".
    Returns:
        (FLOP/s, where the figure comes from), or None for a device or dtype no table has (float32 has none).
    """
    peak = get_peak_flops(name, dtype)
    if peak is not None:
        return float(peak), "spec sheet (trl.trainer.utils.get_peak_flops)"
    folded = name.casefold()
    for model, peaks in EXTRA_PEAKS:
        if re.search(rf"\b{re.escape(model.casefold())}\b", folded) and dtype in peaks:
            return peaks[dtype], "spec sheet (labkit.train.flops.EXTRA_PEAKS)"
    return None


@functools.lru_cache(maxsize=8)
def measured_cpu_peak(dtype: str = "float32", size: int = CPU_MATMUL_SIZE, repeats: int = 5,
                      threads: int | None = None) -> float:
    """The CPU's matrix-multiply rate in this process: the fastest of `repeats` products of two size × size matrices
    of `dtype` (after one warm-up), with torch's threads as they are; cached per process, dtype and thread count.

    Args:
        dtype: the dtype trained in ("float32" on the CPU).
        size: the matrices' size.
        repeats: products timed; the fastest counts (the least disturbed by other work on the machine).
        threads: torch's intra-op threads (part of the cache key only; default: torch.get_num_threads()).
    Returns:
        FLOP/s (2·size³ per product).
    """
    del threads  # the cache key: a process that changes its thread count measures again
    kind = getattr(torch, dtype)
    a, b = torch.randn(size, size, dtype=torch.float32).to(kind), torch.randn(size, size, dtype=torch.float32).to(kind)
    torch.matmul(a, b)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return 2.0 * size ** 3 / best


def peak_flops(device: Any, precision: str) -> tuple[float | None, str]:
    """The peak FLOP/s of the device this process trains on, and where it comes from.

    Args:
        device: the torch device ("cuda:0", "cpu", …).
        precision: the training precision ("bf16", "fp16", "fp32").
    Returns:
        (FLOP/s or None when unknown, the source in words).
    """
    device = torch.device(device)
    dtype = PRECISION_DTYPES.get(precision, "float32")
    if device.type == "cpu":
        threads = torch.get_num_threads()
        return measured_cpu_peak(dtype, threads=threads), \
            f"measured: fastest of 5 {dtype} {CPU_MATMUL_SIZE}×{CPU_MATMUL_SIZE} torch.matmul, {threads} threads"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        found = gpu_peak(name, dtype)
        if found is not None:
            return found[0], f"{name} {dtype} dense, {found[1]}"
        return None, f"{name} {dtype}: no spec-sheet peak known (MFU not computed)"
    return None, f"{device.type}: no peak known (MFU not computed)"
