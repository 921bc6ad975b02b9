"""`labkit runs --follow RUN` on a run that is still going: its stages and progress as they come, then its end."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from labkit.card.load import load_card
from labkit.cli.follow import follow
from labkit.core import progress
from labkit.core import runs as R

REPO = Path(__file__).resolve().parents[3]


def test_follow_prints_a_live_run_until_it_ends(tmp_path: Path) -> None:
    run = R.new_run(load_card(REPO / "params" / "smoke.yaml"), tmp_path)

    def the_run() -> None:  # what `labkit run` and the training kernel write, a little later
        time.sleep(0.5)
        R.record(run, "stage_started", stage="training")
        with open(run.dir / progress.FILE, "a") as handle:
            for step in (1, 2):
                handle.write(json.dumps({"stage": "training", "phase": "train", "done": step, "total": 2,
                                         "loss": 3.0 / step}) + "\n")
        time.sleep(0.5)
        R.record(run, "stage_done", stage="training", seconds=1.0)
        R.record(run, "failed", status="failed", stage="comparison", error="stage comparison failed")

    lines: list[str] = []
    writer = threading.Thread(target=the_run)
    writer.start()
    assert follow(run, lines.append, every=0.1) == "failed"
    writer.join()
    assert lines[0].startswith("following smoke/") and "(running)" in lines[0]
    assert lines.index("    training: step 2/2 · loss 1.5") < lines.index("  04_training.ipynb            done in 1.0 s")
    assert lines[-1].startswith("failed: stage comparison failed")
