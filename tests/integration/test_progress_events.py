"""The streamed output of `labkit run` (the session's smoke run): no silent stage — stage 03's checks, the model
loading and the data preparation report as they go, and each stage's duration is the one `--follow` prints."""

from __future__ import annotations

from labkit.core import progress
from labkit.core import runs as R


def _section(lines: list[str], stage: str) -> list[str]:
    """The lines printed while a stage ran: from its `[i/5] … …` line to its `done in` line."""
    name = R.NOTEBOOKS[stage]
    start = next(i for i, line in enumerate(lines) if name in line and line.rstrip().endswith("…"))
    end = next(i for i, line in enumerate(lines) if name in line and " done in " in line)
    return lines[start + 1:end]


def test_the_smoke_run_streams_stage_03_and_model_loading(smoke_run) -> None:
    run, proc = smoke_run
    lines = proc.stdout.splitlines()
    check = _section(lines, "parameter_check")
    for said in ("parameter_check: loading model tiny:llama on ", "parameter_check: update check: 2 optimiser steps done in ",
                 "parameter_check: memory: measuring a full step at ", "parameter_check: timing a full step at ",
                 "parameter_check: accumulation check: arm 2/2, ", "parameter_check: checkpointing check: arm 2/2, ",
                 "parameter_check: checkpointing check: 2 arms done in "):
        assert any(line.startswith("    " + said) for line in check), (said, check)
    baseline = _section(lines, "baseline")
    loading = next(i for i, line in enumerate(baseline) if "baseline: loading model tiny:llama" in line)
    generating = next(i for i, line in enumerate(baseline) if " examples" in line)
    assert loading < generating, baseline  # the model's loading is said before the first answers
    assert any("baseline: data: encoding checks on train and validation" in line for line in baseline), baseline


def test_run_prints_each_stage_duration_from_the_progress_marks(smoke_run) -> None:
    run, proc = smoke_run
    events = progress.read_events(run)
    for i, stage in enumerate(R.STAGES, 1):
        seconds = progress.stage_seconds(run, stage, events)
        assert seconds is not None and f"[{i}/5] {R.NOTEBOOKS[stage]:<28} done in {seconds:6.1f} s" in proc.stdout
