"""Checks on real training steps of the stage-04 trainer, run in stage 03 before the long run.

- `update_check`: which tensors an update changes, against the set the card's method should train (fp16-aware:
  the steps the loss scaler skips are named and not counted, `labkit.preflight.arms.StepRecord`).
- `accumulation_check`, `checkpointing_check` (`labkit.preflight.comparisons`): micro-batch m × accumulation k
  gives the gradients of one batch of m·k; activation checkpointing gives the same loss and gradients, with less
  memory — each arm sized before it runs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import torch

from labkit.card.schema import Card
from labkit.model.method import kind_of
from labkit.preflight.arms import StepRecord
from labkit.preflight.comparisons import accumulation_check, checkpointing_check
from labkit.preflight.records import UpdateCheck

__all__ = ["accumulation_check", "checkpointing_check", "checksum", "expected_trainable", "first_step_movers",
           "summary_by_kind", "update_check"]


def expected_trainable(model: Any, card: Card) -> set[str]:
    """The parameters the card's method should train, named from the method (not from requires_grad).

    full: every parameter; lora/qlora: the adapters' A and B matrices, the copies of `modules_to_save` and, with
    `data.prompt.chat_template: chatml`, the ChatML tokens' embedding (and untied LM-head) rows
    (peft's `trainable_tokens_delta`, `labkit.model.method.trainable_tokens`) — exactly one per wrapped layer.
    """
    names = [n for n, _ in model.named_parameters()]
    if card.method.kind == "full":
        return set(names)
    tokens = {n for n in names if ".trainable_tokens_delta." in n} if card.data.prompt.chat_template == "chatml" \
        and card.data.prompt.format == "chat" else set()
    return {n for n in names if ".lora_A." in n or ".lora_B." in n or ".modules_to_save." in n} | tokens


def first_step_movers(expected: set[str], card: Card) -> set[str]:
    """Tensors that move on the very first optimiser step.

    LoRA's B starts at zero, so A's gradient (which flows through B) is zero on step one: A moves
    only through weight decay. From the second step on, everything expected moves.
    """
    if card.method.kind == "full" or card.train.weight_decay > 0:
        return set(expected)
    return {n for n in expected if ".lora_A." not in n}


_CHUNK = 1 << 22  # elements per chunk of a checksum (32 MiB of int64 at a time)


def checksum(tensor: Any) -> tuple[int, int]:
    """Two 64-bit sums of a tensor's raw bits (plain and position-weighted), computed on its own device.

    Any change of a single element changes them, so a frozen tensor is verified unchanged without a copy of it
    (a second model's worth of memory on the GPU for a full copy of the base).
    """
    flat = tensor.detach().reshape(-1)
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
    bits = flat.view(ints)
    total = weighted = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start in range(0, bits.numel(), _CHUNK):
        chunk = bits[start:start + _CHUNK].to(torch.int64)
        index = torch.arange(start + 1, start + 1 + chunk.numel(), dtype=torch.int64, device=flat.device)
        total, weighted = total + chunk.sum(), weighted + (chunk * index).sum()
    return int(total), int(weighted)


def update_check(trainer: Any, card: Card, steps: int = 2) -> UpdateCheck:
    """Run real optimiser steps and report, for every tensor, whether it changed.

    Passes only when (1) the trainable tensors are exactly the ones the method should train, (2) after
    the first step taken exactly the first-step movers changed (LoRA: B, not A), (3) after the last step
    every expected tensor changed, (4) every other tensor, 4-bit weights included, is bit-for-bit
    unchanged, and (5) every loss, and the gradients of every step taken, are finite. Only the trainable (and
    expected) tensors are copied; the frozen ones are compared by `checksum`, computed on the device, so the check
    needs no second copy of the base model.

    Steps the fp16 loss scaler skips (inf/NaN gradients at its scale, `labkit.preflight.arms.StepRecord`) are named
    in `skipped_steps` and not counted: the check stops after `steps` steps really taken, so a trainer built with
    `max_steps = steps + arms.SCALER_SKIPS` leaves the scaler room.

    Args:
        trainer: a trainer from `labkit.train.trainer.build_trainer` with max_steps >= steps and a constant lr.
        card: the card (method, weight decay).
        steps: optimiser steps to take (2 shows the LoRA first-step case and the full update).
    Returns:
        {"ok", "problems", "nonfinite", "steps" (taken), "skipped_steps", "trainer_steps", "step_log", "expected",
         "trainable", "changed", "tensors": [...], "seconds_per_step", …}.
    """
    model = trainer.model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    expected = expected_trainable(model, card)
    copied = trainable | expected
    before = {n: p.detach().clone() for n, p in model.named_parameters() if n in copied}
    sums = {n: checksum(p) for n, p in model.named_parameters() if n not in copied}
    record = StepRecord(trainer, steps, keep_first=True)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    first = {n for n, t in (record.first or {}).items() if not torch.equal(before[n], t)}
    tensors, changed = [], set()
    for name, param in model.named_parameters():
        after = param.detach()
        moved = not torch.equal(before[name], after) if name in before else checksum(after) != sums[name]
        changed |= {name} if moved else set()
        delta = ((after.float() - before[name].float()).norm().item() if moved and after.dtype.is_floating_point
                 and name in before else (float("nan") if moved else 0.0))  # nan: a frozen tensor changed (no copy)
        tensors.append({"name": name, "expected": name in expected, "trainable": name in trainable, "changed": moved,
                        "changed_step_1": name in first, "delta_norm": delta, "shape": list(after.shape),
                        "dtype": str(after.dtype).replace("torch.", "")})
    done = record.taken
    movers = first_step_movers(expected, card)
    nonfinite = record.nonfinite()
    problems = list(nonfinite)
    if not expected:
        problems.append("the method trains nothing (no adapter was created): check method.target_modules")
    if frozen := sorted(expected - trainable):
        problems.append(f"{len(frozen)} tensors the method should train are frozen (requires_grad=False), e.g. {frozen[0]}")
    if extra := sorted(trainable - expected):
        problems.append(f"{len(extra)} tensors are trainable but not part of the method, e.g. {extra[0]}")
    if record.first is not None and first != movers:
        odd = sorted(first ^ movers)
        problems.append(f"after step 1, {len(odd)} tensors differ from the expected first-step movers, e.g. {odd[0]}")
    final = expected if done >= 2 or card.method.kind == "full" else movers
    if missing := sorted(final - changed):
        problems.append(f"{len(missing)} tensors that should train did not change, e.g. {missing[0]}")
    if leaked := sorted(changed - expected):
        problems.append(f"{len(leaked)} tensors that must stay frozen changed, e.g. {leaked[0]}")
    ran = len(record.steps_run) or trainer.state.global_step
    return {
        "ok": not problems, "problems": problems, "nonfinite": nonfinite, "steps": done,
        "skipped_steps": record.skipped, "trainer_steps": ran, "step_log": record.steps_run,
        "expected": len(expected), "trainable": len(trainable),
        "changed": len(changed), "changed_step_1": len(first), "first_step_movers": len(movers),
        "unchanged_expected": sorted(final - changed), "changed_frozen": sorted(changed - expected),
        "tensors": tensors, "seconds": seconds, "seconds_per_step": seconds / max(ran, 1),
    }


def summary_by_kind(update: UpdateCheck) -> list[dict[str, Any]]:
    """The update check per tensor kind (layer numbers folded): how many tensors, expected, moved at step 1 and in all."""

    groups: dict[str, dict[str, Any]] = defaultdict(lambda: {"tensors": 0, "expected": 0, "changed step 1": 0, "changed": 0,
                                                             "largest change": 0.0, "dtype": ""})
    for t in update["tensors"]:
        g = groups[kind_of(t["name"])]
        g["tensors"] += 1
        g["expected"] += t["expected"]
        g["changed step 1"] += t["changed_step_1"]
        g["changed"] += t["changed"]
        g["largest change"] = max(g["largest change"], t["delta_norm"])
        g["dtype"] = t["dtype"]
    return [{"kind": k, **v, "ok": v["changed"] == v["expected"]} for k, v in sorted(groups.items())]
