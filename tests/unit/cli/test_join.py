"""A machine that joins a run on several machines (`labkit run --join ID`) and finds no head fails in one line,
exit 2, within LABKIT_JOIN_TIMEOUT: no run folder appears, or the head's stage 04 started but its port stays closed.
Refusals of the command line itself are one line too."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO

from labkit.card.load import dump_yaml, load_card


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(runs: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SKYPILOT_"))}
    environ.update({"PYTHONPATH": str(REPO), "LABKIT_RUNS": str(runs), "NODE_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                    "LABKIT_JOIN_TIMEOUT": "2", **env})
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "labkit", "run", *args], capture_output=True, text=True,
                          env=environ, cwd=runs.parent, timeout=120)
    return done, time.monotonic() - start


def _lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]


def test_a_run_that_never_appears_fails_in_one_line_within_the_timeout(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    done, seconds = _join(runs, "--join", "never-there", MASTER_PORT=str(_free_port()))
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = _lines(done)
    assert line.startswith("labkit: error: labkit run --join never-there: no run never-there appeared under "
                           f"{runs} within 2 s (LABKIT_JOIN_TIMEOUT): start the head first"), line
    assert "--runs or LABKIT_RUNS" in line and seconds < 30
    assert not runs.exists()  # nothing created


def _fake_head_run(runs: Path, tmp_path: Path) -> Path:
    """A run folder as the head leaves it when its stage 04 has started (status, card), with no head listening."""
    card = tmp_path / "two.yaml"
    card.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\ntrain: {{micro_batch: 2}}\ndistributed: "
                    "{launcher: accelerate, strategy: ddp, num_processes: 2, num_machines: 2}\n")
    run = runs / "smoke" / "r-closed"
    run.mkdir(parents=True)
    (run / "card.yaml").write_text(dump_yaml(load_card(card).resolved))
    status = {"run_id": run.name, "experiment": "smoke", "status": "running", "pid": 1, "host": "head",
              "stages": {"training": {"status": "started", "time": "2026-01-01T00:00:00Z"}}}
    (run / "status.json").write_text(json.dumps(status))
    return run


def test_a_head_whose_port_is_closed_fails_in_one_line_and_the_run_is_untouched(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = _fake_head_run(runs, tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    port = _free_port()
    done, seconds = _join(runs, "--join", "r-closed", MASTER_PORT=str(port))
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in _lines(done) if line.startswith("labkit: error:")]
    assert len(errors) == 1 and f"the head 127.0.0.1:{port} did not accept a connection within 2 s" in errors[0]
    assert "MASTER_PORT" in errors[0] and seconds < 30
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    log = run / "logs" / "machine-1.log"
    assert set(after) - set(before) == {log} and all(after[p] == before[p] for p in before)  # only its log
    assert "join smoke/r-closed as machine 1 of 2" in log.read_text()
    assert not (runs / "registry.jsonl").exists()


def test_join_refusals_are_one_line(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _fake_head_run(runs, tmp_path)
    cases = {("--join", "r-closed", str(REPO / "params" / "smoke.yaml")): "takes no card",
             ("--join", "a*b"): "a run id is a folder name",
             ("--run-id", "a", "--resume", "b"): "--run-id names one new run"}
    for args, words in cases.items():
        done, _ = _join(runs, *args, MASTER_PORT=str(_free_port()))
        assert done.returncode == 2 and len(_lines(done)) == 1 and words in _lines(done)[0], (args, _lines(done))
    run = runs / "smoke" / "r-closed"
    head, _ = _join(runs, "--join", str(run), NODE_RANK="0", MASTER_PORT=str(_free_port()))  # the folder's path
    assert head.returncode == 2 and "this machine is rank 0" in _lines(head)[-1], _lines(head)


def test_a_head_whose_run_failed_before_training_is_not_waited_for_past_the_timeout(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = _fake_head_run(runs, tmp_path)
    status = json.loads((run / "status.json").read_text())
    status.update(status="failed", stages={"parameter_check": {"status": "failed"}})
    (run / "status.json").write_text(json.dumps(status))
    done, seconds = _join(runs, "--join", "r-closed", MASTER_PORT=str(_free_port()))
    assert done.returncode == 2 and seconds < 30, done.stdout + done.stderr
    assert "did not start stage 04 (its status: failed) and showed no sign of life for 2 s" in _lines(done)[-1]


def test_run_id_resumes_an_unfinished_run_and_only_the_head_starts_one(tmp_path: Path) -> None:
    """`labkit run CARD --run-id ID` again (a managed job's recovery): the existing run is resumed, never a second
    one made; the card must be the run's; a machine whose environment says rank 1 is told to join instead."""
    from labkit.core import runs as R

    runs = tmp_path / "runs"
    card = tmp_path / "one.yaml"
    card.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\n")
    run = R.new_run(load_card(card), runs, run_id="named-1")
    assert run.dir == runs / "smoke" / "named-1"
    status = json.loads(run.status_path.read_text())
    status.update(status="interrupted", stages={s: {"status": "done"} for s in R.STAGES})
    run.status_path.write_text(json.dumps(status))
    again, _ = _join(runs, str(card), "--run-id", "named-1", NODE_RANK="0", MASTER_PORT=str(_free_port()))
    assert again.returncode == 2 and "named-1 is interrupted: nothing to resume" in _lines(again)[-1], _lines(again)
    edited = tmp_path / "edited.yaml"
    edited.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\ntrain: {{lr: 1.0e-3}}\n")
    other, _ = _join(runs, str(edited), "--run-id", "named-1", NODE_RANK="0", MASTER_PORT=str(_free_port()))
    assert other.returncode == 2 and "is not the card run named-1 started with" in _lines(other)[-1], _lines(other)
    assert len(list((runs / "smoke").iterdir())) == 1
    two = tmp_path / "two.yaml"
    two.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\ntrain: {{micro_batch: 2}}\ndistributed: "
                   "{launcher: accelerate, strategy: ddp, num_processes: 2, num_machines: 2}\n")
    worker, _ = _join(runs, str(two), "--run-id", "named-2", MASTER_PORT=str(_free_port()))  # NODE_RANK=1
    assert worker.returncode == 2 and "only the head (rank 0) runs" in _lines(worker)[-1], _lines(worker)
    assert not (runs / "smoke" / "named-2").exists()
