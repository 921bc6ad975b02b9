"""Which machine of a run this is, how many there are, and where the head machine listens: from the environment the
launcher sets on every machine, never from the card (every machine of a run shares the card).

The first source present wins:

1. SkyPilot: `SKYPILOT_NODE_RANK`, `SKYPILOT_NODE_IPS` (one address a line; the first is the head),
   `SKYPILOT_NUM_NODES`.
2. Slurm: `SLURM_NODEID`, `SLURM_JOB_NODELIST` (its first host is the head: `scontrol show hostnames` expands it
   where Slurm is installed, else the compact form `node[01-04,07],gpu2` is expanded here), `SLURM_JOB_NUM_NODES`.
3. torchrun / accelerate: `NODE_RANK` (or `MACHINE_RANK`), `MASTER_ADDR`, `MASTER_PORT`.

The port: `LABKIT_MASTER_PORT`, else `MASTER_PORT`, else 29500. Nothing set: one machine, rank 0.
`LABKIT_JOIN_TIMEOUT` (seconds, default 600): how long a joining machine waits for the run folder or the head.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from typing import Mapping

from labkit.errors import UsageError

DEFAULT_PORT = 29500
DEFAULT_JOIN_TIMEOUT = 600.0


@dataclass(frozen=True)
class Machine:
    """This machine's place in a run.

    Attributes:
        rank: 0 for the head, 1 … count-1 for the others.
        count: the number of machines the environment states, or None where it states none.
        head: the head machine's address, or None where the environment gives none.
        port: the port the head listens on for the rendezvous.
        source: "skypilot", "slurm", "torchrun" or "none" (nothing set: one machine).
    """

    rank: int
    count: int | None
    head: str | None
    port: int
    source: str


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"{name}={value!r} is not a whole number: it says which machine of the run this is (or how "
                         "many there are); fix it in the launcher's environment") from None


def _port(env: Mapping[str, str]) -> int:
    name = "LABKIT_MASTER_PORT" if env.get("LABKIT_MASTER_PORT") else "MASTER_PORT"
    port = _int(env, name) or DEFAULT_PORT
    if not 0 < port < 65536:
        raise UsageError(f"{name}={port} is not a TCP port (1-65535); set it to the head machine's free port")
    return port


def this_machine(env: Mapping[str, str] | None = None) -> Machine:
    """This machine's rank, the machine count, the head's address and port, from the launcher's environment.

    Args:
        env: the environment (default: os.environ).
    Returns:
        the Machine; rank 0 of an unstated count with no head address where nothing is set.
    Raises:
        UsageError: a variable that is not a number or a port.
    """
    env = os.environ if env is None else env
    port = _port(env)
    if env.get("SKYPILOT_NODE_RANK", "").strip():
        ips = [line.strip() for line in env.get("SKYPILOT_NODE_IPS", "").splitlines() if line.strip()]
        count = _int(env, "SKYPILOT_NUM_NODES") or (len(ips) or None)
        return Machine(_int(env, "SKYPILOT_NODE_RANK") or 0, count, ips[0] if ips else None, port, "skypilot")
    if env.get("SLURM_NODEID", "").strip():
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        hosts = slurm_hosts(nodelist) if nodelist.strip() else []
        count = _int(env, "SLURM_JOB_NUM_NODES") or _int(env, "SLURM_NNODES") or (len(hosts) or None)
        return Machine(_int(env, "SLURM_NODEID") or 0, count, hosts[0] if hosts else None, port, "slurm")
    rank_name = "NODE_RANK" if env.get("NODE_RANK", "").strip() else "MACHINE_RANK"
    if env.get(rank_name, "").strip() or env.get("MASTER_ADDR", "").strip():
        return Machine(_int(env, rank_name) or 0, None, env.get("MASTER_ADDR", "").strip() or None, port, "torchrun")
    return Machine(0, None, None, port, "none")


def machine_of_run(num_machines: int, env: Mapping[str, str] | None = None) -> Machine:
    """This machine, checked against a run on `num_machines` machines: the environment names the head, and this
    machine's rank (and the count, where stated) fit the card.

    Args:
        num_machines: the card's `distributed.num_machines` (> 1).
        env: the environment (default: os.environ).
    Returns:
        the Machine.
    Raises:
        UsageError: one line naming the variables to set.
    """
    machine = this_machine(env)
    if machine.head is None:
        raise UsageError(f"this run spans {num_machines} machines (distributed.num_machines) but the environment names "
                         "no head machine: set MASTER_ADDR, NODE_RANK (and MASTER_PORT) on every machine, or start it "
                         "through SkyPilot or Slurm, which set theirs (docs/gpu.md, Several machines)")
    if machine.count not in (None, num_machines) or machine.rank >= num_machines:
        raise UsageError(f"the {machine.source} environment says machine {machine.rank} of {machine.count or '?'}, but "
                         f"the card's distributed.num_machines is {num_machines}: start as many machines as the card "
                         f"says, ranks 0 to {num_machines - 1} (or change the card)")
    return machine


def slurm_hosts(nodelist: str) -> list[str]:
    """The hosts of a Slurm node list, in order: `scontrol show hostnames` where Slurm is installed, else the
    compact form expanded here (`node[01-04,07],gpu2` → node01 … node04, node07, gpu2; zero padding kept).

    Args:
        nodelist: SLURM_JOB_NODELIST's value.
    Returns:
        the host names.
    """
    scontrol = shutil.which("scontrol")
    if scontrol:
        try:
            done = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            pass  # the expansion below reads the same syntax
    return expand_hostlist(nodelist)


def _top_level_split(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [p.strip() for p in [*parts, text[start:]] if p.strip()]


def _range(spec: str, nodelist: str) -> list[str]:
    values = []
    for item in spec.split(","):
        low, _, high = item.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise UsageError(f"SLURM_JOB_NODELIST={nodelist!r}: [{spec}] is not a list of numbers and ranges")
        width = len(low)
        values += [str(n).zfill(width) for n in range(int(low), int(high or low) + 1)]
    return values


def expand_hostlist(nodelist: str) -> list[str]:
    """Expand Slurm's compact host list (`gpu[1-2]-n[01,03],login`), bracket groups multiplied out in order.

    Args:
        nodelist: the compact list.
    Returns:
        the host names.
    Raises:
        UsageError: brackets that do not close or hold something other than numbers and ranges.
    """
    hosts: list[str] = []
    for part in _top_level_split(nodelist):
        pieces = re.split(r"(\[[^\]]*\])", part)
        if any("[" in p or "]" in p for p in pieces if not (p.startswith("[") and p.endswith("]"))):
            raise UsageError(f"SLURM_JOB_NODELIST={nodelist!r}: unbalanced brackets in {part!r}")
        choices = [_range(p[1:-1], nodelist) if p.startswith("[") else [p] for p in pieces if p]
        hosts += ["".join(combo) for combo in itertools.product(*choices)]
    return hosts


def join_timeout(env: Mapping[str, str] | None = None) -> float:
    """Seconds a joining machine waits for the run folder or the head, and the machines wait for each other at the
    rendezvous (`LABKIT_JOIN_TIMEOUT`, default 600)."""
    env = os.environ if env is None else env
    value = env.get("LABKIT_JOIN_TIMEOUT", "").strip()
    try:
        seconds = float(value) if value else DEFAULT_JOIN_TIMEOUT
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise UsageError(f"LABKIT_JOIN_TIMEOUT={value!r}: give the seconds to wait for the head, a positive number")
    return seconds


def reachable(host: str, port: int, seconds: float = 2.0) -> bool:
    """Whether a TCP connection to host:port opens within `seconds` (closed at once)."""
    try:
        with socket.create_connection((host, port), timeout=seconds):
            return True
    except OSError:
        return False
