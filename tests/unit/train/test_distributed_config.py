"""The accelerate configs written from a card, exactly: FSDP (every rank loads nothing twice, saving gathered or
sharded), DeepSpeed ZeRO-2/3 with CPU offload, multi-node keys, precision from the device profile, refusals."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.core.device import load_profile
from labkit.errors import CardError
from labkit.train.distributed import accelerate_config

PROFILES = Path(__file__).resolve().parent.parent / "core" / "profiles"
BASE = {"compute_environment": "LOCAL_MACHINE", "debug": False, "num_processes": 2, "num_machines": 1,
        "machine_rank": 0, "mixed_precision": "no", "main_training_function": "main", "rdzv_backend": "static",
        "same_network": True, "gpu_ids": "all", "use_cpu": False, "downcast_bf16": "no", "tpu_env": [],
        "tpu_use_cluster": False, "tpu_use_sudo": False}


def card(**distributed):
    c = load_card(REPO / "params" / "examples" / "ticket-ddp.yaml").card
    data = c.model_dump()
    data["distributed"].update(distributed)
    return type(c).model_validate(data)


def test_fsdp_config_exactly() -> None:
    got = yaml.safe_load(accelerate_config(card(strategy="fsdp"), "cuda"))
    assert got == {**BASE, "distributed_type": "FSDP", "fsdp_config": {
        "fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_reshard_after_forward": True,
        "fsdp_state_dict_type": "FULL_STATE_DICT", "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_sync_module_states": True, "fsdp_offload_params": False, "fsdp_activation_checkpointing": False}}
    sharded = yaml.safe_load(accelerate_config(card(strategy="fsdp", fsdp_state_dict="sharded"), "cuda"))
    assert sharded["fsdp_config"]["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"


def test_deepspeed_zero2_and_zero3_offload_exactly() -> None:
    two = yaml.safe_load(accelerate_config(card(strategy="deepspeed"), "cuda"))
    assert two == {**BASE, "distributed_type": "DEEPSPEED", "deepspeed_config": {
        "zero_stage": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0, "offload_optimizer_device": "none",
        "offload_param_device": "none", "zero3_init_flag": False, "zero3_save_16bit_model": False}}
    three = yaml.safe_load(accelerate_config(card(strategy="deepspeed", zero_stage=3, offload="cpu", num_machines=2),
                                             "cuda"))
    assert three["deepspeed_config"] == {
        "zero_stage": 3, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0, "offload_optimizer_device": "cpu",
        "offload_param_device": "cpu", "zero3_init_flag": True, "zero3_save_16bit_model": True,
        "deepspeed_multinode_launcher": "standard"}
    # the head's address and port come from each machine's environment (test_launch_command), never the config
    assert (three["num_machines"], three["machine_rank"]) == (2, 0) and "main_process_ip" not in three


def test_refusals() -> None:
    with pytest.raises(CardError, match=r"^distributed.strategy: deepspeed needs CUDA GPUs \(this machine trains on "
                       r"cpu\).*use strategy: ddp here$"):
        accelerate_config(card(strategy="deepspeed"), "cpu")
    with pytest.raises(ValueError, match="zero_stage and offload are deepspeed keys"):
        card(zero_stage=3)


def test_precision_auto_follows_the_device_profile() -> None:
    c = updated(card(), {"train.precision": "auto"})
    t4 = yaml.safe_load(accelerate_config(c, "cuda", load_profile(PROFILES / "2xt4.json")))
    two_h100 = replace(load_profile(PROFILES / "h100.json"), count=2)
    h100 = yaml.safe_load(accelerate_config(c, "cuda", two_h100))
    assert (t4["mixed_precision"], h100["mixed_precision"]) == ("fp16", "bf16")
    assert yaml.safe_load(accelerate_config(c, "cpu"))["mixed_precision"] == "no"
