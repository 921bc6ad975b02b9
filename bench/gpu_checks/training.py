"""One training arm of the GPU check: the fit verdict, memory against the estimate, tokens/s and stage 03's checks.

Each arm loads its model once with the card's method applied and shares it between the measurements
(`labkit.preflight.shared.SharedModel`, as stage 03 does), so every measurement starts from the same weights.
"""

from __future__ import annotations

import contextlib
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .models import Arm, card_data, write_card

GIB = 1024**3
# steps excluded from tokens/s (kernel selection, Triton autotuning, the optimiser's first allocations), and steps timed
STEPS = {"cuda": (2, 4), "cpu": (1, 1)}


def logged(trainer: Any) -> list[float]:
    """Every loss and gradient norm a trainer logged (for the finite check)."""
    return [float(e[k]) for e in trainer.state.log_history for k in ("loss", "grad_norm") if e.get(k) is not None]


def tokens_per_second(card: Any, make_model: Any, tokenizer: Any, rows: list[dict[str, Any]], encoded: list[Any],
                      seq_len: int, device: str) -> dict[str, Any]:
    """Tokens/s of the stage-04 trainer at `seq_len`, over the steps after the warm-up ones (`STEPS`).

    Args:
        card: the arm's card.
        make_model: the shared model.
        tokenizer, rows, encoded: the data (rows filled to exactly `seq_len` tokens, as stage 03 measures).
        seq_len: tokens per row.
        device: the device.
    Returns:
        {"tokens_per_second", "warmup_steps", "timed_steps", "step_seconds", "losses"}.
    """
    from labkit.preflight.measure import fixed_length_dataset
    from labkit.train.callbacks import StepTimer
    from labkit.train.trainer import build_trainer

    warmup, timed = STEPS[device]
    steps = warmup + timed
    data = fixed_length_dataset(tokenizer, card, rows, seq_len, card.train.micro_batch * card.train.grad_accum * steps,
                                encoded=encoded)
    trainer = build_trainer(card, make_model(), tokenizer, data, Path(tempfile.mkdtemp(prefix="labkit-gpu-speed-")),
                            device=device, max_steps=steps, lr_scheduler_type="constant", warmup_steps=0,
                            logging_steps=1, disable_tqdm=True)
    timer = StepTimer()  # the GPU's queue drained at both ends of each step
    trainer.add_callback(timer)
    trainer.train()
    per_step = sum(len(ids) for ids in data["input_ids"]) / steps
    seconds = sum(timer.seconds[warmup:])
    return {"tokens_per_second": per_step * timed / seconds if seconds else None, "warmup_steps": warmup,
            "timed_steps": timed, "tokens_per_step": per_step, "step_seconds": [round(s, 4) for s in timer.seconds],
            "losses": logged(trainer)}


def fit_and_memory(arm: Arm, loaded: Any, shared: Any, config: Any, tokenizer: Any, rows: list[dict[str, Any]],
                   encoded: list[Any], fraction: float, device: str, leftover: int) -> dict[str, Any]:
    """The fit verdict against the free memory, then a measured step against the estimate.

    Args:
        arm: the arm.
        loaded: its loaded card.
        shared: the shared model.
        config: the model's config.
        tokenizer, rows, encoded: the data.
        fraction: the share of tokens that carry a loss.
        device: the device.
        leftover: bytes this process held on the GPU before the arm's model was loaded (not the arm's).
    Returns:
        {"verdict", "estimate", "measured", "comparison", "mem_get_info", "reserved_peak_bytes", ...}.
    """
    import torch

    from labkit.preflight.measure import free_device_memory
    from labkit.preflight.timing import measure_step
    from labkit.preflight.memory import estimate_step
    from labkit.preflight.memory_check import compare, loaded_bytes
    from labkit.preflight.sizing import fit_verdict, paged_bytes

    card, cuda = loaded.card, device == "cuda"
    est = estimate_step(config, card, arm.seq_len, device=device, loss_fraction=fraction)
    free = free_device_memory(device)
    info = [int(x) for x in torch.cuda.mem_get_info()] if cuda else None
    verdict = fit_verdict(config, card, arm.seq_len, free, device, loss_fraction=fraction)
    model = shared()
    weights = loaded_bytes(model)  # as stage 03 measures (labkit.preflight.memory_check.measure), one step on the CPU
    got = measure_step(card, model, tokenizer, rows, arm.seq_len, Path(tempfile.mkdtemp(prefix="labkit-gpu-mem-")),
                       device=device, steps=2 if cuda else 1, encoded=encoded)
    got.update(weights_bytes=weights, peak_bytes=weights + got["memory"]["delta_bytes"])
    row = compare([est], [got])[0]
    out = {"seq_len": arm.seq_len, "micro_batch": card.train.micro_batch, "checkpointing": arm.checkpointing,
           "verdict": {k: verdict[k] for k in ("fits", "message", "needed_bytes", "spare_bytes", "paged_bytes")},
           "free_bytes": free, "mem_get_info": info, "estimate_peak_bytes": est["peak_bytes"],
           "estimate_step_bytes": est["step_bytes"], "paged_optimiser_bytes": paged_bytes(est),
           "measured_weights_bytes": got["weights_bytes"], "measured_peak_bytes": got["peak_bytes"],
           "measured_step_bytes": got["memory"]["delta_bytes"], "measured_by": got["memory"]["method"],
           "peak_error": row.get("peak_error"), "step_error": row.get("step_error"), "losses": got["loss"],
           "seconds_per_step": got["seconds_per_step"], "timed_by": got.get("timed_by")}
    if cuda:  # the whole process's peak above what it held before this arm, against what the verdict said it needs
        reserved = torch.cuda.max_memory_reserved() - leftover
        out.update(reserved_peak_bytes=reserved, allocated_peak_bytes=torch.cuda.max_memory_allocated() - leftover,
                   reserved_within_verdict=reserved <= verdict["needed_bytes"])
    return out


def step_ratio(measured: dict[str, Any], speed: dict[str, Any]) -> float | None:
    """Stage 03's step time (the measured pass's last step on a GPU) over the steady step time after the warm-up
    steps (`tokens_per_second`): near 1 when the measured pass's steps are as training runs them."""
    if not measured.get("seconds_per_step") or not speed.get("tokens_per_second"):
        return None
    return round(measured["seconds_per_step"] / (speed["tokens_per_step"] / speed["tokens_per_second"]), 3)


def accepted(function: Any, **options: Any) -> dict[str, Any]:
    """The keyword arguments `function` takes: stage 03's arm sizing (config, free_bytes, loss_fraction) where the
    checks take it, nothing where they do not yet."""
    import inspect

    names = inspect.signature(function).parameters
    return {k: v for k, v in options.items() if k in names}


def stage03(loaded: Any, shared: Any, config: Any, tokenizer: Any, rows: list[dict[str, Any]], encoded: list[Any],
            seq_len: int, device: str, fraction: float = 1.0) -> dict[str, Any]:
    """Stage 03's update, accumulation and checkpointing checks, called as `labkit.stages.parameter_check` calls them
    (each comparison arm costed against the free memory first, where the checks do that).

    Returns:
        {"update", "accumulation", "checkpointing"}: each {"ok", ...} without the per-tensor lists, plus "values"
        (every loss and gradient norm, for the finite check).
    """
    from labkit.preflight import stepchecks
    from labkit.preflight.measure import free_device_memory
    from labkit.train.trainer import build_trainer

    card = loaded.card
    trainer = build_trainer(card, shared(), tokenizer, rows[: card.train.micro_batch * card.train.grad_accum * 2],
                            Path(tempfile.mkdtemp(prefix="labkit-gpu-update-")), device=device, max_steps=2,
                            lr_scheduler_type="constant", warmup_steps=0, logging_steps=1, disable_tqdm=True)
    update = stepchecks.update_check(trainer, card, steps=2)
    values = logged(trainer)
    del trainer
    sizing = dict(config=config, free_bytes=free_device_memory(device), loss_fraction=fraction, skip_ignored=True)
    accumulation = stepchecks.accumulation_check(card, shared, tokenizer, rows, device, encoded=encoded,
                                                 **accepted(stepchecks.accumulation_check, **sizing))
    sizing["free_bytes"] = free_device_memory(device)
    checkpointing = stepchecks.checkpointing_check(card, shared, tokenizer, rows, seq_len, device, encoded=encoded,
                                                   **accepted(stepchecks.checkpointing_check, **sizing))
    shared.restore()
    values += [accumulation.get("loss_whole"), accumulation.get("loss_accumulated"), checkpointing.get("loss_plain"),
               checkpointing.get("loss_checkpointed")]
    brief = {k: v for k, v in update.items() if k not in ("tensors", "unchanged_expected", "changed_frozen")}
    return {"update": brief, "accumulation": dict(accumulation), "checkpointing": dict(checkpointing),
            "values": [v for v in values if v is not None]}


def run_arm(arm: Arm, source: str, device: str) -> dict[str, Any]:
    """Load the arm's model (4-bit, method applied) and run the fit verdict, the memory measurement, tokens/s and
    stage 03's checks on it.

    Args:
        arm: the arm.
        source: its model source.
        device: "cuda" or "cpu".
    Returns:
        the arm's JSON: {"arm", "model", "precision", "decisions", "fit_and_memory", "speed", "stage03", "nonfinite",
        "seconds"}; {"refused": message} when labkit refuses the configuration with a one-line error (Phi in fp16).
    """
    import gc

    import torch
    from transformers import AutoConfig

    from labkit.data import sources as D
    from labkit.data.prompting import encode_rows
    from labkit.errors import LabkitError
    from labkit.model.loading import load_model, load_tokenizer
    from labkit.model.method import apply_method
    from labkit.model.sources import resolve
    from labkit.preflight.measure import loss_fraction
    from labkit.preflight.shared import SharedModel

    start = time.perf_counter()
    cuda = device == "cuda"
    loaded = write_card(card_data(source, arm.precision, arm.checkpointing, arm.micro_batch, variant=arm.name,
                                 quantised=arm.quantised))
    card = loaded.card
    resolved = resolve(source)
    tokenizer = load_tokenizer(resolved, card)
    config = AutoConfig.from_pretrained(resolved.location)
    rows = [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()]
    encoded = encode_rows(tokenizer, card, rows)
    kept = [i for i, e in enumerate(encoded) if len(e.input_ids) <= card.data.max_length]  # as the card's cleaning
    rows, encoded = [rows[i] for i in kept], [encoded[i] for i in kept]
    fraction = loss_fraction(tokenizer, card, rows)
    out: dict[str, Any] = {"arm": arm.name, "model": source, "method": card.method.kind, "precision": arm.precision,
                           "optimizer": card.train.optimizer, "checkpointing": arm.checkpointing}
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    leftover = torch.cuda.memory_allocated() if cuda else 0
    try:
        model = apply_method(load_model(resolved, card, device), card)
    except LabkitError as exc:  # a one-line refusal (e.g. Phi in fp16 naming bf16 or fp32) is an answer, not a crash
        return {**out, "refused": str(exc), "seconds": round(time.perf_counter() - start, 1)}
    out["decisions"] = getattr(model, "labkit_decisions", None)
    shared = SharedModel(model)
    with contextlib.redirect_stdout(sys.stderr):  # the trainers' prints stay off the JSON
        out["fit_and_memory"] = fit_and_memory(arm, loaded, shared, config, tokenizer, rows, encoded, fraction, device,
                                               leftover)
        out["speed"] = tokens_per_second(card, shared, tokenizer, rows, encoded, arm.seq_len, device)
        out["stage03_step_vs_steady"] = step_ratio(out["fit_and_memory"], out["speed"])
        if arm.stage03:
            out["stage03"] = stage03(loaded, shared, config, tokenizer, rows, encoded, arm.seq_len, device, fraction)
    values = out["fit_and_memory"].pop("losses") + out["speed"].pop("losses")
    values += out.get("stage03", {}).pop("values", [])
    out["nonfinite"] = sum(1 for v in values if not math.isfinite(v))
    out["finite_values_checked"] = len(values)
    del shared, model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out
