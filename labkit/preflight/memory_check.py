"""Stage 03's memory check: a real step measured at each representative length, set against the estimate.

`measure_lengths` runs every length in one trainer on the shared model (`labkit.preflight.shared.SharedModel`),
its memory first, then its time (`StepPlan`); `measure` (one length, one `labkit.preflight.measure.measure_step`)
stays for callers that measure a single length; `compare` sets the measurement against the estimate.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, TypedDict

import datasets
from transformers import TrainerCallback

from labkit.card.schema import Card
from labkit.preflight.measure import PeakMemory, fast_allocator, fixed_length_dataset, measure_step, release_promptly
from labkit.preflight.measure import time_evaluation, touch_weights
from labkit.preflight.memory import GIB
from labkit.preflight.records import MemoryEstimate
from labkit.train.callbacks import StepTimer
from labkit.train.trainer import build_trainer


class MemoryReport(TypedDict, total=False):
    """Stage 03's memory.json: the estimate and the measurement at each length, compared; generation's estimate."""

    lengths: dict[str, int]
    estimates: list[MemoryEstimate]
    measured: list[dict[str, Any]]
    comparison: list[dict[str, Any]]
    generation: dict[str, Any]


def loaded_bytes(model: Any) -> int:
    """Bytes of a loaded model's parameters and buffers (4-bit weights at their packed size)."""
    seen, total = set(), 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        key = tensor.data_ptr()
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


def measure(card: Card, make_model: Callable[[], Any], tokenizer: Any, rows: list[dict[str, Any]], seq_len: int,
            device: str = "cpu", eval_rows: list[dict[str, Any]] | None = None, encoded: list[Any] | None = None
            ) -> dict[str, Any]:
    """Two real steps of the stage-04 trainer at `seq_len`, measured, then timed (`measure_step`), on the model
    `make_model` returns with its initial weights.

    Args:
        card: the card.
        make_model: the shared model (or a fresh-model factory).
        tokenizer: the tokenizer.
        rows: prepared training rows.
        seq_len: tokens per example.
        device: the device.
        eval_rows: one evaluation batch of validation rows to time (None: no evaluation timed).
        encoded: the rows encoded once.
    Returns:
        `measure_step`'s result plus "weights_bytes" (counted) and "peak_bytes" (weights + step).
    """
    model = make_model()
    weights = loaded_bytes(model)
    result = measure_step(card, model, tokenizer, rows, seq_len, Path(tempfile.mkdtemp(prefix="labkit-mem-")),
                          device=device, eval_rows=eval_rows, encoded=encoded)
    return {**result, "weights_bytes": weights, "peak_bytes": weights + result["memory"]["delta_bytes"]}


def compare(estimates: list[MemoryEstimate], measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
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
        if not est.get("modelled", True):  # an architecture the estimate does not model: the measurement alone
            rows.append({"seq_len": est["seq_len"], "micro_batch": est["micro_batch"],
                         "weights_gib_loaded": got["weights_bytes"] / GIB, "step_gib_measured": step / GIB,
                         "step_error": None, "peak_gib_measured": got["peak_bytes"] / GIB,
                         "seconds_per_step": got["seconds_per_step"], "measured_by": got["memory"]["method"],
                         "note": est["note"]})
            continue
        rows.append({"seq_len": est["seq_len"], "micro_batch": est["micro_batch"],
                     "weights_gib_estimated": est["weights_bytes"] / GIB, "weights_gib_loaded": got["weights_bytes"] / GIB,
                     "step_gib_estimated": est["step_bytes"] / GIB, "step_gib_measured": step / GIB,
                     "step_error": (est["step_bytes"] - step) / step if step else None,
                     "peak_gib_estimated": est["peak_bytes"] / GIB, "peak_gib_measured": got["peak_bytes"] / GIB,
                     "peak_error": (est["peak_bytes"] - got["peak_bytes"]) / got["peak_bytes"],
                     "seconds_per_step": got["seconds_per_step"], "measured_by": got["memory"]["method"]})
    return rows


def step_plan(lengths: list[int], steps: int = 2) -> list[tuple[str, int]]:
    """The optimiser steps of `measure_lengths`' one trainer, in order: ("memory" | "time", tokens per example).

    Memory first, shortest length first: `steps` steps at the shortest (the first allocates the optimiser states,
    the second runs with them: the steady state), then one steady step at each longer length. Then the time,
    longest first: `steps` steps at the longest (the first grows the heap under the training allocator, the last is
    the steady step), then one steady step at each shorter length, which the longer steps' heap already holds.

    Args:
        lengths: the lengths to measure (repeats are measured once).
        steps: steps of the first length of each phase.
    Returns:
        one (phase, length) per optimiser step.
    """
    ascending = sorted(set(lengths))
    memory = [("memory", ascending[0])] * steps + [("memory", n) for n in ascending[1:]]
    time_ = [("time", ascending[-1])] * steps + [("time", n) for n in ascending[-2::-1]]
    return memory + time_


class _Phases(TrainerCallback):
    """Ends each length's memory window after its last memory step and opens the next; after the last memory step,
    switches glibc to the training allocator (`fast_allocator`) for the timed steps.

    Every window's peak is taken against the baseline read before the first step (the weights alone), so a
    later length's step, run with the optimiser states already allocated, reads as the steady step of a fresh
    trainer at that length would.
    """

    def __init__(self, plan: list[tuple[str, int]], device: str) -> None:
        self.plan, self.device = plan, device
        self.peaks: dict[int, PeakMemory] = {}
        self.window = PeakMemory(device)
        self.baseline = 0

    def open(self) -> None:
        """The first window, entered before the trainer runs (its baseline is every window's)."""
        self.window.__enter__()
        self.baseline = self.window.baseline

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
        done = state.global_step
        phase, length = self.plan[done - 1]
        following = self.plan[done] if done < len(self.plan) else ("end", 0)
        if phase != "memory" or following == (phase, length):
            return
        self.window.__exit__(None, None, None)
        self.peaks[length] = self.window
        if following[0] == "memory":
            self.window = PeakMemory(self.device)
            self.window.__enter__()
        elif self.device.split(":")[0] != "cuda":
            fast_allocator()

    def memory(self, length: int) -> dict[str, Any]:
        """The window of `length` as `PeakMemory.as_dict`, its baseline and delta against the first window's."""
        peak = self.peaks[length]
        return {"method": peak.method, "baseline_bytes": self.baseline, "peak_bytes": peak.peak,
                "delta_bytes": max(0, peak.peak - self.baseline)}


def measure_lengths(card: Card, make_model: Callable[[], Any], tokenizer: Any, rows: list[dict[str, Any]],
                    encoded: list[Any] | None, lengths: dict[str, int], estimates: list[MemoryEstimate],
                    device: str = "cpu", eval_rows: list[dict[str, Any]] | None = None, steps: int = 2) -> MemoryReport:
    """Real steps of one stage-04 trainer at each of stage 03's lengths, measured, then timed, against the estimates.

    One trainer runs `step_plan`: every length's memory (under `release_promptly`, exact figures) before any step
    runs under the training allocator, so no measurement reads the heap a timed step left behind; then the timed
    steps (`fast_allocator`, as training runs), then one evaluation of `eval_rows` (sft). Two equal lengths (a
    packed card's p95 and max are often both max_length) are one measurement, recorded for both.

    Args:
        card, make_model, tokenizer, rows, encoded, device: as for `measure`.
        lengths: {"p95": tokens, "max": tokens}.
        estimates: the estimate at each length, in the same order.
        eval_rows: one evaluation batch of validation rows, timed once.
        steps: steps of the first length of each phase.
    Returns:
        {"lengths", "estimates", "measured", "comparison"}; each measurement as `measure` gives it
        ("step_seconds": the length's timed steps, "memory_pass_seconds": its memory steps).
    """
    model = make_model()
    weights = loaded_bytes(model)
    t = card.train
    micro, accum = t.micro_batch, t.grad_accum
    plan = step_plan(list(lengths.values()), steps)
    parts = [fixed_length_dataset(tokenizer, card, rows, n, micro * accum * plan.count((phase, n)), encoded=encoded)
             for phase, n in dict.fromkeys(plan)]
    sft = t.trainer == "sft"
    trainer = build_trainer(card, model, tokenizer, datasets.concatenate_datasets(parts),
                            Path(tempfile.mkdtemp(prefix="labkit-mem-")), device=device,
                            eval_rows=(eval_rows or None) if sft else None, eval_strategy="no", max_steps=len(plan),
                            lr_scheduler_type="constant", warmup_steps=0, logging_steps=1, disable_tqdm=True,
                            train_sampling_strategy="sequential")
    timer, phases = StepTimer(), _Phases(plan, device)
    trainer.add_callback(timer)
    trainer.add_callback(phases)
    touch_weights(model)
    try:
        phases.open()
        trainer.train()
        evaluation = time_evaluation(trainer) if eval_rows and sft else {"eval_seconds": None, "eval_tokens": None}
    finally:
        if device.split(":")[0] != "cuda":
            release_promptly()
    losses = {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}
    del trainer
    done: dict[int, dict[str, Any]] = {}
    for n in dict.fromkeys(lengths.values()):
        at = {phase: [i for i, p in enumerate(plan) if p == (phase, n)] for phase in ("memory", "time")}
        timed = [timer.seconds[i] for i in at["time"]]
        done[n] = {"seq_len": n, "micro_batch": micro, "grad_accum": accum, "memory": phases.memory(n),
                   "step_seconds": timed, "seconds_per_step": timed[-1] if timed else None,
                   "memory_pass_seconds": [timer.seconds[i] for i in at["memory"]],
                   "loss": [losses[i + 1] for i in at["memory"] if i + 1 in losses],
                   **(evaluation if not done else {"eval_seconds": None, "eval_tokens": None}),
                   "weights_bytes": weights}
        done[n]["peak_bytes"] = weights + done[n]["memory"]["delta_bytes"]
    measured = [done[n] for n in lengths.values()]
    return {"lengths": lengths, "estimates": estimates, "measured": measured, "comparison": compare(estimates, measured)}

