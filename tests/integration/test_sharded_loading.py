"""Sharding at load, measured in a real 2-process gloo group on the CPU: under FSDP's loading path labkit's loader
(`labkit.train.process_state.prepare`, then `labkit.model.loading.load_model`, as `labkit.cli.worker` does) loads the
weights on rank 0 only, and rank 1's parameters are on the meta device; under DDP each process holds one whole copy.

Each process is started as `accelerate launch` / torchrun start it (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), with the FSDP environment accelerate's launcher writes from labkit's config (`prepare_multi_gpu_env`:
ACCELERATE_USE_FSDP, FSDP_CPU_RAM_EFFICIENT_LOADING). The model is `tiny:mistral` with a ChatML card, so the
embeddings are also resized (on the meta device on rank 1) and LoRA is applied on both ranks. Then accelerate's own
FSDP2 preparation (`fsdp2_prepare_model`, with the plugin accelerate builds from that environment put where a GPU
process's state holds it: on CPU processes accelerate's state stays MULTI_CPU) broadcasts rank 0's weights and shards
them: each rank holds half, and gathered they equal the saved weights on both ranks. Training under FSDP itself is not
run here (accelerate wraps CPU processes in DDP).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

CHILD = r"""
import json, sys
import torch, torch.distributed as dist
from safetensors.torch import load_file
from labkit.card.load import load_card
from labkit.model.loading import load_model, sharded_loading
from labkit.model.method import apply_method
from labkit.model.sources import resolve
from labkit.train.process_state import prepare

card = load_card(sys.argv[1]).card
prepare(card, "cpu")
resolved = resolve(card.model.source)
model = load_model(resolved, card, "cpu")
params = dict(model.named_parameters())
saved = {}
for file in sorted(__import__("pathlib").Path(resolved.location).glob("*.safetensors")):
    saved.update(load_file(file))
equal = all(torch.equal(p[: saved[n].shape[0]], saved[n].to(p.dtype)) for n, p in params.items()
            if n in saved and p.device.type != "meta")
report = {"rank": dist.get_rank(), "sharded": sharded_loading(), "total": sum(p.numel() for p in params.values()),
          "real": sum(p.numel() for p in params.values() if p.device.type != "meta"),
          "meta_tensors": sum(p.device.type == "meta" for p in params.values()), "tensors": len(params),
          "compared": sum(n in saved for n in params), "equal_to_saved": equal,
          "rows": model.get_input_embeddings().weight.shape[0], "saved_rows": saved["model.embed_tokens.weight"].shape[0],
          "buffers_real": all(b.device.type != "meta" for b in model.buffers())}
wrapped = apply_method(model, card)
report["lora_meta"] = sorted({p.device.type for n, p in wrapped.named_parameters() if "lora_" in n})
report["trainable"] = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
report["buffers_after_method"] = {n: float(b.double().sum()) for n, b in wrapped.named_buffers() if not b.is_meta}
report["meta_buffers_after_method"] = sum(b.is_meta for b in wrapped.buffers())
if sys.argv[2] == "fsdp":  # accelerate's own FSDP2 preparation: rank 0's weights broadcast, then sharded
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    accelerator = Accelerator(cpu=True)
    state = AcceleratorState()  # on CPU processes accelerate keeps MULTI_CPU: the plugin goes where a GPU's state has it
    state.distributed_type, state.fsdp_plugin = DistributedType.FSDP, FullyShardedDataParallelPlugin()
    sharded = fsdp2_prepare_model(accelerator, wrapped)
    full = {n.replace("base_model.model.", "").replace(".token_adapter", "").replace(".base_layer", ""): p.full_tensor()
            for n, p in sharded.named_parameters()}
    report["after_fsdp_equal_to_saved"] = all(torch.equal(full[n][: t.shape[0]], t.to(full[n].dtype))
                                              for n, t in saved.items() if n in full)
    report["after_fsdp_compared"] = sum(n in full for n in saved)
    report["after_fsdp_local"] = sum(p.to_local().numel() for p in sharded.parameters())
    report["after_fsdp_total"] = sum(t.numel() for t in full.values())
print("REPORT " + json.dumps(report), flush=True)
dist.destroy_process_group()
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _card(tmp_path: Path, strategy: str) -> Path:
    card = tmp_path / f"{strategy}.yaml"
    card.write_text(yaml.safe_dump({
        "parent": str(REPO / "params" / "smoke.yaml"), "model": {"source": "tiny:mistral", "dtype": "float32"},
        "data": {"prompt": {"chat_template": "chatml"}},
        "distributed": {"launcher": "accelerate", "strategy": strategy, "num_processes": 2}}))
    return card


def _two_processes(tmp_path: Path, strategy: str, extra_env: dict[str, str]) -> list[dict]:
    from labkit.model.sources import resolve

    card = _card(tmp_path, strategy)
    resolve("tiny:mistral")  # built once, before two processes read it
    port = str(_port())
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1",
               **extra_env}
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD, str(card), strategy], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    reports = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:]
        reports.append(json.loads(next(line for line in out.splitlines() if line.startswith("REPORT "))[7:]))
    return sorted(reports, key=lambda r: r["rank"])


@pytest.fixture(scope="module")
def fsdp_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment `accelerate launch` gives each process for labkit's FSDP config (accelerate 1.15's own code)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    from labkit.card.load import load_card
    from labkit.train.distributed import accelerate_config

    folder = tmp_path_factory.mktemp("fsdp-env")
    config = folder / "accelerate_config.yaml"
    config.write_text(accelerate_config(load_card(_card(folder, "fsdp")).card, "cuda"))
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", str(config), "x.py"]))
    env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if k.startswith(("FSDP_", "ACCELERATE_USE_FSDP"))}


def test_fsdp_loading_puts_the_weights_on_rank_0_only(tmp_path: Path, fsdp_env: dict[str, str]) -> None:
    assert fsdp_env["ACCELERATE_USE_FSDP"] == "true" and fsdp_env["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true"
    zero, one = _two_processes(tmp_path, "fsdp", fsdp_env)
    assert zero["sharded"] == one["sharded"] == "fsdp"  # transformers' is_fsdp_enabled() at load, on both ranks
    assert zero["total"] == one["total"] > 0
    # rank 0: every parameter real, equal to the saved weights (the resized embeddings: their saved rows)
    assert zero["real"] == zero["total"] and zero["meta_tensors"] == 0
    assert zero["equal_to_saved"] and zero["compared"] >= zero["tensors"] - 1  # all but a tied/absent head
    # rank 1: nothing of the weights in memory; its buffers (rotary frequencies) real, as FSDP keeps them
    assert one["real"] == 0 and one["meta_tensors"] == one["tensors"] and one["buffers_real"]
    # the ChatML rows were added on both ranks (mean resizing on rank 0, the shape only on rank 1)
    assert zero["rows"] == one["rows"] > zero["saved_rows"]
    # LoRA applies on both; rank 1's adapters wait on the meta device for rank 0's broadcast
    assert zero["lora_meta"] == ["cpu"] and one["lora_meta"] == ["meta"]
    assert zero["trainable"] == one["trainable"] > 0
    # buffers copied from the weights by the method (peft's original ChatML rows): rank 0's values on rank 1 too
    assert one["meta_buffers_after_method"] == 0 and one["buffers_after_method"] == zero["buffers_after_method"]
    # accelerate's FSDP2 preparation: every rank then holds half of the weights, and gathered they are the saved ones
    for report in (zero, one):
        assert report["after_fsdp_equal_to_saved"] and report["after_fsdp_compared"] == zero["compared"]
        assert report["after_fsdp_local"] * 2 == report["after_fsdp_total"], report


def test_ddp_loading_gives_each_process_one_whole_copy(tmp_path: Path) -> None:
    zero, one = _two_processes(tmp_path, "ddp", {})
    assert zero["sharded"] is None and one["sharded"] is None
    for report in (zero, one):
        assert report["real"] == report["total"] > 0 and report["meta_tensors"] == 0 and report["equal_to_saved"]
        assert report["lora_meta"] == ["cpu"]
