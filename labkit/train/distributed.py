"""Training on more than one process through `accelerate launch`: the config written from the card.

- `ddp`: every process holds the whole model; gradients are averaged (NCCL on GPUs, gloo on CPUs).
- `fsdp`: weights, gradients and optimiser states are sharded across processes (FSDP2, full
  sharding), which is what lets a model larger than one device's memory train; FSDP2 keeps the
  original parameters, so LoRA works, and the full state dict is gathered for saving.

On a machine without GPUs the processes are CPU processes talking over gloo (accelerate's multi-GPU
launcher starts them; the trainer's `use_cpu` puts them on the CPU). FSDP is refused there: accelerate
1.15 gives CPU processes DistributedDataParallel even when an FSDP plugin is passed (checked with
2 processes on this machine), so a "sharded" run would silently be a replicated one.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from labkit.card.schema import Card
from labkit.errors import CardError


def accelerate_config(card: Card, device: str) -> str:
    """The accelerate config (YAML text) for the card's `distributed` section on this device.

    Args:
        card: the card.
        device: "cuda" or "cpu" (the machine the launch starts on).
    Returns:
        YAML for `accelerate launch --config_file`.
    """
    d = card.distributed
    if d.launcher != "accelerate":
        raise CardError("distributed.launcher is none: nothing to launch")
    if d.strategy == "fsdp" and device != "cuda":
        # accelerate 1.15 switches to FSDP only for GPU-like process groups; CPU processes (gloo) get
        # DistributedDataParallel instead, silently — every process would hold the whole model
        raise CardError(f"distributed.strategy: fsdp needs CUDA GPUs (this machine trains on {device}): accelerate "
                         "wraps CPU processes in DDP, not FSDP, so nothing would be sharded; use strategy: ddp here")
    precision = card.train.precision
    mixed = {"bf16": "bf16", "fp16": "fp16"}.get(precision, "no") if device == "cuda" else "no"
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE", "debug": False, "num_processes": d.num_processes,
        "num_machines": d.num_machines, "machine_rank": d.machine_rank, "mixed_precision": mixed,
        "main_training_function": "main", "rdzv_backend": "static", "same_network": True,
        "gpu_ids": "all", "use_cpu": False, "downcast_bf16": "no", "tpu_env": [], "tpu_use_cluster": False,
        "tpu_use_sudo": False,
    }
    if d.main_process_ip:
        config["main_process_ip"] = d.main_process_ip
    if d.main_process_port:
        config["main_process_port"] = d.main_process_port
    if d.strategy == "ddp":
        config["distributed_type"] = "MULTI_GPU"
    else:
        config["distributed_type"] = "FSDP"
        config["fsdp_config"] = {
            "fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_reshard_after_forward": True,
            "fsdp_state_dict_type": "FULL_STATE_DICT", "fsdp_cpu_ram_efficient_loading": False,
            "fsdp_offload_params": False, "fsdp_activation_checkpointing": card.train.gradient_checkpointing,
        }
    return yaml.safe_dump(config, sort_keys=True)


def launch_command(config: Path, run_dir: Path) -> list[str]:
    """The `accelerate launch` command line that trains `run_dir` with `config`."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
            "-m", "labkit.cli.worker", "train", str(run_dir)]
