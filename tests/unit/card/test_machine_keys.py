"""A run on several machines shares one card: which machine this is and where the head listens are not card keys
any more (the launcher's environment says them, labkit.core.machines); a card that sets them is refused in one line
naming the variables, while the resolved cards archived by older runs, which hold them at their defaults, still load
with the same hash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from labkit.card.load import dump_yaml, load_card
from labkit.errors import CardError

TWO = "distributed: {launcher: accelerate, strategy: ddp, num_processes: 4, num_machines: 2"


def _child(tmp_path: Path, body: str, name: str = "child.yaml") -> Path:
    card = tmp_path / name
    card.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\n{body}")
    return card


@pytest.mark.parametrize("key, value, variable", [
    ("machine_rank", "1", "NODE_RANK"), ("main_process_ip", "10.0.0.1", "MASTER_ADDR"),
    ("main_process_port", "29501", "MASTER_PORT")])
def test_a_card_naming_a_machine_exits_2_naming_the_environment(tmp_path: Path, key: str, value: str,
                                                                variable: str) -> None:
    card = _child(tmp_path, f"{TWO}, {key}: {value}}}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "LABKIT_RUNS": str(tmp_path / "runs")}
    done = subprocess.run([sys.executable, "-m", "labkit", "check", str(card)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    assert line.startswith(f"labkit: error: {card}:2: distributed.{key}: no longer a card key"), line
    assert variable in line and "SLURM_NODEID" in line and "SKYPILOT_NODE_RANK" in line, line


def test_processes_are_a_multiple_of_machines(tmp_path: Path) -> None:
    with pytest.raises(CardError, match=r"num_processes 3 is not a multiple of num_machines 2: set it to processes "
                                        r"per machine × machines"):
        load_card(_child(tmp_path, TWO.replace("4", "3") + "}\n"))
    two = load_card(_child(tmp_path, TWO + "}\n", "two.yaml")).card.distributed
    assert (two.num_processes, two.num_machines) == (4, 2)  # no address, no rank: the environment gives them
    with pytest.raises(CardError, match=r"distributed.num_machines: read only by `accelerate launch`"):
        load_card(_child(tmp_path, "distributed: {num_machines: 2}\n", "none.yaml"))


def test_an_archived_card_of_an_older_run_loads_with_its_hash(tmp_path: Path) -> None:
    """An older labkit archived every key, these three at their defaults; resuming such a run loads it as it was."""
    loaded = load_card(_child(tmp_path, TWO + "}\n"))
    old = loaded.resolved
    assert "machine_rank" not in old["distributed"]  # new archives no longer write them
    old["distributed"].update(machine_rank=0, main_process_ip=None, main_process_port=None)
    run = tmp_path / "runs" / "smoke" / "tiny-lora-20250101T000000Z-abcdef01"
    run.mkdir(parents=True)
    (run / "card.yaml").write_text(dump_yaml(old))
    assert yaml.safe_load((run / "card.yaml").read_text())["distributed"]["main_process_ip"] is None
    again = load_card(run / "card.yaml")
    assert again.hash == loaded.hash and again.card.distributed.num_machines == 2
    assert "main_process_port" not in again.resolved["distributed"]
