"""A stage kernel's start under `labkit run` (`labkit.core.kernel`): plain-text progress bars and the libraries' log
records in the run's log, before any library is imported. Run in a fresh interpreter: both change process state."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from labkit.core.kernel import LOG, start_line

REPO = Path(__file__).resolve().parents[3]


def test_kernel_start_line_sets_plain_bars_and_routes_library_logs(tmp_path: Path) -> None:
    run = tmp_path / "a run's folder"  # a space and a quote survive the line
    run.mkdir()
    code = "\n".join([
        start_line(run, "baseline"),
        "import logging, sys, tqdm.auto",
        "logging.getLogger('bitsandbytes.backends').warning('a notice at import')",  # no handler of its own
        "print(tqdm.auto.tqdm.__name__, 'transformers' in sys.modules, 'datasets' in sys.modules)",
    ])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["StdoutTqdm", "False", "False"]  # nothing heavy imported by the start itself
    assert proc.stderr == ""  # the record went to the run's log, not to stderr (an archived notebook's red block)
    log = (run / LOG).read_text(encoding="utf-8")
    assert "baseline bitsandbytes.backends WARNING: a notice at import" in log


def test_without_the_start_the_record_reaches_stderr(tmp_path: Path) -> None:
    code = "import logging\nlogging.getLogger('bitsandbytes.backends').warning('a notice at import')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "a notice at import" in proc.stderr  # what the start prevents
