"""The process state a training process of `accelerate launch` sets up before its model loads.

transformers decides how `from_pretrained` places the weights from process-wide state, read while the model loads:

- FSDP (`transformers.integrations.is_fsdp_enabled`): a torch.distributed process group, and the environment
  `accelerate launch` writes from labkit's config (ACCELERATE_USE_FSDP, FSDP_CPU_RAM_EFFICIENT_LOADING). With both,
  `labkit.model.loading.load_model` loads the weights on rank 0 only; every other rank holds them on the meta device
  until FSDP broadcasts rank 0's (accelerate's `cpu_ram_efficient_loading`, `sync_module_states`).
- DeepSpeed ZeRO-3 (`transformers.integrations.is_deepspeed_zero3_enabled`): a live `HfDeepSpeedConfig` of stage 3,
  so `from_pretrained` builds the model under `deepspeed.zero.Init` and each rank keeps its partition only.

The trainer creates both only when it is built, after the model has loaded (too late). `prepare` creates them first,
from the same sources the trainer uses: accelerate's `PartialState` (the process group; on a GPU it also selects this
process's device), and for ZeRO-3 accelerate's `DeepSpeedPlugin` read from the launcher's environment (the DeepSpeed
config accelerate builds from labkit's `deepspeed_config`), whose `set_deepspeed_weakref` makes transformers'
`HfDeepSpeedConfig`. The plugin is kept alive here for the life of the process: transformers holds it by weak
reference only. DeepSpeed itself is imported only on that path (the `deepspeed` extra).
"""

from __future__ import annotations

import importlib.util
import os
from datetime import timedelta
from typing import Any

from accelerate import PartialState
from accelerate.utils import DeepSpeedPlugin
from transformers import TrainingArguments

from labkit.card.schema import Card
from labkit.errors import StageFailed

_KEPT: list[Any] = []  # the ZeRO-3 DeepSpeedPlugin, whose HfDeepSpeedConfig transformers reads by weak reference


def prepare(card: Card, device: str) -> Any:
    """Create this process's distributed state before the model loads (every training process calls it).

    Args:
        card: the card (distributed.strategy, zero_stage).
        device: the device type this process trains on ("cuda", "cpu"): CPU processes get a gloo group, as the
            trainer's `use_cpu` gives them (accelerate's state is created once per process: the trainer reuses it).
    Returns:
        accelerate's PartialState (process group up when launched with several processes).
    Raises:
        StageFailed: the card says fsdp or deepspeed but the process was not launched with that accelerate config.
    """
    d = card.distributed
    if d.strategy == "fsdp" and not _flag("ACCELERATE_USE_FSDP"):
        raise StageFailed("distributed.strategy: fsdp, but this process was not started by `accelerate launch` with "
                          "labkit's FSDP config (ACCELERATE_USE_FSDP is not set); start training with `labkit run`")
    if d.strategy == "deepspeed" and not _flag("ACCELERATE_USE_DEEPSPEED"):
        raise StageFailed("distributed.strategy: deepspeed, but this process was not started by `accelerate launch` "
                          "with labkit's DeepSpeed config (ACCELERATE_USE_DEEPSPEED is not set); start it with `labkit run`")
    # the trainer's own timeout (its PartialState reuses this process group): FSDP's other ranks wait in the
    # broadcast while rank 0 reads the checkpoint
    timeout = timedelta(seconds=TrainingArguments.__dataclass_fields__["ddp_timeout"].default)
    state = PartialState(cpu=device.split(":")[0] == "cpu", timeout=timeout)
    if d.strategy == "deepspeed" and d.zero_stage == 3:
        _KEPT[:] = [zero3_config()]
    return state


def zero3_config() -> Any:
    """The DeepSpeed ZeRO-3 config transformers reads while loading (`is_deepspeed_zero3_enabled`, `deepspeed_config`).

    Built as transformers' TrainingArguments builds it under `accelerate launch` (training_args.py: DeepSpeedPlugin()
    from the launcher's ACCELERATE_DEEPSPEED_* environment, the launcher's mixed precision, `set_deepspeed_weakref`),
    so the config that partitions the model at load is the one the trainer then trains with.

    Returns:
        the accelerate DeepSpeedPlugin, holding transformers' HfDeepSpeedConfig (`dschf`): keep it alive.
    Raises:
        StageFailed: DeepSpeed is not installed.
    """
    if importlib.util.find_spec("deepspeed") is None:  # transformers' HfDeepSpeedConfig imports it
        raise StageFailed("distributed.strategy: deepspeed needs DeepSpeed, which is not installed here: "
                          "pip install 'labkit[deepspeed]' on the GPU machine, or use distributed.strategy: fsdp")
    plugin = DeepSpeedPlugin()
    plugin.set_mixed_precision(os.environ.get("ACCELERATE_MIXED_PRECISION", "no"))
    plugin.set_deepspeed_weakref()
    return plugin


def _flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() == "true"
