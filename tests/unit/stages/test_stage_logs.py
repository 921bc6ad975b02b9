"""A stage's kernel under `labkit run`: plain-text bars on stdout and the libraries' logs in the run's log, set by
`open_stage` through `labkit.core.kernel` (`_quiet_batch`, `capture_library_logs`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import logging, sys
from pathlib import Path
import tqdm.auto
from labkit.stages.context import _quiet_batch, capture_library_logs
_quiet_batch()
print(tqdm.auto.tqdm.__name__)
path = capture_library_logs(Path(sys.argv[1]), "baseline")
logging.getLogger("transformers.modeling_utils").warning("weights loaded")
print(path, [type(h).__name__ for h in logging.getLogger("transformers").handlers])
"""


def _run(tmp_path: Path, batch: bool) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "LABKIT_BATCH"} | ({"LABKIT_BATCH": "1"} if batch else {})
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "weights loaded" not in proc.stderr  # the record went to the run's log, not to stderr
    return proc.stdout.splitlines()


def test_batch_kernel_gets_plain_bars_and_the_library_log(tmp_path: Path) -> None:
    lines = _run(tmp_path, batch=True)
    log = tmp_path / "logs" / "libraries.log"
    assert lines[0] == "StdoutTqdm"
    assert lines[1] == f"library messages (transformers, datasets, bitsandbytes, warnings) are logged to {log}"
    assert lines[2] == f"{log} ['FileHandler']"  # transformers' own stderr handler removed
    assert "baseline transformers.modeling_utils WARNING: weights loaded" in log.read_text()


def test_a_notebook_run_by_hand_keeps_its_widgets(tmp_path: Path) -> None:
    assert _run(tmp_path, batch=False)[0] != "StdoutTqdm"
