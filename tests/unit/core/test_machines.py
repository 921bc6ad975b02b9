"""Which machine this is, how many, and where the head listens: read from each launcher's environment
(`labkit.core.machines`), first source present wins; Slurm's compact node lists expanded."""

from __future__ import annotations

import os
import shutil
import socket
import stat
from pathlib import Path

import pytest

from labkit.core.machines import (
    Machine,
    expand_hostlist,
    join_timeout,
    machine_of_run,
    reachable,
    slurm_hosts,
    this_machine,
)
from labkit.errors import UsageError

SKYPILOT = {"SKYPILOT_NODE_RANK": "2", "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n10.0.0.7\n", "SKYPILOT_NUM_NODES": "3"}
SLURM = {"SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_NUM_NODES": "2"}
TORCHRUN = {"NODE_RANK": "1", "MASTER_ADDR": "192.168.1.2", "MASTER_PORT": "29400"}


def test_each_source_alone() -> None:
    assert this_machine(SKYPILOT) == Machine(2, 3, "10.0.0.5", 29500, "skypilot")
    assert this_machine(SLURM) == Machine(1, 2, "gpu07", 29500, "slurm")
    assert this_machine(TORCHRUN) == Machine(1, None, "192.168.1.2", 29400, "torchrun")
    assert this_machine({"MACHINE_RANK": "3", "MASTER_ADDR": "h"}) == Machine(3, None, "h", 29500, "torchrun")
    assert this_machine({}) == Machine(0, None, None, 29500, "none")


def test_the_first_source_present_wins_and_the_port_rules() -> None:
    everything = {**TORCHRUN, **SLURM, **SKYPILOT}
    assert this_machine(everything).source == "skypilot" and this_machine(everything).port == 29400  # MASTER_PORT
    assert this_machine({**TORCHRUN, **SLURM}).source == "slurm"
    assert this_machine({**TORCHRUN, "LABKIT_MASTER_PORT": "31000"}).port == 31000  # overrides MASTER_PORT
    assert this_machine({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "a\nb"}).count == 2  # counted from the IPs
    with pytest.raises(UsageError, match=r"^NODE_RANK='one' is not a whole number"):
        this_machine({"NODE_RANK": "one"})
    with pytest.raises(UsageError, match=r"^MASTER_PORT=70000 is not a TCP port"):
        this_machine({"MASTER_PORT": "70000"})


def test_slurm_compact_node_lists_expand_in_order() -> None:
    assert expand_hostlist("node[01-04,07],gpu2") == ["node01", "node02", "node03", "node04", "node07", "gpu2"]
    assert expand_hostlist("a[1-2]-b[08-09]") == ["a1-b08", "a1-b09", "a2-b08", "a2-b09"]
    assert expand_hostlist("single") == ["single"]
    assert expand_hostlist("n[9-11]") == ["n9", "n10", "n11"]
    with pytest.raises(UsageError, match="unbalanced brackets"):
        expand_hostlist("node[01-02")
    with pytest.raises(UsageError, match=r"\[x-2\] is not a list of numbers"):
        expand_hostlist("node[x-2]")


def test_scontrol_expands_the_node_list_where_slurm_is_installed(tmp_path: Path) -> None:
    """A real `scontrol` on the PATH is asked first (here a stand-in script that answers as Slurm's does)."""
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\n[ \"$1 $2\" = 'show hostnames' ] || exit 1\necho head-from-scontrol\necho other\n")
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{tmp_path}{os.pathsep}{old}"
    try:
        assert shutil.which("scontrol") == str(scontrol)
        assert slurm_hosts("weird[1-2]") == ["head-from-scontrol", "other"]
        assert this_machine({**SLURM}).head == "head-from-scontrol"
    finally:
        os.environ["PATH"] = old


def test_a_run_on_several_machines_needs_a_head_and_a_rank_that_fits() -> None:
    assert machine_of_run(2, TORCHRUN).rank == 1
    with pytest.raises(UsageError, match=r"names no head machine: set MASTER_ADDR, NODE_RANK"):
        machine_of_run(2, {"NODE_RANK": "1"})
    with pytest.raises(UsageError, match=r"says machine 2 of 3, but the card's distributed.num_machines is 2"):
        machine_of_run(2, SKYPILOT)
    with pytest.raises(UsageError, match=r"machine 2 of \?.*ranks 0 to 1"):
        machine_of_run(2, {"NODE_RANK": "2", "MASTER_ADDR": "h"})


def test_join_timeout_and_reachability() -> None:
    assert join_timeout({}) == 600 and join_timeout({"LABKIT_JOIN_TIMEOUT": "2.5"}) == 2.5
    for bad in ("0", "soon"):
        with pytest.raises(UsageError, match="LABKIT_JOIN_TIMEOUT"):
            join_timeout({"LABKIT_JOIN_TIMEOUT": bad})
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert reachable("127.0.0.1", port)
    assert not reachable("127.0.0.1", port, seconds=0.5)  # closed now
