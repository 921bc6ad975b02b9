"""Stage 03's two comparison checks on real steps of the stage-04 trainer, each arm sized before it runs.

- `accumulation_check`: micro-batch m × accumulation k gives the gradients of one batch of m·k.
- `checkpointing_check`: activation checkpointing gives the same loss and gradients, with less memory.

Each arm is one optimiser step really taken (`labkit.preflight.arms.one_update`: fp16-aware, gradients unscaled,
inf/NaN reported as their own finding). Arms larger than training (the whole batch of m·k rows, the arm without
checkpointing) are costed by the memory estimate against the device's free memory first; an arm that would not
fit, or that runs out of memory, makes the check "not measurable on this device" (`skipped`, with the reason),
which does not fail the stage.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import datasets

from labkit.card.schema import Card
from labkit.core.progress import task
from labkit.data.pairs import to_dataset as pair_dataset
from labkit.model.loading import decisions, pick_dtype
from labkit.preflight.arms import run_arm
from labkit.preflight.measure import fixed_length_dataset
from labkit.preflight.memory import estimate_step
from labkit.preflight.records import AccumulationCheck, CheckpointingCheck, MemoryEstimate
from labkit.train.packing import pack
from labkit.train.trainer import to_dataset

# TRL's ORPO accumulates differently from one large batch; card validation keeps orpo cards at grad_accum 1
ORPO_NOTE = ("TRL's ORPOTrainer averages its NLL term over each micro-batch's tokens, so accumulation differs from one "
             "large batch; orpo cards train without accumulation (train.grad_accum: 1), which this does not affect")


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


def _longest(card: Card, data: Any) -> int:
    """Tokens of the longest row of a batch of `data` (a pair: the prompt and its longer answer), cut at max_length."""
    if card.train.trainer == "sft":
        longest = max(len(x) for x in data["input_ids"])
    else:
        longest = max(len(p) + max(len(c), len(r))
                      for p, c, r in zip(data["prompt_ids"], data["chosen_ids"], data["rejected_ids"]))
    return min(longest, card.data.max_length)


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


def _compared(one: dict[str, Any], two: dict[str, Any]) -> tuple[float, str]:
    """`_grad_difference` of two arms, NaN when either took no step or had non-finite gradients."""
    if one["grads"] is None or two["grads"] is None or one["nonfinite"] or two["nonfinite"]:
        return float("nan"), ""
    return _grad_difference(one["grads"], two["grads"])


def _tolerance(device: str, card: Card) -> float:
    """1e-4 when every product is float32 (float32 weights and training precision, no 4-bit layer), else 2e-2.

    A 4-bit layer is never float32-exact: bitsandbytes dequantises through 16 bits (on the CPU too, with a float32
    compute dtype: two batchings of tiny:llama's QLoRA step differ by 2.9e-3), and a QLoRA layer computing in
    bfloat16 over float32 weights likewise.
    """
    made = decisions(card, device)
    exact = str(pick_dtype(card, device)) == "torch.float32" and made.precision == "fp32" and made.compute_dtype is None
    return 1e-4 if exact else 2e-2


def _from_encoded(card: Card, encoded: list[Any]) -> Any:
    """`to_dataset` of rows already encoded (`labkit.data.prompting.encode_rows`)."""
    examples = [{"input_ids": e.input_ids, "labels": e.labels} for e in encoded]
    return datasets.Dataset.from_list(pack(examples, card.data.max_length) if card.train.packing else examples)


def _skipped_accumulation(base: dict[str, Any], reason: str) -> AccumulationCheck:
    """The accumulation check's record when it was not measured (`skipped`: why); it fails nothing."""
    return {**base, "ok": True, "skipped": reason, "problems": [], "nonfinite": [], "relative_difference": None,
            "worst_tensor": "", "loss_whole": None, "loss_accumulated": None}  # type: ignore[typeddict-item]


def accumulation_check(card: Card, make_model: Callable[[], Any], tokenizer: Any, rows: list[dict[str, Any]],
                       device: str = "cpu", micro_batch: int | None = None, accum: int | None = None,
                       encoded: list[Any] | None = None, config: Any = None, free_bytes: float | None = None,
                       loss_fraction: float = 1.0, skip_ignored: bool = False) -> AccumulationCheck:
    """Micro-batch m × accumulation k must give the gradients of one batch of m·k rows.

    The rows are ordered by length, so the micro-batches hold different numbers of completion tokens:
    exactly the case where averaging each micro-batch's mean (instead of normalising over all tokens)
    gives different gradients.

    For dpo/orpo cards the rows are preference pairs trained by TRL's DPO/ORPO trainer (ordered by the tokens
    their loss averages over, `_dataset_and_tokens`). ORPO's result is ignored (`ORPO_NOTE`): with `skip_ignored`
    its arms are not run.

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
        config: the model's config, to cost each arm before it runs (None: arms run unsized).
        free_bytes: the memory free on the device (`labkit.preflight.measure.free_device_memory`).
        loss_fraction: the share of positions carrying a loss (`labkit.preflight.memory.estimate_step`).
        skip_ignored: do not run the arms when the result is ignored (orpo).
    Returns:
        {"ok", "skipped" (None, or why the check was not measured), "nonfinite", "problems", "relative_difference",
         "tolerance", "worst_tensor", "loss_normalisation", "micro_batch", "accum", "needed_bytes", …}.
    """
    m = micro_batch or card.train.micro_batch
    k = accum or max(card.train.grad_accum, 2)
    tol = _tolerance(device, card)
    note = ORPO_NOTE if card.train.trainer == "orpo" else None
    base = {"tolerance": tol, "note": note, "trainer": card.train.trainer, "loss_normalisation":
            card.train.loss_normalisation, "micro_batch": m, "accum": k, "free_bytes": free_bytes,
            "needed_bytes": {}, "skipped_steps": {}, "tokens_per_micro_batch": [], "load_balancing": None}
    if note is not None and skip_ignored:
        return _skipped_accumulation(base, f"not run: its result is ignored ({note})")
    if len(rows) < m * k:
        raise ValueError(f"accumulation_check needs {m * k} training rows, got {len(rows)}")
    data, counts = _dataset_and_tokens(tokenizer, card, rows, encoded)
    order = sorted(range(len(data)), key=counts.__getitem__)
    picked = order[: m * (k - 1)] + order[-m:]  # short completions first, the longest last: unequal token counts
    data = data.select(picked)
    base["tokens_per_micro_batch"] = [sum(counts[j] for j in picked[s: s + m]) for s in range(0, m * k, m)]
    seq_len = _longest(card, data)
    arms = {}
    for arm, batch, steps, what in (("whole", m * k, 1, f"one batch of {m * k} rows at {seq_len} tokens"),
                                    ("accumulated", m, k, f"{k} micro-batches of {m} rows at {seq_len} tokens")):
        size = {"config": config, "free_bytes": free_bytes, "seq_len": seq_len, "micro_batch": batch,
                "checkpointing": None, "loss_fraction": loss_fraction}
        with task(f"accumulation check: arm {len(arms) + 1}/2, {what}"):
            arms[arm] = run_arm(card, make_model, tokenizer, data, device, what, size, balance=False,
                                per_device_train_batch_size=batch, gradient_accumulation_steps=steps)
        base["needed_bytes"][arm] = arms[arm]["needed_bytes"]
        if "not_measurable" in arms[arm]:
            return _skipped_accumulation(base, arms[arm]["not_measurable"])
        base["skipped_steps"][arm] = arms[arm]["skipped_steps"]
        base["load_balancing"] = arms[arm]["load_balancing"]
    whole, accumulated = arms["whole"], arms["accumulated"]
    rel, worst = _compared(whole, accumulated)
    nonfinite = [f"one batch of {m * k}: {x}" for x in whole["nonfinite"]] + \
                [f"{k} × {m} accumulated: {x}" for x in accumulated["nonfinite"]]
    return {**base, "ok": not nonfinite and (rel <= tol or note is not None), "skipped": None, "problems": nonfinite,
            "nonfinite": nonfinite, "relative_difference": rel, "worst_tensor": worst,
            "loss_whole": whole["loss"], "loss_accumulated": accumulated["loss"]}  # type: ignore[typeddict-item]


# The smallest memory saving the CPU measurement (peak resident memory) resolves; CUDA's allocator counts bytes.
# In bench/gpu_check.py --cpu-dry-run the tiny arms measure 2.9, 2.4 and 11.1 MiB of saving where `expected_saving`
# expects 9.5, 7.2 and 23.0 MiB (tiny:phi, tiny:mistral, the small Llama; 2026-12-04), and earlier runs measured
# 0.4-1.3 MiB where 8.2 MiB of kept activations were expected: below a few tens of MiB the step's resident memory
# is allocator noise, and judging it failed healthy checks. 64 MiB keeps the largest of those arms below half.
CPU_RESOLUTION_BYTES = 64 * 2**20


def expected_saving(plain: MemoryEstimate, checkpointed: MemoryEstimate) -> float | None:
    """The memory activation checkpointing should save on the checkpointing check's step: the step's estimated peak
    without it less the peak with it (the two arms' `labkit.preflight.memory.estimate_step`), each at its own peak
    phase.

    Comparing the kept activations alone (the estimate's alternatives) also charges the one recomputed layer to the
    checkpointed arm when that phase is not its peak: on a two-layer model half the saving the arms measure.

    Returns:
        bytes, or None for an architecture the estimate does not model.
    """
    return plain["step_bytes"] - checkpointed["step_bytes"] if plain["modelled"] else None


def checkpointing_check(card: Card, make_model: Callable[[], Any], tokenizer: Any, rows: list[dict[str, Any]],
                        seq_len: int, device: str = "cpu", config: Any = None, encoded: list[Any] | None = None,
                        free_bytes: float | None = None, loss_fraction: float = 1.0) -> CheckpointingCheck:
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
        config: the model's config, for the expected saving and to cost each arm before it runs
            (`labkit.preflight.memory.estimate_step`).
        encoded: the rows encoded once (`labkit.data.prompting.encode_rows`), when already computed.
        free_bytes: the memory free on the device (None: arms run unsized).
        loss_fraction: the share of positions carrying a loss.
    Returns:
        {"ok", "skipped" (None, or why not measured), "nonfinite", "problems", "loss_plain", "loss_checkpointed",
         "relative_difference", "memory_plain_bytes", "memory_checkpointed_bytes", "memory_saving_expected_bytes",
         "memory_judged", "needed_bytes", …}.
    """
    mb = card.train.micro_batch
    data = fixed_length_dataset(tokenizer, card, rows, seq_len, mb, encoded=encoded)
    tol = _tolerance(device, card)
    base = {"seq_len": seq_len, "micro_batch": mb, "tolerance": tol, "free_bytes": free_bytes, "needed_bytes": {},
            "skipped_steps": {}}
    # each arm's estimate, made once: it costs the arm and gives the saving expected
    estimates = {} if config is None else {
        ckpt: estimate_step(config, card, seq_len, micro_batch=mb, device=device, checkpointing=ckpt,
                            loss_fraction=loss_fraction) for ckpt in (False, True)}
    arms = {}
    for arm, ckpt in (("plain", False), ("checkpointed", True)):
        what = f"micro-batch {mb} at {seq_len} tokens {'with' if ckpt else 'without'} activation checkpointing"
        size = {"config": config, "free_bytes": free_bytes, "seq_len": seq_len, "micro_batch": mb,
                "checkpointing": ckpt, "loss_fraction": loss_fraction, "estimate": estimates.get(ckpt)}
        with task(f"checkpointing check: arm {len(arms) + 1}/2, {what}"):
            arms[arm] = run_arm(card, make_model, tokenizer, data, device, what, size, measure=True,
                                activation_checkpointing=ckpt, per_device_train_batch_size=mb,
                                gradient_accumulation_steps=1)
        base["needed_bytes"][arm] = arms[arm]["needed_bytes"]
        if "not_measurable" in arms[arm]:
            return {**base, "ok": True, "skipped": arms[arm]["not_measurable"], "problems": [], "nonfinite": [],
                    "memory_saving_expected_bytes": None, "memory_judged": False, "loss_plain": None,
                    "loss_checkpointed": None, "relative_difference": None, "worst_tensor": "",
                    "memory_plain_bytes": None, "memory_checkpointed_bytes": None, "memory_method": ""}  # type: ignore
        base["skipped_steps"][arm] = arms[arm]["skipped_steps"]
    plain, ckpt = arms["plain"], arms["checkpointed"]
    rel, worst = _compared(plain, ckpt)
    loss_rel = abs(plain["loss"] - ckpt["loss"]) / max(abs(plain["loss"]), 1e-12)
    mem_plain, mem_ckpt = plain["memory"]["delta_bytes"], ckpt["memory"]["delta_bytes"]
    nonfinite = [f"without checkpointing: {x}" for x in plain["nonfinite"]] + \
                [f"with checkpointing: {x}" for x in ckpt["nonfinite"]]
    problems = list(nonfinite)
    if not nonfinite and loss_rel > tol:
        problems.append(f"loss differs by {loss_rel:.2e} (relative)")
    if not nonfinite and rel > tol:
        problems.append(f"gradients differ by {rel:.2e} (relative), most in {worst}")
    expected, modelled = None, True
    if estimates:
        expected, modelled = expected_saving(estimates[False], estimates[True]), estimates[False]["modelled"]
    judged = modelled and (expected is None or expected >= (CPU_RESOLUTION_BYTES if device == "cpu" else 1))
    if judged and mem_ckpt >= mem_plain:
        problems.append(f"checkpointing did not lower the step's memory ({mem_ckpt / 2**20:.0f} MiB vs {mem_plain / 2**20:.0f} MiB)")
    return {**base, "ok": not problems, "skipped": None, "problems": problems, "nonfinite": nonfinite,
            "memory_saving_expected_bytes": expected, "memory_judged": judged,
            "loss_plain": plain["loss"], "loss_checkpointed": ckpt["loss"], "relative_difference": rel,
            "worst_tensor": worst, "memory_plain_bytes": mem_plain, "memory_checkpointed_bytes": mem_ckpt,
            "memory_method": plain["memory"]["method"]}  # type: ignore[typeddict-item]
