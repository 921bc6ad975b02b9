"""Checks on real training steps of the stage-04 trainer, run in stage 03 before the long run.

- `update_check`: which tensors an update changes, against the set the card's method should train.
- `accumulation_check`: micro-batch m × accumulation k gives the gradients of one batch of m·k.
- `checkpointing_check`: activation checkpointing gives the same loss and gradients, with less memory.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import datasets
import torch

from labkit.card.schema import Card
from labkit.data.pairs import to_dataset as pair_dataset
from labkit.model.loading import pick_dtype
from labkit.model.method import kind_of
from labkit.preflight.measure import PeakMemory, fixed_length_dataset
from labkit.preflight.memory import estimate_step
from labkit.preflight.records import ACTIVATIONS_CHECKPOINTED, ACTIVATIONS_PLAIN, AccumulationCheck, CheckpointingCheck
from labkit.preflight.records import UpdateCheck
from labkit.train.callbacks import Snapshots
from labkit.train.packing import pack
from labkit.train.trainer import build_trainer, to_dataset


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
    the first step exactly the first-step movers changed (LoRA: B, not A), (3) after the last step
    every expected tensor changed, and (4) every other tensor, 4-bit weights included, is bit-for-bit
    unchanged. Only the trainable (and expected) tensors are copied; the frozen ones are compared by `checksum`,
    computed on the device, so the check needs no second copy of the base model.

    Args:
        trainer: a trainer from `labkit.train.trainer.build_trainer` with max_steps=steps and a constant lr.
        card: the card (method, weight decay).
        steps: optimiser steps to run (2 shows the LoRA first-step case and the full update).
    Returns:
        {"ok", "problems", "steps", "expected", "trainable", "changed", "tensors": [...], "seconds_per_step", …}.
    """
    model = trainer.model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    expected = expected_trainable(model, card)
    copied = trainable | expected
    before = {n: p.detach().clone() for n, p in model.named_parameters() if n in copied}
    sums = {n: checksum(p) for n, p in model.named_parameters() if n not in copied}
    snaps = Snapshots()
    trainer.add_callback(snaps)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    first = {n for n, t in (snaps.after_step[0].items() if snaps.after_step else []) if not torch.equal(before[n], t)}
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
    done = trainer.state.global_step
    movers = first_step_movers(expected, card)
    problems = []
    if not expected:
        problems.append("the method trains nothing (no adapter was created): check method.target_modules")
    if frozen := sorted(expected - trainable):
        problems.append(f"{len(frozen)} tensors the method should train are frozen (requires_grad=False), e.g. {frozen[0]}")
    if extra := sorted(trainable - expected):
        problems.append(f"{len(extra)} tensors are trainable but not part of the method, e.g. {extra[0]}")
    if snaps.after_step and first != movers:
        odd = sorted(first ^ movers)
        problems.append(f"after step 1, {len(odd)} tensors differ from the expected first-step movers, e.g. {odd[0]}")
    final = expected if done >= 2 or card.method.kind == "full" else movers
    if missing := sorted(final - changed):
        problems.append(f"{len(missing)} tensors that should train did not change, e.g. {missing[0]}")
    if leaked := sorted(changed - expected):
        problems.append(f"{len(leaked)} tensors that must stay frozen changed, e.g. {leaked[0]}")
    return {
        "ok": not problems, "problems": problems, "steps": done, "expected": len(expected), "trainable": len(trainable),
        "changed": len(changed), "changed_step_1": len(first), "first_step_movers": len(movers),
        "unchanged_expected": sorted(final - changed), "changed_frozen": sorted(changed - expected),
        "tensors": tensors, "seconds": seconds, "seconds_per_step": seconds / max(done, 1),
    }


def _dataset_and_tokens(tokenizer: Any, card: Card, rows: list[dict[str, Any]],
                        encoded: list[Any] | None = None) -> tuple[Any, list[int]]:
    """The trainer's dataset of `rows` and, per row, the tokens its loss term averages over.

    sft: the completion tokens; orpo: prompt + chosen (its NLL term is a token mean); dpo: the answer tokens of
    both sequences (the DPO loss is a mean over pairs, so unequal counts must not matter).
    """
    if card.train.trainer == "sft":
        data = to_dataset(tokenizer, card, rows) if encoded is None else _from_encoded(card, encoded)
        return data, [sum(x != -100 for x in labels) for labels in data["labels"]]

    data = pair_dataset(tokenizer, card, rows)
    sides = ("prompt_ids", "chosen_ids") if card.train.trainer == "orpo" else ("chosen_ids", "rejected_ids")
    return data, [len(a) + len(b) for a, b in zip(data[sides[0]], data[sides[1]])]


def _one_update(card: Card, make_model: Callable[[], Any], tokenizer: Any, data: Any, device: str,
                measure: bool = False, **overrides: Any) -> dict[str, Any]:
    """Gradients (before the optimiser) and loss of one optimiser step of the stage-04 trainer."""
    model = make_model()
    snaps = Snapshots(keep_grads=True)
    trainer = build_trainer(card, model, tokenizer, data, Path(tempfile.mkdtemp(prefix="labkit-check-")), device=device,
                            max_steps=1, lr_scheduler_type="constant", warmup_steps=0, logging_steps=1, max_grad_norm=0.0,
                            train_sampling_strategy="sequential", disable_tqdm=True, **overrides)
    trainer.add_callback(snaps)
    with PeakMemory(device) as peak:
        trainer.train()
    loss = next(e["loss"] for e in trainer.state.log_history if "loss" in e)
    return {"grads": snaps.grads[-1], "loss": float(loss), "memory": peak.as_dict() if measure else None}


def _grad_difference(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, str]:
    """Relative L2 difference of two gradient sets, and the tensor where it is largest."""
    num = den = 0.0
    worst, worst_name = -1.0, ""
    for name, ga in a.items():
        diff = (ga - b[name]).norm().item()
        num, den = num + diff**2, den + ga.norm().item() ** 2
        rel = diff / (ga.norm().item() + 1e-12)
        if rel > worst:
            worst, worst_name = rel, name
    return math.sqrt(num) / (math.sqrt(den) + 1e-12), worst_name


def _tolerance(device: str, card: Card) -> float:
    return 1e-4 if str(pick_dtype(card, device)) == "torch.float32" else 2e-2


def _from_encoded(card: Card, encoded: list[Any]) -> Any:
    """`to_dataset` of rows already encoded (`labkit.data.prompting.encode_rows`)."""
    examples = [{"input_ids": e.input_ids, "labels": e.labels} for e in encoded]
    return datasets.Dataset.from_list(pack(examples, card.data.max_length) if card.train.packing else examples)


def accumulation_check(card: Card, make_model: Callable[[], Any], tokenizer: Any, rows: list[dict[str, Any]],
                       device: str = "cpu", micro_batch: int | None = None, accum: int | None = None,
                       encoded: list[Any] | None = None) -> AccumulationCheck:
    """Micro-batch m × accumulation k must give the gradients of one batch of m·k rows.

    The rows are ordered by length, so the micro-batches hold different numbers of completion tokens:
    exactly the case where averaging each micro-batch's mean (instead of normalising over all tokens)
    gives different gradients.

    For dpo/orpo cards the rows are preference pairs trained by TRL's DPO/ORPO trainer (ordered by the tokens
    their loss averages over, `_dataset_and_tokens`).

    Args:
        card: the card (train.loss_normalisation decides how the SFT trainer normalises).
        make_model: returns the model with the method applied at its initial weights (a fresh load each call, or
            `labkit.preflight.shared.SharedModel`, which restores them).
        tokenizer: the tokenizer.
        rows: prepared training rows (at least m·k).
        device: the device.
        micro_batch: m (default: the card's micro-batch).
        accum: k (default: the card's accumulation, at least 2).
        encoded: the rows encoded once (sft), when already computed.
    Returns:
        {"ok", "relative_difference", "tolerance", "worst_tensor", "loss_normalisation", "micro_batch", "accum", …}.
    """
    m = micro_batch or card.train.micro_batch
    k = accum or max(card.train.grad_accum, 2)
    if len(rows) < m * k:
        raise ValueError(f"accumulation_check needs {m * k} training rows, got {len(rows)}")
    data, counts = _dataset_and_tokens(tokenizer, card, rows, encoded)
    order = sorted(range(len(data)), key=counts.__getitem__)
    picked = order[: m * (k - 1)] + order[-m:]  # short completions first, the longest last: unequal token counts
    data = data.select(picked)
    tokens = [sum(counts[j] for j in picked[s: s + m]) for s in range(0, m * k, m)]
    whole = _one_update(card, make_model, tokenizer, data, device, per_device_train_batch_size=m * k, gradient_accumulation_steps=1)
    accumulated = _one_update(card, make_model, tokenizer, data, device, per_device_train_batch_size=m, gradient_accumulation_steps=k)
    rel, worst = _grad_difference(whole["grads"], accumulated["grads"])
    tol = _tolerance(device, card)
    note = None
    if card.train.trainer == "orpo":  # validation keeps orpo cards at grad_accum 1: the bias is shown, never trained with
        note = ("TRL's ORPOTrainer averages its NLL term over each micro-batch's tokens, so accumulation differs from one "
                "large batch; orpo cards train without accumulation (train.grad_accum: 1), which this does not affect")
    return {"ok": rel <= tol or note is not None, "relative_difference": rel, "tolerance": tol, "worst_tensor": worst,
            "note": note, "trainer": card.train.trainer,
            "loss_normalisation": card.train.loss_normalisation, "micro_batch": m, "accum": k,
            "tokens_per_micro_batch": tokens, "loss_whole": whole["loss"], "loss_accumulated": accumulated["loss"]}


# The smallest memory saving the CPU measurement (peak resident memory) resolves; CUDA's allocator counts bytes.
CPU_RESOLUTION_BYTES = 8 * 2**20


def checkpointing_check(card: Card, make_model: Callable[[], Any], tokenizer: Any, rows: list[dict[str, Any]],
                        seq_len: int, device: str = "cpu", config: Any = None,
                        encoded: list[Any] | None = None) -> CheckpointingCheck:
    """Activation checkpointing must give the same loss and gradients, and use less memory.

    The memory is judged when the saving the estimate expects is one the measurement can resolve (always
    without `config`): a tiny model at a short length saves less than the CPU measurement's noise.

    Args:
        card: the card.
        make_model: returns the model with the method applied at its initial weights (or a `SharedModel`).
        tokenizer: the tokenizer.
        rows: prepared training rows.
        seq_len: tokens per example (e.g. the p95 of the training lengths).
        device: the device.
        config: the model's config, for the expected saving (`labkit.preflight.memory.estimate_step`).
        encoded: the rows encoded once (`labkit.data.prompting.encode_rows`), when already computed.
    Returns:
        {"ok", "loss_plain", "loss_checkpointed", "relative_difference", "memory_plain_bytes", "memory_checkpointed_bytes",
         "memory_saving_expected_bytes", "memory_judged", …}.
    """
    data = fixed_length_dataset(tokenizer, card, rows, seq_len, card.train.micro_batch, encoded=encoded)
    common = {"per_device_train_batch_size": card.train.micro_batch, "gradient_accumulation_steps": 1}
    plain = _one_update(card, make_model, tokenizer, data, device, measure=True, activation_checkpointing=False, **common)
    ckpt = _one_update(card, make_model, tokenizer, data, device, measure=True, activation_checkpointing=True, **common)
    rel, worst = _grad_difference(plain["grads"], ckpt["grads"])
    tol = _tolerance(device, card)
    loss_rel = abs(plain["loss"] - ckpt["loss"]) / max(abs(plain["loss"]), 1e-12)
    mem_plain, mem_ckpt = plain["memory"]["delta_bytes"], ckpt["memory"]["delta_bytes"]
    problems = []
    if loss_rel > tol:
        problems.append(f"loss differs by {loss_rel:.2e} (relative)")
    if rel > tol:
        problems.append(f"gradients differ by {rel:.2e} (relative), most in {worst}")
    expected, modelled = None, True
    if config is not None:
        est = estimate_step(config, card, seq_len, device=device)
        modelled = est["modelled"]  # an architecture the estimate does not model: no expected saving to judge by
        expected = (est["alternatives"][ACTIVATIONS_PLAIN] - est["alternatives"][ACTIVATIONS_CHECKPOINTED]
                    if modelled else None)
    judged = modelled and (expected is None or expected >= (CPU_RESOLUTION_BYTES if device == "cpu" else 1))
    if judged and mem_ckpt >= mem_plain:
        problems.append(f"checkpointing did not lower the step's memory ({mem_ckpt / 2**20:.0f} MiB vs {mem_plain / 2**20:.0f} MiB)")
    return {"ok": not problems, "problems": problems, "seq_len": seq_len, "micro_batch": card.train.micro_batch,
            "memory_saving_expected_bytes": expected, "memory_judged": judged,
            "loss_plain": plain["loss"], "loss_checkpointed": ckpt["loss"], "relative_difference": rel,
            "worst_tensor": worst, "tolerance": tol, "memory_plain_bytes": mem_plain, "memory_checkpointed_bytes": mem_ckpt,
            "memory_method": plain["memory"]["method"]}


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
