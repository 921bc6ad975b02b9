"""Stage 03's memory check: a real step measured at each representative length, set against the estimate.

`labkit.preflight.measure.measure_step` measures; this module runs it on the shared model
(`labkit.preflight.shared.SharedModel`) at stage 03's lengths, once per distinct length, and compares.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, TypedDict

from labkit.card.schema import Card
from labkit.core.progress import task
from labkit.preflight.measure import measure_step
from labkit.preflight.memory import GIB
from labkit.preflight.records import MemoryEstimate


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


def measure_lengths(card: Card, make_model: Callable[[], Any], tokenizer: Any, rows: list[dict[str, Any]],
                    encoded: list[Any] | None, lengths: dict[str, int], estimates: list[MemoryEstimate],
                    device: str = "cpu", eval_rows: list[dict[str, Any]] | None = None) -> MemoryReport:
    """`measure` at each of stage 03's lengths, against the estimates.

    Two equal lengths (a packed card's p95 and max are often both max_length) are one measurement, recorded for
    both; the evaluation batch (the same rows whatever the training length) is timed once, with the first length.

    Args:
        card, make_model, tokenizer, rows, encoded, device: as for `measure`.
        lengths: {"p95": tokens, "max": tokens}.
        estimates: the estimate at each length, in the same order.
        eval_rows: one evaluation batch of validation rows.
    Returns:
        {"lengths", "estimates", "measured", "comparison"}.
    """
    done: dict[int, dict[str, Any]] = {}
    distinct = list(dict.fromkeys(lengths.values()))
    for i, n in enumerate(distinct, 1):
        with task(f"memory: measuring a full step at {n} tokens (length {i}/{len(distinct)})"):
            done[n] = measure(card, make_model, tokenizer, rows, n, device, eval_rows=None if done else eval_rows,
                              encoded=encoded)
    measured = [done[n] for n in lengths.values()]
    return {"lengths": lengths, "estimates": estimates, "measured": measured, "comparison": compare(estimates, measured)}
