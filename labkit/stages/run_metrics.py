"""Run metrics: a trained run's time, throughput, hardware utilisation, memory and cost, read from its stage 03/04 files.

Tokens, tokens per second and MFU are counted during training (training/outcome.json → "cost", written by
`labkit.train.token_count`; docs/cost.md); stage 03's estimate of the tokens stays as `predicted_tokens`. A run
trained before labkit counted them has None there.

They are metrics like the answer metrics (a card may name them as primary metric or guardrail), judged against a
reference run: `experiment.target.against: <variant>` names a sibling variant whose latest completed run is that
reference (`reference_run`). Stage 05 adds them to tuned_metrics.json under "run"; `labkit compare` and
`labkit final` read them the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from labkit.core import io
from labkit.core.protocol import experiment_runs
from labkit.stages import records
from labkit.stages.records import TUNED_METRICS, read_outcome


class RunMetrics(TypedDict):
    """A run's time, throughput, memory and cost (None where its files do not say)."""

    train_seconds: float | None  # the trainer's train_runtime (training/outcome.json)
    steps: int | None
    tokens_seen: int | None  # non-padding tokens fed to the model in training, counted over every process
    loss_tokens: int | None  # the tokens of those whose label is scored
    tokens_per_second: float | None  # this session's counted tokens / its seconds in optimiser steps
    mfu: float | None  # model FLOPs utilisation: flops_per_token × tokens_per_second / peak_flops
    flops_per_token: float | None  # 6N (full training) or 4N + 2N_trainable (adapters), docs/cost.md
    peak_flops: float | None  # FLOP/s of all the processes' devices: spec sheet (GPU) or measured (CPU)
    flops_convention: str | None  # the rule and where the peak comes from
    peak_memory_gib: float | None  # the largest step stage 03 measured
    cost: float | None  # hours × processes × budget.price_per_gpu_hour
    predicted_train_seconds: float | None  # stage 03's time plan
    predicted_tokens: float | None  # stage 03's training tokens per epoch × the epochs trained


def _json(path: Path) -> dict[str, Any]:
    return io.read_json(path) if path.exists() else {}


def run_metrics(run_dir: Path, price_per_gpu_hour: float = 0.0) -> RunMetrics:
    """The run metrics of a run folder, from its stage 03 and 04 files.

    Args:
        run_dir: the run folder.
        price_per_gpu_hour: the card's budget.price_per_gpu_hour.
    Returns:
        the RunMetrics.
    """
    outcome: dict[str, Any] = dict(read_outcome(run_dir) or {})
    fit = _json(run_dir / "parameter_check" / records.FIT).get("plan") or {}
    memory = _json(run_dir / "parameter_check" / records.MEMORY).get("comparison") or []
    seconds = (outcome.get("metrics") or {}).get("train_runtime")
    epochs = (outcome.get("metrics") or {}).get("epoch")
    tokens = fit.get("train_tokens") * epochs if fit.get("train_tokens") and epochs else None
    peaks = [r["peak_gib_measured"] for r in memory if r.get("peak_gib_measured") is not None]
    world = outcome.get("world_size") or 1
    counted = outcome.get("cost") or {}
    convention = (f"{counted['convention']}; peak: {counted['peak_source']}, {counted['precision']}"
                  if counted.get("convention") else None)
    return {"train_seconds": seconds, "steps": outcome.get("steps"), "tokens_seen": counted.get("tokens"),
            "loss_tokens": counted.get("loss_tokens"), "tokens_per_second": counted.get("tokens_per_second"),
            "mfu": counted.get("mfu"), "flops_per_token": counted.get("flops_per_token"),
            "peak_flops": counted.get("peak_flops"), "flops_convention": convention,
            "peak_memory_gib": max(peaks) if peaks else None,
            "cost": seconds / 3600 * world * price_per_gpu_hour if seconds is not None else None,
            "predicted_train_seconds": fit.get("train_seconds"), "predicted_tokens": tokens}


def reference_run(root: Path, experiment: str, variant: str) -> dict[str, Any] | None:
    """The latest completed run of a variant of the experiment (with stage 05's results), or None.

    Args:
        root: the runs root.
        experiment: the experiment id.
        variant: the variant named by experiment.target.against.
    Returns:
        the registry row ({"run_id", "variant", "status", "dir", ...}) or None.
    """
    done = [r for r in experiment_runs(root, experiment)
            if r["variant"] == variant and r["status"] == "completed" and (Path(r["dir"]) / "comparison" / TUNED_METRICS).exists()]
    return done[-1] if done else None


def reference_metrics(run_dir: Path, price_per_gpu_hour: float) -> dict[str, Any]:
    """A reference run's tuned metrics (stage 05) with its run metrics under "run"."""
    metrics = io.read_json(run_dir / "comparison" / TUNED_METRICS)
    metrics["run"] = run_metrics(run_dir, price_per_gpu_hour)
    return metrics
