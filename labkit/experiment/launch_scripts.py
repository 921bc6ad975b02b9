"""The texts `labkit launch` writes: a SkyPilot task, a Slurm batch script and one shell script per machine.

Every value that comes from the card or the command line reaches YAML through `yaml.safe_dump` and a shell line
through `shlex.quote`; the launcher's own variables (`$SKYPILOT_TASK_ID`, `$SLURM_JOB_ID`, `$SLURM_NODEID`) are
the only text left for the shell to expand. Nothing from the local environment is written (no tokens: the task
asks for HF_TOKEN as a SkyPilot secret, given at launch).

What the commands are (docs/launch.md): the head machine (rank 0) runs `labkit --runs RUNS run CARD --run-id ID`,
which creates the run or, when it exists and is not completed, resumes it from its newest valid checkpoint; every
other machine runs `labkit --runs RUNS run --join ID`. The id is the same on every machine and across a restart:
SkyPilot's `$SKYPILOT_TASK_ID` ("stays the same across multiple recoveries of the same managed task",
sky/skylet/constants.py), Slurm's `slurm-$SLURM_JOB_ID` (kept when the job is requeued), a literal id for torchrun.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

MASTER_PORT = 29500  # the port labkit's machines meet on unless MASTER_PORT / LABKIT_MASTER_PORT say otherwise


@dataclass(frozen=True)
class LaunchSpec:
    """What every launch file needs (`labkit.experiment.launch_files.launch_spec` builds it from the card).

    Attributes:
        name: a job name (<experiment>-<variant>, letters, digits and dashes).
        card: the card's path relative to `workdir` (POSIX).
        workdir: the project folder on this machine (SkyPilot syncs it; Slurm and torchrun run in it).
        gpu: the accelerator's SkyPilot name ("L4", "A100-80GB", …).
        machines: how many machines (the card's distributed.num_machines).
        per_machine: processes (GPUs) per machine.
        runs: the shared runs folder as every machine sees it.
        extras: labkit's extras the run needs ("gpu", "deepspeed", …).
        wheel: the labkit wheel (a path on this machine).
        bucket: SkyPilot: the bucket mounted at `runs`.
        hub_token: the model comes from the Hugging Face hub (the task asks for HF_TOKEN as a secret).
        minutes: Slurm: the job's time limit in minutes.
        cpus: Slurm: CPUs per machine.
        run_id: torchrun: the run id the per-machine scripts share.
        head: torchrun: the head machine's address (None: each script asks for MASTER_ADDR).
    """

    name: str
    card: str
    workdir: str
    gpu: str
    machines: int
    per_machine: int
    runs: str
    extras: tuple[str, ...]
    wheel: str
    bucket: str
    hub_token: bool
    minutes: int
    cpus: int
    run_id: str
    head: str | None


def head_command(spec: LaunchSpec, run_id: str) -> str:
    """The head machine's command (`run_id` is shell text: a quoted literal or "$VAR")."""
    return f"labkit --runs {shlex.quote(spec.runs)} run {shlex.quote(spec.card)} --run-id {run_id}"


def join_command(spec: LaunchSpec, run_id: str) -> str:
    """Every other machine's command (`run_id` is shell text: a quoted literal or "$VAR")."""
    return f"labkit --runs {shlex.quote(spec.runs)} run --join {run_id}"


def _by_rank(spec: LaunchSpec, rank_var: str, run_id: str) -> str:
    """The shell lines that run the head's command on rank 0 and the join command elsewhere."""
    if spec.machines == 1:
        return f"exec {head_command(spec, run_id)}\n"
    return (f'if [ "${{{rank_var}}}" = "0" ]; then\n'
            f"  exec {head_command(spec, run_id)}\n"
            "else\n"
            f"  exec {join_command(spec, run_id)}\n"
            "fi\n")


def _wheel_target(spec: LaunchSpec) -> str:
    return "/labkit-wheel/" + spec.wheel.replace("\\", "/").rsplit("/", 1)[-1]


def _pip_target(path: str, extras: tuple[str, ...]) -> str:
    return shlex.quote(f"{path}[{','.join(extras)}]" if extras else path)


class _BlockDumper(yaml.SafeDumper):
    """yaml.safe_dump's dumper, writing multi-line strings (setup, run) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_BlockDumper.add_representer(str, _str)


def skypilot_task(spec: LaunchSpec) -> str:
    """The SkyPilot task YAML, to be launched as a managed job (`sky jobs launch task.yaml`).

    Returns:
        the YAML text: a comment block, then the task (yaml.safe_dump).
    """
    wheel = _wheel_target(spec)
    task: dict[str, Any] = {
        "name": spec.name,
        "num_nodes": spec.machines,
        "resources": {"accelerators": f"{spec.gpu}:{spec.per_machine}"},
        "workdir": spec.workdir,
        "file_mounts": {
            spec.runs: {"name": spec.bucket, "mode": "MOUNT_CACHED"},
            wheel: spec.wheel,
        },
        "setup": "set -euo pipefail\n"
                 f"python -m pip install --upgrade {_pip_target(wheel, spec.extras)}\n",
        "run": "set -euo pipefail\n" + _by_rank(spec, "SKYPILOT_NODE_RANK", '"$SKYPILOT_TASK_ID"'),
    }
    if spec.hub_token:
        task["secrets"] = {"HF_TOKEN": None}
    head = [
        f"# SkyPilot task for {spec.name}, written by `labkit launch` (docs/launch.md).",
        "# Start it as a managed job (recovered after a preemption or a failed machine):",
        "#   sky jobs launch task.yaml" + (" --secret HF_TOKEN" if spec.hub_token else ""),
        f"# resources: {spec.machines} machine(s) x {spec.per_machine} {spec.gpu} ({spec.gpu} chosen by "
        "labkit estimate's verdict).",
        f"# file_mounts: {spec.runs} is the shared runs folder, the bucket '{spec.bucket}' (MOUNT_CACHED: writes",
        "#   are cached on local disk and uploaded in the background). Replace the name with a bucket of yours",
        "#   (labkit launch --bucket NAME); SkyPilot creates it when it does not exist.",
        f"#   {wheel}: the labkit wheel (python -m build --wheel writes dist/labkit-*.whl).",
        "# workdir: the project folder (the card and its data) synced to every machine.",
        "# run: the head (SKYPILOT_NODE_RANK 0) creates or resumes the run SKYPILOT_TASK_ID (the same on every",
        "#   machine and across the managed job's recoveries: training resumes from the newest valid checkpoint);",
        "#   the others join it.",
    ]
    return "\n".join(head) + "\n" + yaml.dump(task, Dumper=_BlockDumper, sort_keys=False, width=1000)


def slurm_time(minutes: int) -> str:
    """Slurm's --time value (D-HH:MM:SS) for `minutes`."""
    days, rest = divmod(int(minutes), 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def slurm_minutes(training_minutes: float) -> int:
    """The job's time limit: the card's training budget and half again, plus 30 minutes for the other stages
    (data, baseline, evaluation, model download) — a stated allowance, not a measurement."""
    return int(math.ceil(training_minutes * 1.5 + 30))


def slurm_script(spec: LaunchSpec) -> str:
    """The Slurm batch script (`sbatch slurm.sbatch`): one labkit per machine through srun, node 0 the head.

    Args:
        spec: the launch spec.
    Returns:
        the script's text.
    """
    inner = ("set -euo pipefail\n" + _by_rank(spec, "SLURM_NODEID", '"slurm-$SLURM_JOB_ID"'))
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={shlex.quote(spec.name)}",
        f"#SBATCH --nodes={spec.machines}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={spec.per_machine}",
        f"#SBATCH --cpus-per-task={spec.cpus}",
        f"#SBATCH --time={slurm_time(spec.minutes)}",
        "#SBATCH --output=slurm-%j.out",
        "#SBATCH --requeue",
        "#SBATCH --signal=TERM@300",
        f"# {spec.name}, written by `labkit launch` (docs/launch.md). Submit with: sbatch slurm.sbatch",
        f"# GPUs: {spec.per_machine} per machine; labkit estimate chose {spec.gpu} (add your cluster's GPU type,",
        f"#   e.g. --gpus-per-node=<type>:{spec.per_machine}, or a --partition, as your site names them).",
        f"# --time: the card's training budget x 1.5 + 30 min for the other stages ({spec.minutes} min).",
        "# --requeue: a requeued job keeps SLURM_JOB_ID, so the head resumes the same run from its newest valid",
        "#   checkpoint. --signal: SIGTERM 5 minutes before the limit; labkit checkpoints and stops.",
        "# --output: the job's log, in the folder sbatch is run from (%j: the job id).",
        f"# {spec.runs} must be storage every machine sees (a shared filesystem).",
        "",
        "set -euo pipefail",
        "# the environment where labkit is installed, e.g.: source ~/labkit-env/bin/activate",
        f"cd {shlex.quote(spec.workdir)}",
        "# one task per machine: SLURM_NODEID 0 is the head, the head's address is the job's first host",
        f"srun --nodes={spec.machines} --ntasks-per-node=1 bash -c {shlex.quote(inner)}",
    ]
    return "\n".join(lines) + "\n"


def node_script(spec: LaunchSpec, rank: int) -> str:
    """The shell script machine `rank` runs (torchrun / accelerate variables: NODE_RANK, MASTER_ADDR, MASTER_PORT).

    Args:
        spec: the launch spec (run_id: the id every machine shares; head: the head's address or None).
        rank: this machine's rank (0: the head).
    Returns:
        the script's text.
    """
    run_id = shlex.quote(spec.run_id)
    command = head_command(spec, run_id) if rank == 0 else join_command(spec, run_id)
    lines = ["#!/bin/bash",
             f"# machine {rank} of {spec.machines} for {spec.name}, written by `labkit launch` (docs/launch.md):",
             f"# run it on that machine with: bash node-{rank}.sh" + ("" if rank == 0 else "  (any order)"),
             "set -euo pipefail",
             "# the environment where labkit is installed, e.g.: source ~/labkit-env/bin/activate",
             f"cd {shlex.quote(spec.workdir)}"]
    if spec.machines > 1:
        head = (f"export MASTER_ADDR={shlex.quote(spec.head)}" if spec.head else
                ': "${MASTER_ADDR:?set MASTER_ADDR to the head machine (node-0) address, or pass --head to labkit launch}"')
        lines += [f"export NODE_RANK={rank}", head, f'export MASTER_PORT="${{MASTER_PORT:-{MASTER_PORT}}}"']
    lines.append(f"exec {command}")
    return "\n".join(lines) + "\n"


def node_commands(spec: LaunchSpec) -> list[str]:
    """The one-line command of each machine (`NODE_RANK=k MASTER_ADDR=… MASTER_PORT=… labkit …`), for the README."""
    run_id = shlex.quote(spec.run_id)
    out = []
    for rank in range(spec.machines):
        command = head_command(spec, run_id) if rank == 0 else join_command(spec, run_id)
        if spec.machines > 1:
            head = shlex.quote(spec.head) if spec.head else "HEAD_ADDRESS"
            command = f"NODE_RANK={rank} MASTER_ADDR={head} MASTER_PORT={MASTER_PORT} {command}"
        out.append(command)
    return out
