"""Stage 03's time plan: the training time predicted from the measured steps, the trainer's batches replayed.

`time_plan` is what `labkit plan` and stage 04's ETA build on (through stage 03's `fit.json`); docs/stages.md
("The time plan") explains the rule, `bench/plan_accuracy.py` sets it against the measured training time.
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable

from labkit.card.schema import Card
from labkit.core.progress import fmt_seconds
from labkit.preflight.records import RejectedAnswersPlan, TimePlan
from labkit.preflight.scaling import scaling_efficiency
from labkit.train.packing import pack


def representative_lengths(lengths: dict[str, Any], max_length: int) -> dict[str, int]:
    """The p95 and the max of the tokenised training lengths (from stage 02's lengths.json), capped at max_length."""
    train = lengths["train"]
    return {"p95": min(int(train["p95"]), max_length), "max": min(int(train["max"]), max_length)}


def row_lengths(card: Card, lengths: list[int]) -> list[int]:
    """The lengths of the rows the trainer batches: the examples, or the packed rows (stage 04's packer) when
    train.packing."""
    if not card.train.packing:
        return list(lengths)
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


def rejected_answers_plan(block: dict[str, Any] | None) -> RejectedAnswersPlan | None:
    """What the base model's rejected answers (`data.rejected: {from: base_model}`) cost this run, from the data
    manifest's `preference.from_base_model` block: stage 01 generates them before stage 03 runs, so this is what
    their generation took (nothing when the cache held them all; the seconds the cached ones took are kept).

    Args:
        block: the manifest's block (`labkit.data.prepare`), or None for a card without base-model answers.
    Returns:
        {"rows" (answered: training + validation), "train_rows", "train_rows_in_split", "generated_rows",
         "seconds" (this run's generation, model loading included), "cached_seconds", "status"}, or None.
    """
    if not block:
        return None
    answered = block.get("rows_answered") or {}
    rows = sum(answered.values())
    return {"rows": rows, "train_rows": answered.get("train", 0),
            "train_rows_in_split": block.get("train_rows_in_split", answered.get("train", 0)),
            "generated_rows": block.get("generated_rows", rows if block.get("status") == "generated" else 0),
            "seconds": float(block.get("seconds") or 0.0), "cached_seconds": float(block.get("cached_seconds") or 0.0),
            "status": block.get("status", "generated")}


def rejected_text(plan: TimePlan) -> str:
    """The time plan's line on the base model's rejected answers ("" for a card without them)."""
    found = plan.get("rejected_answers")
    if not found:
        return ""
    rows = (f"{found['rows']} rows ({found['train_rows']} of the {found['train_rows_in_split']} training rows: those "
            f"the run trains on, and the validation rows)")
    if found["status"] == "reused":
        return (f"  \n**Rejected answers:** the base model's answers to {rows} came from the cache: 0:00 in this run "
                f"({fmt_seconds(found['cached_seconds'])} (m:ss) when they were generated).")
    return (f"  \n**Rejected answers:** the base model answered {found['generated_rows']} of {rows} in stage 01: "
            f"**{fmt_seconds(found['seconds'])}** (m:ss) before training, not in the training time above.")


def time_plan(card: Card, train_lengths: list[int], validation_lengths: list[int],
              measured: list[dict[str, Any]], rejected: dict[str, Any] | None = None) -> TimePlan:
    """Training time predicted from the measured steps: the trainer's batches replayed, evaluation passes included.

    The rows the trainer batches (packed rows when train.packing) are shuffled as one epoch would be, cut into
    micro-batches padded to their longest row, and each micro-batch costs the measured step time at that length
    (a line through the measurements at two lengths); the first step costs what the measured first step took more
    than the second (the optimiser states are allocated). Validation-loss passes (every train.eval_steps steps, as
    stage 04 schedules them) cost what stage 03's timed evaluation batch took per padded token, for every batch of
    eval.batch_size validation rows (packed rows when train.packing) padded to its longest row; without a timed
    evaluation (DPO / ORPO), a third of a training micro-batch at the same length.

    With several data-parallel processes (distributed.num_processes) each replays its share of the epoch (the
    micro-batches ÷ the processes), its steps slowed by the assumed scaling efficiency
    (`labkit.preflight.scaling.scaling_efficiency`), and each validation pass is shared among them.

    Args:
        card: the card.
        train_lengths: tokens of each training example (`labkit.stages.parameter_check.token_lengths`).
        validation_lengths: tokens of each validation example.
        measured: stage 03's measurements (`labkit.preflight.memory_check.time_lengths`), each with seq_len,
            seconds_per_step and grad_accum.
        rejected: the data manifest's `preference.from_base_model` block (base-model rejected answers), if any.
    Returns:
        {"steps", "rows_per_epoch", "examples_per_step", "seconds_per_step", "train_seconds" (training + evaluation:
         what the trainer's train_runtime measures), "evaluations", "evaluation_seconds", "hours", "cost",
         "within_budget", "train_tokens" (tokens per epoch), "packed", "rejected_answers"
         (`rejected_answers_plan`), "processes", "scaling_efficiency" (assumed; 1 for one process),
         "total_seconds" (train_seconds + the rejected answers' generation)}.
    """
    t, d = card.train, card.distributed
    processes = d.num_processes if d.launcher == "accelerate" else 1
    efficiency = scaling_efficiency(processes, d.num_machines)
    per_micro = _micro_seconds(measured)
    rows = row_lengths(card, train_lengths)
    micro_per_epoch = math.ceil(len(rows) / (t.micro_batch * processes))  # one process's share of an epoch
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
    seconds /= efficiency  # the processes' communication (assumed: labkit.preflight.scaling)
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
    one_pass /= processes  # the validation rows are shared among the processes
    first = next((m["step_seconds"] for m in measured if len(m.get("step_seconds") or []) > 1), None)
    warmup = max(0.0, first[0] - first[-1]) if first else 0.0  # the first step allocates the optimiser states
    total = seconds + warmup + evaluations * one_pass
    hours = total / 3600
    return {"steps": steps, "rows_per_epoch": len(rows), "examples_per_step": len(train_lengths) / per_epoch,
            "seconds_per_step": seconds / steps, "train_seconds": total, "evaluations": evaluations,
            "evaluation_seconds": evaluations * one_pass, "hours": hours,
            "cost": hours * card.budget.price_per_gpu_hour * card.distributed.num_processes,
            "within_budget": total <= card.budget.max_minutes * 60, "train_tokens": sum(train_lengths),
            "packed": card.train.packing, "rejected_answers": (found := rejected_answers_plan(rejected)),
            "processes": processes, "scaling_efficiency": efficiency,
            "total_seconds": total + (found["seconds"] if found else 0.0)}
