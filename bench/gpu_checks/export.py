"""The GPU check's export: a small completed run of the QLoRA recipe, exported, and its reload check on a few samples.

The run is made by labkit's own stage code, without the notebooks (papermill's kernels would take minutes): a run
folder (`labkit.core.runs.new_run`), the data prepared as stage 01 prepares it, stage 04's training
(`labkit.stages.training.train`: 8 steps, checkpoints, the adapter saved), stage 05's evaluation of the tuned model
(`labkit.stages.comparison.evaluate_tuned`: tuned_predictions.jsonl, the reference the reload check compares with);
the stages are then recorded done and the run completed. `labkit.export.deliver.export` delivers it with `merged/`
and runs the reload check in a fresh process on the first evaluation batch (`sample=1`) on this device.
"""

from __future__ import annotations

import contextlib
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .models import card_data, write_card


def completed_run(source: str, precision: str, root: Path) -> Any:
    """Make a completed run of the bench card on `source` under `root` (see the module docstring).

    Args:
        source: the model source.
        precision: "bf16", "fp16" or "fp32".
        root: the runs root.
    Returns:
        (the Run, {"losses", "metrics", "seconds"}).
    """
    from labkit.core import io
    from labkit.core import runs as R
    from labkit.core.environment import capture
    from labkit.stages import comparison, training
    from labkit.stages.context import Stage

    short = precision == "fp32"  # the CPU dry run: bitsandbytes' CPU 4-bit layers take seconds a step
    loaded = write_card(card_data(source, precision, True, 2 if short else 4, variant="export", short=short),
                        Path(tempfile.mkdtemp()))
    run = R.new_run(loaded, root)
    io.write_json(run.dir / "env.json", capture())
    start = time.perf_counter()
    for name in R.STAGES[:3]:  # data prepared as stage 01 prepares it; 02 and 03 leave nothing the export reads
        stage = Stage(name, loaded, run, interactive=False)
        stage.prepare_data()
        R.record(run, "stage_done", stage=name, seconds=0.0)
    stage = Stage("training", loaded, run, interactive=False)
    outcome = training.train(stage)
    R.record(run, "stage_done", stage="training", seconds=round(time.perf_counter() - start, 1))
    stage = Stage("comparison", loaded, run, interactive=False)
    _, metrics = comparison.evaluate_tuned(stage)
    R.record(run, "stage_done", stage="comparison", seconds=round(time.perf_counter() - start, 1))
    R.record(run, "completed", status="completed")
    history = io.read_jsonl(run.dir / "training" / "log_history.jsonl")
    losses = [float(e[k]) for e in history for k in ("loss", "grad_norm", "eval_loss") if e.get(k) is not None]
    return run, {"steps": outcome["steps"], "losses": losses,
                 "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))},
                 "seconds": round(time.perf_counter() - start, 1)}


def export_check(source: str, device: str, precision: str) -> dict[str, Any]:
    """A completed run on `source`, exported with merged/ and reload-checked on the first evaluation batch.

    Args:
        source: the model source (the random Llama: on a GPU the export's memory is that of a 1B model).
        device: the device of the run and of the reload check.
        precision: "bf16" on a GPU, "fp32" on the CPU.
    Returns:
        {"run", "ok", "export_error", "reload_check": {...the check's report, mismatches left out}, "merged_files",
        "nonfinite", "seconds"}.
    """
    from labkit.errors import ExportCheckFailed
    from labkit.export.deliver import export

    start = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="labkit-gpu-export-")) / "runs"
    with contextlib.redirect_stdout(sys.stderr):
        run, made = completed_run(source, precision, root)
        export_start = time.perf_counter()
        try:
            result = export(run.dir, root, merged=True, sample=1, device=device)
            report, error = result["reload_check"], None
        except ExportCheckFailed as exc:  # the export is kept, its reload_check.json says why
            from labkit.core import io

            report, error = io.read_json(run.dir / "export" / "reload_check.json"), str(exc)
    kept = {k: v for k, v in report.items() if k not in ("mismatches", "export_dir")}
    merged = sorted(p.name for p in (run.dir / "export" / "merged").glob("*")) if (run.dir / "export").exists() else []
    values = made.pop("losses") + [v for k, v in report.items() if k.startswith("logits_") and isinstance(v, float)]
    return {"model": source, "run": made, "ok": bool(report.get("ok")) and error is None, "export_error": error,
            "reload_check": kept, "merged_files": merged, "nonfinite": sum(1 for v in values if not math.isfinite(v)),
            "export_seconds": round(time.perf_counter() - export_start, 1),
            "seconds": round(time.perf_counter() - start, 1)}
