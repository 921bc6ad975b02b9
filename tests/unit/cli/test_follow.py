"""`labkit runs --follow RUN` on a run that is still going: its stages and progress as they come, then its end."""

from __future__ import annotations

import json
import os
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


def test_follow_latest_and_a_prefix_name_a_run(tmp_path: Path, capsys, monkeypatch) -> None:
    from labkit.cli.follow import resolve_run
    from labkit.cli.main import main
    from labkit.errors import MissingInput

    try:
        resolve_run("latest", tmp_path)
        raise AssertionError("an empty runs root has no latest run")
    except MissingInput as exc:
        assert "no runs under" in str(exc)
    first = R.new_run(load_card(REPO / "params" / "smoke.yaml"), tmp_path)
    second = R.new_run(load_card(REPO / "params" / "smoke-dpo.yaml"), tmp_path)
    third = R.new_run(load_card(REPO / "params" / "smoke.yaml"), tmp_path)  # same variant, same second: ".2"
    assert resolve_run("latest", tmp_path).dir == third.dir
    assert resolve_run(second.run_id[:8], tmp_path).dir == second.dir  # a unique prefix
    assert resolve_run(first.run_id, tmp_path).dir == first.dir  # an exact id, though a prefix of the third
    for run in (first, second, third):
        R.record(run, "completed", status="completed")
    monkeypatch.setenv("LABKIT_RUNS", str(tmp_path))
    assert main(["runs", "--follow", "latest"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"following smoke/{third.run_id} (completed)"
    assert main(["runs", "--follow", "tiny-"]) == 2  # ambiguous: one line naming the matches
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "matches 3 runs" in err
    assert all(f"{r.experiment}/{r.run_id}" in err for r in (first, second, third))


def test_run_and_follow_print_one_duration_for_a_stage(tmp_path: Path, monkeypatch) -> None:
    """The runner's `execute_stage` returns, and `follow` prints, `stage_seconds` of the marks the runner's Tail
    writes — not the kernel's own count recorded by the stage (here a different number on purpose)."""
    import nbformat

    from labkit.cli.runner import execute_stage

    nb_dir = tmp_path / "notebooks"
    nb_dir.mkdir()
    notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                                 "display_name": "Python 3"},
                                                  "language_info": {"name": "python"}})
    params = nbformat.v4.new_code_cell('card = ""\nrun_dir = ""')
    params.metadata["tags"] = ["parameters"]
    notebook.cells = [params, nbformat.v4.new_code_cell("import time\ntime.sleep(0.3)")]
    nbformat.write(notebook, nb_dir / R.NOTEBOOKS["baseline"])
    run = R.new_run(load_card(REPO / "params" / "smoke.yaml"), tmp_path / "runs")
    for name in ("LABKIT_BATCH", "LABKIT_PROGRESS", "LABKIT_STAGE", "LABKIT_STEP_SECONDS", "TQDM_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHONUNBUFFERED", "")  # set before: its value is kept
    before = dict(os.environ)
    lines: list[str] = []
    seconds = execute_stage(run, "baseline", nb_dir, lines.append)
    # the kernel's variables end with the stage: unset ones are unset again, set ones keep their value (also when a
    # later labkit.run in this process sets and puts back its own)
    assert dict(os.environ) == before
    assert seconds == progress.stage_seconds(run.dir, "baseline") and seconds >= 0.3
    R.record(run, "stage_done", stage="baseline", seconds=0.01)  # what the kernel counted: not what is printed
    R.record(run, "completed", status="completed")
    printed: list[str] = []
    follow(run, printed.append)
    assert f"  01_baseline.ipynb            done in {seconds:.1f} s" in printed
