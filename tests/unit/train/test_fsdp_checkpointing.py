"""Activation checkpointing is owned by exactly one layer under FSDP: the trainer built from an FSDP card with
`train.gradient_checkpointing: true` passes transformers' own check against the FSDP plugin accelerate builds from
labkit's config, and the trainer's checkpointing stays on for the other strategies.

accelerate 1.15 attaches an FSDP plugin to its state only for GPU-like process groups (on CPU processes the state is
MULTI_CPU and `state.fsdp_plugin` stays None, so transformers skips the check). The closest real check on this
machine: the environment comes from accelerate's launcher code (`prepare_multi_gpu_env`) for labkit's config, the
plugin is accelerate's `FullyShardedDataParallelPlugin()` read from that environment (as `Accelerator` builds it), it
is put where a GPU process's state holds it, and transformers' `Trainer.create_accelerator_and_postprocess` (which
raises "can't both be set to True") runs on the trainer labkit built. The same check refuses the trainer's own
checkpointing next to FSDP's, so it is shown to run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import REPO, smoke_rows

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.model.method import trainer_checkpointing
from labkit.train.distributed import accelerate_config

CHILD = r"""
import json, sys
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from labkit.card.load import load_card
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.model.sources import resolve
from labkit.train.process_state import prepare
from labkit.train.trainer import build_trainer

card = load_card(sys.argv[1]).card
prepare(card, "cpu")
resolved = resolve(card.model.source)
model = apply_method(load_model(resolved, card, "cpu"), card)
rows = json.loads(open(sys.argv[3]).read())
trainer = build_trainer(card, model, load_tokenizer(resolved, card), rows, sys.argv[2], device="cpu")
state = AcceleratorState()
print("CPU_STATE", state.distributed_type, getattr(state, "fsdp_plugin", None), trainer.is_fsdp_enabled)
plugin = FullyShardedDataParallelPlugin()  # from the launcher's environment, as Accelerator builds it
print("PLUGIN", plugin.fsdp_version, plugin.activation_checkpointing, plugin.cpu_ram_efficient_loading)
state.distributed_type, state.fsdp_plugin = DistributedType.FSDP, plugin  # where a GPU process's state holds it
print("TRAINER", trainer.args.activation_checkpointing)
trainer.create_accelerator_and_postprocess()  # transformers' own validation
print("ACCEPTED", trainer.is_fsdp_enabled)
trainer.args.activation_checkpointing = True  # the trainer's checkpointing too: the same check must refuse it
try:
    trainer.create_accelerator_and_postprocess()
except ValueError as exc:
    print("REFUSED", str(exc).splitlines()[0])
"""


def _fsdp_card(tmp_path: Path) -> Path:
    card = tmp_path / "fsdp.yaml"
    card.write_text(yaml.safe_dump({
        "parent": str(REPO / "params" / "smoke.yaml"), "train": {"gradient_checkpointing": True},
        "distributed": {"launcher": "accelerate", "strategy": "fsdp", "num_processes": 2}}))
    return card


def _launcher_env(config: Path) -> dict[str, str]:
    """The environment accelerate 1.15's launcher gives each process for this config (its own code)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", str(config), "x.py"]))
    return {k: v for k, v in prepare_multi_gpu_env(args).items() if k.startswith(("FSDP_", "ACCELERATE_"))}


def test_the_trainer_accepts_the_generated_fsdp_arguments_with_checkpointing_on(tmp_path: Path) -> None:
    card_path = _fsdp_card(tmp_path)
    config = tmp_path / "accelerate_config.yaml"
    config.write_text(accelerate_config(load_card(card_path).card, "cuda"))
    launched = _launcher_env(config)
    assert launched["ACCELERATE_USE_FSDP"] == "true" and launched["FSDP_ACTIVATION_CHECKPOINTING"] == "true"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "OMP_NUM_THREADS": "1",
           **launched, "ACCELERATE_MIXED_PRECISION": "no"}
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps(smoke_rows(8)))
    done = subprocess.run([sys.executable, "-c", CHILD, str(card_path), str(tmp_path / "out"), str(rows)], env=env,
                          capture_output=True, text=True, timeout=600)
    out = done.stdout
    assert done.returncode == 0, (out + done.stderr)[-3000:]
    assert "CPU_STATE DistributedType.MULTI_CPU None False" in out  # why the plugin is put in place by hand on the CPU
    assert "PLUGIN 2 True True" in out  # FSDP2, its own checkpointing on, rank-0 loading: from labkit's config
    assert "TRAINER False" in out and "ACCEPTED True" in out  # transformers' validation ran with FSDP enabled
    assert "REFUSED `fsdp_config['activation_checkpointing']`" in out and "can't both be set to True" in out


def test_checkpointing_is_the_trainers_under_the_other_strategies() -> None:
    base = updated(load_card(REPO / "params" / "smoke.yaml").card, {"train.gradient_checkpointing": True})
    assert trainer_checkpointing(base)
    for strategy in ("ddp", "deepspeed"):
        card = updated(base, {"distributed.launcher": "accelerate", "distributed.strategy": strategy,
                              "distributed.num_processes": 2})
        assert trainer_checkpointing(card), strategy
        config = yaml.safe_load(accelerate_config(card, "cuda"))
        assert "fsdp_config" not in config
    fsdp = updated(base, {"distributed.launcher": "accelerate", "distributed.strategy": "fsdp",
                          "distributed.num_processes": 2})
    assert not trainer_checkpointing(fsdp)
    assert yaml.safe_load(accelerate_config(fsdp, "cuda"))["fsdp_config"]["fsdp_activation_checkpointing"] is True
    off = updated(fsdp, {"train.gradient_checkpointing": False})
    assert not trainer_checkpointing(off)
    assert yaml.safe_load(accelerate_config(off, "cuda"))["fsdp_config"]["fsdp_activation_checkpointing"] is False
