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
    """Two real steps of the stage-04 trainer at `seq_len` on a freshly loaded model, measured, and one evaluation
    batch of real validation rows (`eval.batch_size` of them) timed as stage 04's validation passes run it.

    Returns:
        `labkit.preflight.measure.measure_step`'s result plus "weights_bytes" (counted) and "peak_bytes" (weights + step).
    """
    gc.collect()
    model = model_factory(stage)()
    weights = loaded_bytes(model)
    result = measure_step(stage.card, model, stage.tokenizer, rows, seq_len, Path(tempfile.mkdtemp(prefix="labkit-mem-")),
                          device=stage.device, eval_rows=stage.split("validation")[:stage.card.eval.batch_size])
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


def token_lengths(tokenizer: Any, card: Card, rows: list[dict[str, Any]]) -> list[int]:
    """Tokens of each prepared row as the trainer sees it (prompt + completion, cut at data.max_length)."""
    from labkit.data.prompting import encode_rows

    return [min(len(e.input_ids), card.data.max_length) for e in encode_rows(tokenizer, card, rows)]


def row_lengths(card: Card, lengths: list[int]) -> list[int]:
    """The lengths of the rows the trainer batches: the examples, or the packed rows (stage 04's packer) when
    train.packing."""
    if not card.train.packing:
        return list(lengths)
    from labkit.train.packing import pack

    return [len(r["input_ids"]) for r in pack([{"input_ids": [1] * n, "labels": [1] * n} for n in lengths],
                                              card.data.max_length)]


def packed_lengths(card: Card, lengths: list[int]) -> dict[str, int]:
    """The p95 and the max of the rows the trainer batches (packed rows when train.packing): the lengths stage 03
    measures a step at."""
    rows = sorted(row_lengths(card, lengths))
    return {"p95": rows[min(len(rows) - 1, int(0.95 * len(rows)))], "max": rows[-1]}


def _micro_seconds(measured: list[dict[str, Any]]) -> Callable[[float], float]:
    """Seconds of one micro-batch's forward and backward at a padded length L: a line through the measured steps."""
    points = sorted({(m["seq_len"], m["seconds_per_step"] / m.get("grad_accum", 1)) for m in measured
                     if m.get("seconds_per_step")})
    if not points:
        raise ValueError("no measured step time: stage 03's measurement did not run")
    (l0, s0), (l1, s1) = points[0], points[-1]
    if l1 == l0 or s1 <= s0:
        return lambda length: s1 * length / l1  # one length measured (or no growth seen): proportional
    slope = (s1 - s0) / (l1 - l0)
    return lambda length: max(s0 + slope * (length - l0), s0 * length / l0 * 0.5)


def time_plan(card: Card, train_lengths: list[int], validation_lengths: list[int],
              measured: list[dict[str, Any]]) -> dict[str, Any]:
    """Training time predicted from the measured steps: the trainer's batches replayed, evaluation passes included.

    The rows the trainer batches (packed rows when train.packing) are shuffled as one epoch would be, cut into
    micro-batches padded to their longest row, and each micro-batch costs the measured step time at that length
    (a line through the measurements at two lengths); the first step costs what the measured first step took more
    than the second (the optimiser states are allocated). Validation-loss passes (every train.eval_steps steps, as
    stage 04 schedules them) cost what stage 03's timed evaluation batch took per padded token, for every batch of
    eval.batch_size validation rows (packed rows when train.packing) padded to its longest row; without a timed
    evaluation (DPO / ORPO), a third of a training micro-batch at the same length.

    Args:
        card: the card.
        train_lengths: tokens of each training example (`token_lengths`).
        validation_lengths: tokens of each validation example.
        measured: stage 03's measurements (`measure`), each with seq_len, seconds_per_step and grad_accum.
    Returns:
        {"steps", "rows_per_epoch", "examples_per_step", "seconds_per_step", "train_seconds" (training + evaluation:
         what the trainer's train_runtime measures), "evaluations", "evaluation_seconds", "hours", "cost",
         "within_budget", "train_tokens" (tokens per epoch), "packed"}.
    """
    import random

    t = card.train
    per_micro = _micro_seconds(measured)
    rows = row_lengths(card, train_lengths)
    micro_per_epoch = math.ceil(len(rows) / t.micro_batch)
    per_epoch = max(1, math.ceil(micro_per_epoch / t.grad_accum))
    steps = t.max_steps or math.ceil(per_epoch * (t.epochs or 1))
    # an epoch's last optimiser step takes the micro-batches that are left
    micro_total = steps * t.grad_accum if t.max_steps else math.ceil(micro_per_epoch * (t.epochs or 1))
    rng = random.Random(t.seed)
    seconds, micro_done = 0.0, 0
    while micro_done < micro_total:
        order = rows[:]
        rng.shuffle(order)
        for i in range(0, len(order), t.micro_batch):
            if micro_done >= micro_total:
                break
            seconds += per_micro(max(order[i:i + t.micro_batch]))
            micro_done += 1
    eval_steps = t.eval_steps or max(1, (t.max_steps or math.ceil(math.ceil(len(train_lengths) / t.micro_batch)
                                                                   / t.grad_accum * (t.epochs or 1))) // 4)
    evaluations = steps // eval_steps if validation_lengths else 0
    ordered = row_lengths(card, validation_lengths)
    batch = card.eval.batch_size
    timed = [m for m in measured if m.get("eval_seconds") and m.get("eval_tokens")]
    if timed:
        per_token = sum(m["eval_seconds"] for m in timed) / sum(m["eval_tokens"] for m in timed)
        one_pass = sum(per_token * len(ordered[i:i + batch]) * max(ordered[i:i + batch])
                       for i in range(0, len(ordered), batch))
    else:
        one_pass = sum(per_micro(max(ordered[i:i + batch])) * len(ordered[i:i + batch]) / t.micro_batch / 3
                       for i in range(0, len(ordered), batch))
    first = next((m["step_seconds"] for m in measured if len(m.get("step_seconds") or []) > 1), None)
    warmup = max(0.0, first[0] - first[-1]) if first else 0.0  # the first step allocates the optimiser states
    total = seconds + warmup + evaluations * one_pass
    hours = total / 3600
    return {"steps": steps, "rows_per_epoch": len(rows), "examples_per_step": len(train_lengths) / per_epoch,
            "seconds_per_step": seconds / steps, "train_seconds": total, "evaluations": evaluations,
            "evaluation_seconds": evaluations * one_pass, "hours": hours,
            "cost": hours * card.budget.price_per_gpu_hour * card.distributed.num_processes,
            "within_budget": total <= card.budget.max_minutes * 60, "train_tokens": sum(train_lengths),
            "packed": card.train.packing}


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


def plan_lengths(stage: Any, train_rows: list[dict[str, Any]]) -> tuple[list[int], list[int], dict[str, int]]:
    """Token lengths of the training and validation rows, and the two lengths a step is measured at: the p95 and max
    of the examples (stage 02), or of the packed rows for a packed card."""
    train = token_lengths(stage.tokenizer, stage.card, train_rows)
    validation = token_lengths(stage.tokenizer, stage.card, stage.split("validation"))
    if stage.card.train.packing:
        return train, validation, packed_lengths(stage.card, train)
    return train, validation, representative_lengths(stage.read("preprocessing", "lengths.json"), stage.card.data.max_length)


def plan_text(card: Card, verdict: dict[str, Any], plan: dict[str, Any]) -> str:
    """The fit verdict and the time plan in two lines (times as m:ss)."""
    from labkit.show.tables import fmt_seconds

    rows = f"{plan['rows_per_epoch']} {'packed ' if plan['packed'] else ''}rows per epoch"
    return (f"**Memory:** {verdict['message']}.  \n**Training:** {plan['steps']} optimiser steps of "
            f"{plan['examples_per_step']:.1f} examples ({rows}) × {fmt_seconds(plan['seconds_per_step'])} + "
            f"{plan['evaluations']} validation passes ≈ **{fmt_seconds(plan['train_seconds'])}** (m:ss), "
            f"{plan['cost']:.2f} at the card's price per GPU hour ({'within' if plan['within_budget'] else 'OVER'} "
            f"the {card.budget.max_minutes:g}-minute budget).")
