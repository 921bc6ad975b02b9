"""How much faster several data-parallel processes train a card: its optimiser steps and their seconds.

With P processes each optimiser step takes P micro-batches × grad_accum (the global batch is micro_batch ×
grad_accum × P), so an epoch has about 1/P of the single process's steps; each step costs what one process's step
costs, plus the gradients' all-reduce (ddp) or the weights' all-gather and the gradients' reduce-scatter (fsdp,
ZeRO). That communication is the scaling efficiency: stated here as an assumption (`EFFICIENCY_WITHIN_MACHINE`,
`EFFICIENCY_ACROSS_MACHINES`) until a run of the card at that many processes has measured its seconds per step.
A card with `train.max_steps` runs its steps whatever P is: the processes see P times the rows, not sooner.
"""

from __future__ import annotations

import math
from typing import Any

from labkit.card.schema import Card

EFFICIENCY_WITHIN_MACHINE = 0.9
"""Assumed: the share of P× one process's throughput that P processes on one machine reach (NVLink or PCIe); an
all-reduce of LoRA gradients is small, a full fine-tune's or FSDP's gathers cost more. Replaced by a measurement."""

EFFICIENCY_ACROSS_MACHINES = 0.8
"""Assumed: the same over several machines (the network between them, typically 25–400 Gbit/s, is the bottleneck)."""


def scaling_efficiency(processes: int, machines: int) -> float:
    """The assumed scaling efficiency of a layout: 1 for one process, else within or across machines.

    Args:
        processes: processes in all.
        machines: machines.
    Returns:
        the fraction of P× one process's throughput.
    """
    if processes <= 1:
        return 1.0
    return EFFICIENCY_ACROSS_MACHINES if machines > 1 else EFFICIENCY_WITHIN_MACHINE


def parallel_steps(card: Card, train_rows: int | None, processes: int) -> int | None:
    """Optimiser steps of the card's run with `processes` data-parallel processes.

    Args:
        card: the card (train.max_steps, micro_batch, grad_accum, epochs).
        train_rows: rows of the training split (None: unknown).
        processes: processes in all.
    Returns:
        the steps (train.max_steps when set), or None when the rows are unknown.
    """
    t = card.train
    if t.max_steps:
        return t.max_steps
    if not train_rows:
        return None
    return max(1, math.ceil(math.ceil(train_rows / (t.micro_batch * processes)) / t.grad_accum * (t.epochs or 1)))


def scaled(seconds_per_step: float, processes: int, machines: int,
           measured_at: int | None = None) -> dict[str, Any]:
    """Seconds per optimiser step under P processes, from one measured at `measured_at` processes (1: one process).

    Args:
        seconds_per_step: the measured seconds per step.
        processes, machines: the layout planned.
        measured_at: the processes of the measurement (None or 1: one process).
    Returns:
        {"seconds_per_step", "efficiency", "efficiency_source": "measured" | "assumed" | "single process"}.
    """
    if processes <= 1:
        return {"seconds_per_step": seconds_per_step, "efficiency": 1.0, "efficiency_source": "single process"}
    if measured_at == processes:
        return {"seconds_per_step": seconds_per_step, "efficiency": None, "efficiency_source": "measured"}
    efficiency = scaling_efficiency(processes, machines)
    return {"seconds_per_step": seconds_per_step / efficiency, "efficiency": efficiency,
            "efficiency_source": "assumed"}
