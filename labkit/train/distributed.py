"""Training on more than one process through `accelerate launch`: the config written from the card.

- `ddp`: every process holds the whole model; gradients are averaged (NCCL on GPUs, gloo on CPUs).
- `fsdp`: weights, gradients and optimiser states are sharded across processes (FSDP2, full
  sharding), which is what lets a model larger than one device's memory train; FSDP2 keeps the
  original parameters, so LoRA works. Saving is a collective: every rank calls `save_model` (stage 04), the full
  state dict is gathered and rank 0 writes it (`fsdp_state_dict: full`), or every rank writes its shard
  (`sharded`). `cpu_ram_efficient_loading` + `sync_module_states`: rank 0 alone loads the weights (the other ranks'
  parameters are on the meta device: `labkit.model.loading.load_model`, after `labkit.train.process_state.prepare`
  set up the process group before the load) and FSDP broadcasts them, so a machine's RAM holds one copy, not one
  per process. `train.gradient_checkpointing` becomes FSDP's own activation checkpointing
  (`fsdp_activation_checkpointing`); the trainer's is then off (`labkit.model.method.trainer_checkpointing`:
  transformers refuses both). QLoRA under FSDP or ZeRO-3 stores the 4-bit codes in the weights' dtype
  (`bnb_4bit_quant_storage`, labkit.model.loading) so they shard like the rest.
- `deepspeed`: ZeRO stage 2 or 3 (optionally offloading to the CPU), configured from the card in the same
  accelerate config (never edited by hand: the launcher writes it from the card on every run). With stage 3 the
  model is partitioned as it loads (`zero3_init_flag`: transformers' `HfDeepSpeedConfig` exists before
  `from_pretrained`, `labkit.train.process_state`).

On a machine without GPUs the processes are CPU processes talking over gloo (accelerate's multi-GPU
launcher starts them; the trainer's `use_cpu` puts them on the CPU). FSDP is refused there: accelerate
1.15 gives CPU processes DistributedDataParallel even when an FSDP plugin is passed (checked with
2 processes on this machine), so a "sharded" run would silently be a replicated one.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import psutil
import yaml

from labkit.card.schema import Card
from labkit.core.device import DeviceProfile
from labkit.core.machines import Machine, join_timeout, machine_of_run
from labkit.errors import CardError
from labkit.model.loading import profile_of
from labkit.model.placement import decide


def accelerate_config(card: Card, device: str, profile: DeviceProfile | None = None) -> str:
    """The accelerate config (YAML text) for the card's `distributed` section on this device.

    Args:
        card: the card.
        device: "cuda" or "cpu" (the machine the launch starts on).
        profile: the machine's device profile (default: captured), for `train.precision: auto`.
    Returns:
        YAML for `accelerate launch --config_file`.
    """
    d = card.distributed
    if d.launcher != "accelerate":
        raise CardError("distributed.launcher is none: nothing to launch")
    if d.strategy == "deepspeed" and device != "cuda":
        raise CardError(f"distributed.strategy: deepspeed needs CUDA GPUs (this machine trains on {device}): "
                        "DeepSpeed's CPU accelerator is not what a rented GPU runs; use strategy: ddp here")
    if d.strategy == "fsdp" and device != "cuda":
        # accelerate 1.15 switches to FSDP only for GPU-like process groups; CPU processes (gloo) get
        # DistributedDataParallel instead, silently — every process would hold the whole model
        raise CardError(f"distributed.strategy: fsdp needs CUDA GPUs (this machine trains on {device}): accelerate "
                         "wraps CPU processes in DDP, not FSDP, so nothing would be sharded; use strategy: ddp here")
    precision = card.train.precision
    if device == "cuda" and precision == "auto":  # the placement's choice for this machine's GPUs
        precision = decide(card, profile or profile_of("cuda"), world_size=1, kernels={}).precision
    mixed = {"bf16": "bf16", "fp16": "fp16"}.get(precision, "no") if device == "cuda" else "no"
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE", "debug": False, "num_processes": d.num_processes,
        "num_machines": d.num_machines, "machine_rank": 0, "mixed_precision": mixed,  # rank, head: launch_command
        "main_training_function": "main", "rdzv_backend": "static", "same_network": True,
        "gpu_ids": "all", "use_cpu": False, "downcast_bf16": "no", "tpu_env": [], "tpu_use_cluster": False,
        "tpu_use_sudo": False,
    }
    if d.strategy == "ddp":
        config["distributed_type"] = "MULTI_GPU"
    elif d.strategy == "deepspeed":
        config["distributed_type"] = "DEEPSPEED"
        config["deepspeed_config"] = {
            "zero_stage": d.zero_stage, "gradient_accumulation_steps": card.train.grad_accum,
            "gradient_clipping": card.train.max_grad_norm, "offload_optimizer_device": d.offload,
            "offload_param_device": d.offload if d.zero_stage == 3 else "none",
            "zero3_init_flag": d.zero_stage == 3, "zero3_save_16bit_model": d.zero_stage == 3,
        }
        if d.num_machines > 1:
            config["deepspeed_config"]["deepspeed_multinode_launcher"] = "standard"
    else:
        config["distributed_type"] = "FSDP"
        config["fsdp_config"] = {
            "fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_reshard_after_forward": True,
            "fsdp_state_dict_type": "FULL_STATE_DICT" if d.fsdp_state_dict == "full" else "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True, "fsdp_sync_module_states": True,
            "fsdp_offload_params": False,
            # the one checkpointing layer under FSDP: the trainer's is off (labkit.model.method.trainer_checkpointing)
            "fsdp_activation_checkpointing": card.train.gradient_checkpointing,
        }
    return yaml.safe_dump(config, sort_keys=True)


def launch_command(config: Path, run_dir: Path, num_machines: int = 1, machine: Machine | None = None) -> list[str]:
    """The `accelerate launch` command line that trains `run_dir` with `config` on this machine.

    Args:
        config: the accelerate config (`accelerate_config`).
        run_dir: the run folder.
        num_machines: the card's `distributed.num_machines`; above 1 this machine's rank and the head's address and
            port are passed as arguments, from the launcher's environment (`labkit.core.machines`), and the
            machines wait for each other `LABKIT_JOIN_TIMEOUT` seconds (torch's static rendezvous `timeout`); on one
            machine the processes meet on a free port.
        machine: this machine (default: read from the environment).
    Returns:
        the command.
    Raises:
        UsageError: several machines, and the environment names no head, or a rank or count the card does not have,
            or LABKIT_JOIN_TIMEOUT is not a positive number.
    """
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
    if num_machines > 1:
        machine = machine or machine_of_run(num_machines)
        command += ["--num_machines", str(num_machines), "--machine_rank", str(machine.rank),
                    "--main_process_ip", str(machine.head), "--main_process_port", str(machine.port),
                    "--rdzv_conf", f"timeout={math.ceil(join_timeout())}"]
    else:  # a free port, not accelerate's fixed 29500: two runs side by side on one machine do not meet each other
        command += ["--main_process_port", "0"]
    return command + ["-m", "labkit.cli.worker", "train", str(run_dir)]


def run_launch(command: list[str], say: Callable[[str], None]) -> tuple[int, list[str]]:
    """Run an `accelerate launch` command line, its output line by line to `say`; SIGTERM / Ctrl-C meanwhile go on to
    the training workers only (they agree on a step, checkpoint and exit 0; the launcher itself would otherwise start
    killing them after its own timeout).

    Args:
        command: the command line (`launch_command`).
        say: where each output line goes (without its newline).
    Returns:
        (the launcher's exit status, its last 30 output lines).
    """
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "LABKIT_WORKER": "1"})

    def forward(signum: int, frame: Any) -> None:
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        workers = [c for c in children if "labkit.cli.worker" in " ".join(_cmdline(c))]
        for worker in workers or [psutil.Process(proc.pid)]:
            worker.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            say(line.rstrip("\n"))
            tail = (tail + [line.rstrip()])[-30:]
        return proc.wait(), tail
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _cmdline(process: Any) -> list[str]:
    try:
        return process.cmdline()
    except Exception:  # noqa: BLE001 - gone or not ours
        return []
