"""Measure what a real training step costs in memory: the peak above the pre-step baseline (its time:
`labkit.preflight.timing`).

On CUDA the peak is `torch.cuda.max_memory_allocated`. On the CPU it is the process's peak
resident memory: Linux lets a process reset its high-water mark (VmHWM, via /proc/self/clear_refs),
so the peak is exact; elsewhere a thread samples the resident size every millisecond. Freed heap
memory is handed back to the OS (malloc_trim) before the baseline is read, so the baseline is what
is really in use.
"""

from __future__ import annotations

import gc
import re
import threading
from pathlib import Path
from typing import Any

import datasets
import psutil
import torch

from labkit.card.schema import Card
from labkit.core.allocator import release_promptly, trim
from labkit.core.device import on_cuda
from labkit.core.progress import task
from labkit.data.pairs import fixed_length_pairs
from labkit.errors import DataError
from labkit.data.prompting import IGNORE, encode_rows
from labkit.train.callbacks import StepTimer
from labkit.train.trainer import build_trainer

_STATUS = Path("/proc/self/status")
CUDA_METHOD = "cuda max_memory_allocated"  # PeakMemory's method on a GPU


def _status_kib(key: str) -> int | None:
    try:
        match = re.search(rf"^{key}:\s+(\d+) kB", _STATUS.read_text(), re.M)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _rss() -> int:
    kib = _status_kib("VmRSS")
    if kib is not None:
        return kib * 1024

    return psutil.Process().memory_info().rss


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return _status_kib("VmHWM") is not None


def touch_weights(model: Any) -> None:
    """Read every weight once: weights loaded from safetensors can be file-backed pages that only become
    resident when first used, which would otherwise be counted as the step's memory."""
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            if tensor.device.type == "cpu" and tensor.numel():
                tensor.view(-1)[:: max(1, 4096 // max(tensor.element_size(), 1))].sum()


def step_time_kept(measurement: dict[str, Any]) -> bool:
    """Whether a `memory_pass` also timed its steps as training runs them: on CUDA, where the measurement reads
    PyTorch's allocator statistics and changes nothing about the steps; not on the CPU, where the allocator is set for
    exact figures (`release_promptly`), which slows a step (`labkit.preflight.timing.timed_pass` times it after)."""
    return measurement["memory"]["method"] == CUDA_METHOD


def free_device_memory(device: str) -> int:
    """Bytes this process can still give to the weights and a training step on `device`.

    CUDA / ROCm: PyTorch's cache is emptied first (its cached blocks are free for this process, but `mem_get_info`
    counts them as used), and what this process already holds in tensors (e.g. the loaded model, which the
    estimate counts) is added back. CPU: the available system memory.
    """
    if on_cuda(device):
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        return int(torch.cuda.mem_get_info(device)[0]) + int(torch.cuda.memory_allocated(device))
    return int(psutil.virtual_memory().available)


class PeakMemory:
    """Context manager: the peak memory above the baseline taken on entry.

    Attributes (after exit):
        method: `CUDA_METHOD`, "VmHWM" or "sampled RSS".
        baseline, peak, delta: bytes.
    """

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.method = ""
        self.baseline = self.peak = self.delta = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "PeakMemory":
        if not on_cuda(self.device):
            release_promptly()
        trim()
        if on_cuda(self.device):
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.method, self.baseline = CUDA_METHOD, torch.cuda.memory_allocated(self.device)
            return self
        self.baseline = _rss()
        if _reset_hwm():
            self.method = "VmHWM"
        else:
            self.method, self.peak = "sampled RSS", self.baseline
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: Any) -> None:
        if on_cuda(self.device):
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device)
        elif self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, _rss())
        else:
            self.peak = (_status_kib("VmHWM") or 0) * 1024
        self.delta = max(0, self.peak - self.baseline)

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "baseline_bytes": self.baseline, "peak_bytes": self.peak, "delta_bytes": self.delta}


def fixed_length_dataset(tokenizer: Any, card: Card, rows: list[dict[str, Any]], seq_len: int, count: int,
                         padded: bool = True, encoded: list[Any] | None = None) -> Any:
    """Training examples of exactly `seq_len` tokens built from real rows (prompt masking kept).

    Encoded rows are concatenated and cut at `seq_len`; with `padded`, every second row is one token
    shorter, so each batch carries padding as dynamic padding almost always does. A window with no answer token
    (inside a prompt longer than `seq_len`) is skipped: the trainer would drop it and run out of batches.

    Args:
        tokenizer: the tokenizer.
        card: the card.
        rows: prepared training rows.
        seq_len: tokens per example.
        count: number of examples.
        padded: make batches carry one padding position.
        encoded: `encode_rows(tokenizer, card, rows)` when already computed (sft).
    Returns:
        a datasets.Dataset with input_ids and labels; for dpo/orpo cards, preference pairs whose chosen
        sequence has `seq_len` tokens (`labkit.data.pairs.fixed_length_pairs`).
    """
    if card.train.trainer != "sft":
        return fixed_length_pairs(tokenizer, card, rows, seq_len, count)

    encoded = encode_rows(tokenizer, card, rows) if encoded is None else encoded
    if not any(x != IGNORE for e in encoded for x in e.labels):
        raise DataError("no training row keeps an answer token after truncation to data.max_length: raise "
                        "data.max_length or shorten the prompts")
    examples, ids, labels, k = [], [], [], 0
    while len(examples) < count:
        while len(ids) < seq_len:
            ids += encoded[k % len(encoded)].input_ids
            labels += encoded[k % len(encoded)].labels
            k += 1
        cut = seq_len - (1 if padded and len(examples) % 2 else 0)
        if any(x != IGNORE for x in labels[:cut]):  # a window inside a long prompt has no loss: the trainer drops it
            examples.append({"input_ids": ids[:cut], "labels": labels[:cut]})
        ids, labels = ids[cut:], labels[cut:]
    return datasets.Dataset.from_list(examples)


def loss_fraction(tokenizer: Any, card: Card, rows: list[dict[str, Any]]) -> float:
    """The share of training tokens that carry a loss (completion tokens / all tokens), for the memory estimate.

    Args:
        tokenizer: the tokenizer.
        card: the card (prompt, max_length).
        rows: prepared training rows.
    Returns:
        a fraction in [0, 1] (1.0 when there are no rows: the upper bound).
    """
    encoded = encode_rows(tokenizer, card, rows)
    tokens = sum(len(e.input_ids) for e in encoded)
    return sum(sum(1 for x in e.labels if x != IGNORE) for e in encoded) / tokens if tokens else 1.0


def fixed_steps(steps: int) -> dict[str, Any]:
    """The trainer settings of a measured or timed pass: `steps` steps at a constant learning rate, one log line."""
    return dict(max_steps=steps, lr_scheduler_type="constant", warmup_steps=0, logging_steps=steps, disable_tqdm=True)


def memory_pass(card: Card, model: Any, tokenizer: Any, data: Any, seq_len: int, output_dir: Path,
                device: str = "cpu", steps: int = 2, **overrides: Any) -> dict[str, Any]:
    """Run `steps` complete training steps of the stage-04 trainer on `data` and measure their peak memory.

    The first step allocates the optimiser states; the second runs with them in place, so the peak over both is the
    steady-state peak of training. Run it before any unmeasured training in the process: the allocator is set for
    exact figures (`release_promptly`, which slows a CPU step), and the memory steps under glibc's own thresholds
    leave in the heap would be counted here as the step's (`labkit.preflight.timing.Phases`).

    Args:
        card: the card (micro-batch, optimiser, checkpointing, …).
        model: the model after `apply_method`, at its initial weights (they are in the baseline).
        tokenizer: the tokenizer.
        data: the training examples (`fixed_length_dataset`).
        seq_len: their tokens (for the progress line).
        output_dir: scratch folder for the trainer.
        device: the model's device.
        steps: optimiser steps.
        overrides: SFTConfig overrides (e.g. per_device_train_batch_size).
    Returns:
        {"memory": PeakMemory.as_dict(), "memory_pass_seconds": [...], "loss": [...]}.
    """
    timer = StepTimer()
    trainer = build_trainer(card, model, tokenizer, data, output_dir, device=device, **fixed_steps(steps), **overrides)
    trainer.add_callback(timer)
    touch_weights(model)
    with task(f"memory: {steps} steps at {seq_len} tokens, measured"), PeakMemory(device) as peak:
        trainer.train()
    loss = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {"memory": peak.as_dict(), "memory_pass_seconds": timer.seconds, "loss": loss}
