"""Stage 03's memory check: a real step measured at each representative length, set against the estimate, then timed.

`labkit.preflight.measure.memory_pass` measures and `labkit.preflight.timing.timed_pass` times; this module runs
them on the shared model (`labkit.preflight.shared.SharedModel`) at stage 03's lengths, once per distinct length:
every length measured first (`measure_lengths`), while no unmeasured step has run in the process, and every length
timed after (`time_lengths`, with the allocator a training process has), then compared (`compare`). On CUDA the
measured steps are already timed as training runs them, so each length runs once (`step_time_kept`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, TypedDict

from labkit.card.schema import Card
from labkit.core.progress import task
from labkit.preflight.measure import fixed_length_dataset, memory_pass
from labkit.preflight.memory import GIB
from labkit.preflight.records import MemoryEstimate
from labkit.preflight.timing import time_measured

STEPS = 2  # steps of each measured and timed pass: the first allocates the optimiser states, the second runs with them


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
            device: str = "cpu", encoded: list[Any] | None = None) -> dict[str, Any]:
    """Two real steps of the stage-04 trainer at `seq_len`, their peak memory measured (`memory_pass`), on the model
    `make_model` returns with its initial weights.

    Args:
        card: the card.
        make_model: the shared model (or a fresh-model factory).
        tokenizer: the tokenizer.
        rows: prepared training rows.
        seq_len: tokens per example.
        device: the device.
        encoded: the rows encoded once.
    Returns:
        {"seq_len", "micro_batch", "grad_accum", "memory", "memory_pass_seconds", "loss", "weights_bytes" (counted),
         "peak_bytes" (weights + step)}.
    """
    model = make_model()
    weights = loaded_bytes(model)
    data = _data(card, tokenizer, rows, seq_len, encoded)
    result = memory_pass(card, model, tokenizer, data, seq_len, Path(tempfile.mkdtemp(prefix="labkit-mem-")), device)
    return {"seq_len": seq_len, "micro_batch": card.train.micro_batch, "grad_accum": card.train.grad_accum, **result,
            "weights_bytes": weights, "peak_bytes": weights + result["memory"]["delta_bytes"]}


def _data(card: Card, tokenizer: Any, rows: list[dict[str, Any]], seq_len: int, encoded: list[Any] | None) -> Any:
    """Two steps' worth of examples of exactly `seq_len` tokens (the same for the measured and the timed pass)."""
    t = card.train
    return fixed_length_dataset(tokenizer, card, rows, seq_len, t.micro_batch * t.grad_accum * STEPS, encoded=encoded)


def time_length(card: Card, make_model: Callable[[], Any], tokenizer: Any, rows: list[dict[str, Any]],
                measured: dict[str, Any], device: str = "cpu", eval_rows: list[dict[str, Any]] | None = None,
                encoded: list[Any] | None = None) -> dict[str, Any]:
    """The same two steps at the measured length, timed, then one evaluation batch of `eval_rows` when given
    (`time_measured`: on CUDA the measured steps are the timed ones, and only the evaluation batch runs).

    Returns:
        {"step_seconds", "seconds_per_step", "eval_seconds", "eval_tokens", "timed_by"}.
    """
    n = measured["seq_len"]
    return time_measured(card, make_model, tokenizer, _data(card, tokenizer, rows, n, encoded), n, measured,
                         Path(tempfile.mkdtemp(prefix="labkit-time-")), device, STEPS, eval_rows)


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
                         "measured_by": got["memory"]["method"], "note": est["note"], **_timed(got)})
            continue
        rows.append({"seq_len": est["seq_len"], "micro_batch": est["micro_batch"],
                     "weights_gib_estimated": est["weights_bytes"] / GIB, "weights_gib_loaded": got["weights_bytes"] / GIB,
                     "step_gib_estimated": est["step_bytes"] / GIB, "step_gib_measured": step / GIB,
                     "step_error": (est["step_bytes"] - step) / step if step else None,
                     "peak_gib_estimated": est["peak_bytes"] / GIB, "peak_gib_measured": got["peak_bytes"] / GIB,
                     "peak_error": (est["peak_bytes"] - got["peak_bytes"]) / got["peak_bytes"],
                     "measured_by": got["memory"]["method"], **_timed(got)})
    return rows


def _timed(measured: dict[str, Any]) -> dict[str, Any]:
    """The step time of a measurement once `time_lengths` timed it ({} before)."""
    return {"seconds_per_step": measured["seconds_per_step"]} if "seconds_per_step" in measured else {}


def measure_lengths(card: Card, make_model: Callable[[], Any], tokenizer: Any, rows: list[dict[str, Any]],
                    encoded: list[Any] | None, lengths: dict[str, int], device: str = "cpu") -> list[dict[str, Any]]:
    """`measure` at each of stage 03's lengths; two equal lengths (a packed card's p95 and max are often both
    max_length) are one measurement, recorded for both.

    Args:
        card, make_model, tokenizer, rows, encoded, device: as for `measure`.
        lengths: {"p95": tokens, "max": tokens}.
    Returns:
        one measurement per length, in the order of `lengths`.
    """
    done = _once_per_length(list(lengths.values()), "memory: measuring a full step",
                            lambda n, first: measure(card, make_model, tokenizer, rows, n, device, encoded=encoded))
    return [done[n] for n in lengths.values()]


def time_lengths(card: Card, make_model: Callable[[], Any], tokenizer: Any, rows: list[dict[str, Any]],
                 encoded: list[Any] | None, measured: list[dict[str, Any]], device: str = "cpu",
                 eval_rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """`time_length` at each measured length (equal lengths timed once; on CUDA the measured steps' own times), the
    evaluation batch timed once, with the first; each measurement with its times added.

    Args:
        card, make_model, tokenizer, rows, encoded, device: as for `measure`.
        measured: `measure_lengths`' answer.
        eval_rows: one evaluation batch of validation rows.
    Returns:
        the measurements, each with "step_seconds", "seconds_per_step", "eval_seconds", "eval_tokens" and
        "timed_by".
    """
    by_length = {m["seq_len"]: m for m in measured}
    done = _once_per_length(list(by_length), "timing a full step",
                            lambda n, first: time_length(card, make_model, tokenizer, rows, by_length[n], device,
                                                         eval_rows if first else None, encoded))
    return [{**m, **done[m["seq_len"]]} for m in measured]


def _once_per_length(lengths: list[int], what: str, run: Callable[[int, bool], dict[str, Any]]
                     ) -> dict[int, dict[str, Any]]:
    """`run(n, first)` once per distinct length n, in order, each reported as a progress task; by length."""
    done: dict[int, dict[str, Any]] = {}
    distinct = list(dict.fromkeys(lengths))
    for i, n in enumerate(distinct, 1):
        with task(f"{what} at {n} tokens (length {i}/{len(distinct)})"):
            done[n] = run(n, not done)
    return done


def report(lengths: dict[str, int], estimates: list[MemoryEstimate], measured: list[dict[str, Any]]) -> MemoryReport:
    """memory.json's lengths, estimates, measurements and their comparison (`compare`)."""
    return {"lengths": lengths, "estimates": estimates, "measured": measured, "comparison": compare(estimates, measured)}
