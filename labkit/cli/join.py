"""One run on several machines: the head runs `labkit run CARD --run-id ID`, every other machine `labkit run --join ID`.

The head (machine rank 0) owns the run folder, on storage every machine sees (`--runs` / `LABKIT_RUNS`): it creates
the run, runs stages 01–03, and its stage 04 starts its share of the training processes (`accelerate launch` with
this machine's rank and the head's address and port, `labkit.core.machines`). A joining machine creates no run and no
registry line and changes nothing in the run's records: it waits for the run folder, for the head's stage 04 to start
and for the head's rendezvous port, starts its own share of the processes with the head's accelerate config, writes
its output to `logs/machine-<rank>.log` only, and ends when the head's `training/outcome.json` exists. Every wait
ends after `LABKIT_JOIN_TIMEOUT` seconds (default 600) without a sign of the head (the run folder appearing, the
head's heartbeat or status changing, its port opening): one line naming what was awaited and the fix, exit 2.
Its processes write only what every training process writes: their share of each checkpoint (rng_state_<rank>.pth,
shards), which resuming needs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, TextIO

from labkit.card.load import load_card
from labkit.card.schema import Card
from labkit.core import io
from labkit.core import runs as R
from labkit.core.machines import Machine, join_timeout, machine_of_run, reachable
from labkit.errors import LabkitError, MissingInput, RunStateError, StageFailed, StageInterrupted, UsageError

POLL_SECONDS = 0.5


def check_head(card: Card) -> None:
    """Before a run on several machines is created: this machine is the head (rank 0) and the environment names it.

    Raises:
        UsageError: one line: this machine joins instead, or the variables to set.
    """
    n = card.distributed.num_machines
    if n < 2:
        return
    machine = machine_of_run(n)
    if machine.rank != 0:
        raise UsageError(f"this machine is machine {machine.rank} of {n} ({machine.source} environment): only the head "
                         "(rank 0) runs `labkit run CARD --run-id ID`; here run `labkit run --join ID` with the same "
                         "--runs folder")


def _find(run_id: str, root: Path) -> R.Run | None:
    """The run folder of an exact run id under the runs root (or of a run folder's path), once its status exists."""
    if "/" in run_id or os.sep in run_id:
        folder = Path(run_id).expanduser().resolve()
        return R.Run(folder) if (folder / "status.json").is_file() else None
    found = sorted(root.glob(f"*/{R.check_run_id(run_id)}/status.json")) if root.is_dir() else []
    if len(found) > 1:
        raise UsageError(f"run id {run_id} names {len(found)} runs under {root} (experiments "
                         f"{', '.join(p.parent.parent.name for p in found)}): give the run folder instead")
    return R.Run(found[0].parent) if found else None


def _signs(run: R.Run) -> tuple[bytes, bytes]:
    """What changes while the head is alive: its heartbeat and its status."""
    def read(path: Path) -> bytes:
        try:
            return path.read_bytes()
        except OSError:
            return b""
    return read(run.dir / "heartbeat"), read(run.status_path)


def _wait(ready: Callable[[], bool], timeout: float, run: R.Run | None, fail: Callable[[], Exception]) -> None:
    """Poll `ready` until true; give up after `timeout` seconds without it and without a sign of the head."""
    last, seen = time.monotonic(), _signs(run) if run else None
    while not ready():
        if run is not None and (now := _signs(run)) != seen:
            last, seen = time.monotonic(), now
        if time.monotonic() - last > timeout:
            raise fail()
        time.sleep(POLL_SECONDS)


def _training_started(run: R.Run) -> bool:
    status = run.status()
    if status.get("status") in {"completed", "invalid"}:
        raise RunStateError(f"{run.experiment}/{run.run_id} is {status['status']}: there is nothing to join")
    stage = status.get("stages", {}).get("training", {})
    return status.get("status") == "running" and stage.get("status") == "started"


def join_run(run_id: str, root: Path) -> int:
    """`labkit run --join ID`: this machine's share of a run's training, started by the head.

    Args:
        run_id: the run id the head was given (`--run-id`), or the run folder.
        root: the runs root, on storage the head writes to.
    Returns:
        0 when the head's training/outcome.json exists (its line printed).
    Raises:
        MissingInput: no such run folder within the timeout (exit 2).
        RunStateError: the head did not start training, or its port did not open, within the timeout (exit 2).
        StageFailed: this machine's processes or the head's training failed (exit 1).
    """
    timeout = join_timeout()
    where = f"under {root}" if "/" not in run_id else "there"
    found: list[R.Run] = []

    def appeared() -> bool:
        found[:] = found or [r for r in [_find(run_id, root)] if r is not None]
        return bool(found)

    _wait(appeared, timeout, None,
          lambda: MissingInput(f"labkit run --join {run_id}: no run {run_id} appeared {where} within {timeout:g} s "
                               "(LABKIT_JOIN_TIMEOUT): start the head first (`labkit run CARD --run-id ID` on machine "
                               "0) and give every machine the same shared runs folder (--runs or LABKIT_RUNS)"))
    run = found[0]
    card = load_card(run.card_path).card
    n = card.distributed.num_machines
    if n < 2:
        raise UsageError(f"{run.experiment}/{run.run_id} trains on one machine (distributed.num_machines: 1): "
                         "there is nothing to join")
    machine = machine_of_run(n)
    if machine.rank == 0:
        raise UsageError(f"this machine is rank 0 ({machine.source} environment), the head: it runs `labkit run CARD "
                         "--run-id ID`; on the other machines set NODE_RANK 1 … (or start them through SkyPilot/Slurm)")
    log_path = run.dir / "logs" / f"machine-{machine.rank}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        try:
            return _join(run, n, machine, timeout, log)
        except KeyboardInterrupt:
            log.write("labkit: interrupted while joining (nothing recorded in the run)\n")
            raise StageInterrupted(f"joining {run.experiment}/{run.run_id} interrupted: nothing was recorded in the run; "
                                   "the head records its own state") from None
        except LabkitError as exc:
            log.write(f"labkit: error: {exc}\n")  # the log says why this machine stopped
            raise


def _join(run: R.Run, n: int, machine: Machine, timeout: float, log: TextIO) -> int:
    from labkit.stages.records import ACCELERATE_CONFIG, OUTCOME  # the model layers: only once there is a run to join
    from labkit.train.distributed import launch_command, run_launch

    def say(line: str) -> None:
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    name, head = f"{run.experiment}/{run.run_id}", f"{machine.head}:{machine.port}"
    say(f"join {name} as machine {machine.rank} of {n} (head {head}, from the {machine.source} environment)")
    _wait(lambda: _training_started(run), timeout, run,
          lambda: RunStateError(f"labkit run --join {run.run_id}: the head's run {name} did not start stage 04 (its "
                                f"status: {run.status().get('status')}) and showed no sign of life for {timeout:g} s "
                                "(LABKIT_JOIN_TIMEOUT): check the head machine's `labkit run` (or resume it)"))
    say(f"the head started training: connecting to {head}")
    _wait(lambda: reachable(str(machine.head), machine.port), timeout, None,
          lambda: RunStateError(f"labkit run --join {run.run_id}: the head {head} did not accept a connection within "
                                f"{timeout:g} s (LABKIT_JOIN_TIMEOUT): check that this machine reaches it (firewall, "
                                "MASTER_ADDR / SKYPILOT_NODE_IPS / SLURM_JOB_NODELIST) and that every machine has the "
                                "same MASTER_PORT (or LABKIT_MASTER_PORT)"))
    command = launch_command(run.dir / "training" / ACCELERATE_CONFIG, run.dir, n, machine)
    say("$ " + " ".join(command))
    code, _ = run_launch(command, say)
    outcome = run.dir / "training" / OUTCOME
    if code != 0 and not outcome.exists():
        raise StageFailed(f"this machine's training processes exited with {code} (the head's run: "
                          f"{run.status().get('status')}); its output: {log.name}")
    ended = {"failed", "interrupted", "invalid"}
    _wait(lambda: outcome.exists() or run.status().get("status") in ended, timeout, run,
          lambda: RunStateError(f"labkit run --join {run.run_id}: the head wrote no training outcome ({outcome}) "
                                f"within {timeout:g} s of this machine's processes ending; see the head's run"))
    if not outcome.exists():
        raise StageFailed(f"the head's run {name} is {run.status().get('status')}: {run.status().get('error', '')}"[:500])
    result = io.read_json(outcome)
    if result.get("interrupted"):
        raise StageFailed(f"{name}: training was interrupted ({result['interrupted']}); resume the head with the "
                          "same command, then join again")
    say(f"joined {name}: training done, {result['steps']} steps on {result['world_size']} processes → {outcome}")
    return 0

