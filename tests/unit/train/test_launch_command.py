"""Each machine's `accelerate launch` line: one machine passes nothing about machines; on several, this machine's
rank and the head's address and port come from the launcher's environment (labkit.core.machines), not the card."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from labkit.core.machines import Machine
from labkit.errors import UsageError
from labkit.train.distributed import launch_command

CONFIG, RUN = Path("/runs/x/training/accelerate_config.yaml"), Path("/runs/x/r1")


def _after(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_one_machine_passes_no_machine_arguments_and_meets_on_a_free_port() -> None:
    """accelerate's default port is 29500 for every run: two runs side by side on one machine would race for it. The
    launch asks for port 0, which accelerate's own environment set-up turns into a free port."""
    import socket
    import warnings

    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    command = launch_command(CONFIG, RUN)
    assert command[-4:] == ["-m", "labkit.cli.worker", "train", str(RUN)] and _after(command, "--config_file") == str(CONFIG)
    assert not any(a.startswith(("--machine_rank", "--main_process_ip", "--num_machines")) for a in command)
    args = launch_command_parser().parse_args(command[command.index("--config_file"):])
    args.num_processes, args.num_machines, args.machine_rank = 2, 1, 0  # what the config file gives a DDP card
    args.mixed_precision, args.dynamo_backend = "no", "no"
    with socket.socket() as held, warnings.catch_warnings():
        warnings.simplefilter("error")  # accelerate warns when its port is taken and it has to look for another
        try:
            held.bind(("127.0.0.1", 29500))  # another run's rendezvous, when the port is free to take here
            held.listen()
        except OSError:
            pass
        prepare_multi_gpu_env(args)
    assert args.main_process_port not in (0, 29500) and args.master_port == str(args.main_process_port)


def test_several_machines_pass_rank_and_head_from_the_environment() -> None:
    command = launch_command(CONFIG, RUN, 2, Machine(1, 2, "10.1.2.3", 29444, "slurm"))
    assert [_after(command, f) for f in ("--num_machines", "--machine_rank", "--main_process_ip",
                                         "--main_process_port")] == ["2", "1", "10.1.2.3", "29444"]
    assert command.index("--main_process_port") < command.index("labkit.cli.worker")  # launcher's flags, not the worker's
    saved = {k: os.environ.pop(k) for k in ("NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "LABKIT_MASTER_PORT")
             if k in os.environ}
    os.environ.update(NODE_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    try:
        read = launch_command(CONFIG, RUN, 2)  # read from os.environ
        assert [_after(read, "--machine_rank"), _after(read, "--main_process_ip"), _after(read, "--main_process_port")] \
            == ["1", "127.0.0.1", "29511"]
        del os.environ["MASTER_ADDR"]
        with pytest.raises(UsageError, match="names no head machine"):
            launch_command(CONFIG, RUN, 2)
    finally:
        for k in ("NODE_RANK", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(k, None)
        os.environ.update(saved)


def test_several_machines_wait_for_each_other_the_join_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's static rendezvous waits 600 s unless told: the launch passes LABKIT_JOIN_TIMEOUT, and accelerate's own
    parser hands it on to torch's rendezvous configuration."""
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed.run import _parse_rendezvous_config

    monkeypatch.setenv("LABKIT_JOIN_TIMEOUT", "42.5")
    command = launch_command(CONFIG, RUN, 2, Machine(0, 2, "10.1.2.3", 29444, "slurm"))
    args = launch_command_parser().parse_args(command[command.index("--config_file"):])
    assert _parse_rendezvous_config(args.rdzv_conf) == {"timeout": "43"}  # whole seconds, never shorter
    assert "--rdzv_conf" not in launch_command(CONFIG, RUN)
    monkeypatch.setenv("LABKIT_JOIN_TIMEOUT", "soon")
    with pytest.raises(UsageError, match="LABKIT_JOIN_TIMEOUT"):
        launch_command(CONFIG, RUN, 2, Machine(0, 2, "10.1.2.3", 29444, "slurm"))
