"""Stage 03's sizing report: estimates against measurements, the fit verdict, training time and cost.

The arithmetic lives in `labkit.preflight.memory` (estimate) and `labkit.preflight.measure` (measurement); this module
puts them side by side for the notebook and writes them as data.
"""

from __future__ import annotations

import gc
import math
import tempfile
from pathlib import Path
from typing import Any, Callable

from labkit.card.schema import Card
from labkit.model.method import apply_method
from labkit.preflight.measure import measure_step
from labkit.preflight.memory import GIB

# torch takes seconds to import: imported inside the functions that use them, so `labkit` commands and card checks
# start fast


def representative_lengths(lengths: dict[str, Any], max_length: int) -> dict[str, int]:
    """The p95 and the max of the tokenised training lengths (from stage 02's lengths.json), capped at max_length."""
    train = lengths["train"]
    return {"p95": min(int(train["p95"]), max_length), "max": min(int(train["max"]), max_length)}


def model_factory(stage: Any) -> Callable[[], Any]:
    """A function returning a freshly loaded model with the card's method applied (same init each call)."""
    return lambda: apply_method(stage.load_model(), stage.card)


def loaded_bytes(model: Any) -> int:
    """Bytes of a loaded model's parameters and buffers (4-bit weights at their packed size)."""
    seen, total = set(), 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        key = tensor.data_ptr()
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


def measure(stage: Any, rows: list[dict[str, Any]], seq_len: int) -> dict[str, Any]:
    """Two real steps of the stage-04 trainer at `seq_len` on a freshly loaded model, measured.

    Returns:
        `labkit.preflight.measure.measure_step`'s result plus "weights_bytes" (counted) and "peak_bytes" (weights + step).
    """
    gc.collect()
    model = model_factory(stage)()
    weights = loaded_bytes(model)
    result = measure_step(stage.card, model, stage.tokenizer, rows, seq_len, Path(tempfile.mkdtemp(prefix="labkit-mem-")),
                          device=stage.device)
    del model
    gc.collect()
    return {**result, "weights_bytes": weights, "peak_bytes": weights + result["memory"]["delta_bytes"]}


def compare(estimates: list[dict[str, Any]], measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Estimate against measurement per sequence length: the step's memory above the weights, and the peak.

    Args:
        estimates: `labkit.preflight.memory.estimate_step` results, one per length.
        measured: `measure` results at the same lengths.
    Returns:
        one row per length; errors are relative, (estimate − measured) / measured.
    """
    rows = []
    for est, got in zip(estimates, measured):
        step = got["memory"]["delta_bytes"]
        rows.append({"seq_len": est["seq_len"], "micro_batch": est["micro_batch"],
                     "weights_gib_estimated": est["weights_bytes"] / GIB, "weights_gib_loaded": got["weights_bytes"] / GIB,
                     "step_gib_estimated": est["step_bytes"] / GIB, "step_gib_measured": step / GIB,
                     "step_error": (est["step_bytes"] - step) / step if step else None,
                     "peak_gib_estimated": est["peak_bytes"] / GIB, "peak_gib_measured": got["peak_bytes"] / GIB,
                     "peak_error": (est["peak_bytes"] - got["peak_bytes"]) / got["peak_bytes"],
                     "seconds_per_step": got["seconds_per_step"], "measured_by": got["memory"]["method"]})
    return rows


def breakdown_rows(estimates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The estimate's terms (GiB) per sequence length, and the phase that sets the peak."""
    rows = []
    for term in estimates[0]["breakdown"]:
        rows.append({"term": term, **{f"{e['seq_len']} tokens": e["breakdown"][term] / GIB for e in estimates}})
    for phase in estimates[0]["phases"]:
        rows.append({"term": f"phase: {phase} (above weights and optimiser states)",
                     **{f"{e['seq_len']} tokens": e["phases"][phase] / GIB for e in estimates}})
    rows.append({"term": "PEAK (weights + optimiser states + largest phase)",
                 **{f"{e['seq_len']} tokens": e["peak_bytes"] / GIB for e in estimates}})
    for term in estimates[0]["alternatives"]:
        rows.append({"term": f"alternative: {term}", **{f"{e['seq_len']} tokens": e["alternatives"][term] / GIB for e in estimates}})
    rows.append({"term": "alternative: full logits, log-softmax and its gradient (an unfused loss)",
                 **{f"{e['seq_len']} tokens": e["unfused_logits_bytes"] / GIB for e in estimates}})
    return rows


def free_memory(device: str) -> int:
    """Bytes free for training on the device (CUDA: free device memory; CPU: available system memory)."""
    from labkit.preflight.measure import free_device_memory

    return free_device_memory(device)


def time_and_cost(card: Card, train_rows: int, seconds_per_step: float) -> dict[str, Any]:
    """Training time from the measured step time (at the p95 length, so an upper bound) and its rental cost.

    Returns:
        {"steps", "seconds_per_step", "hours", "cost", "within_budget"}.
    """
    t = card.train
    steps = t.max_steps or math.ceil(math.ceil(train_rows / t.micro_batch) / t.grad_accum * (t.epochs or 1))
    seconds = steps * seconds_per_step * t.grad_accum
    hours = seconds / 3600
    return {"steps": steps, "seconds_per_step": seconds_per_step * t.grad_accum, "hours": hours,
            "cost": hours * card.budget.price_per_gpu_hour, "within_budget": seconds <= card.budget.max_minutes * 60}


def failures(update: dict[str, Any], accumulation: dict[str, Any], checkpointing: dict[str, Any],
             verdict: dict[str, Any]) -> list[str]:
    """What stops the run here: a failed update, accumulation or checkpointing check, or a step that does not fit."""
    out = [f"update check: {p}" for p in update["problems"]]
    if not accumulation["ok"]:
        fix = ("set train.loss_normalisation: tokens" if accumulation.get("trainer", "sft") == "sft" else
               f"TRL's {accumulation['trainer']} loss should not depend on how a batch is split: report it")
        out.append(f"gradient accumulation ({accumulation['loss_normalisation']} normalisation): gradients differ "
                   f"by {accumulation['relative_difference']:.2e} from one batch of {accumulation['micro_batch'] * accumulation['accum']} "
                   f"(tolerance {accumulation['tolerance']:.0e}); {fix}")
    out += [f"activation checkpointing: {p}" for p in checkpointing["problems"]]
    if not verdict["fits"]:
        out.append(f"memory: {verdict['message']}")
    return out
