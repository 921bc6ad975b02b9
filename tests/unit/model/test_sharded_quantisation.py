"""QLoRA under sharding: FSDP and DeepSpeed ZeRO-3 store the 4-bit codes in the weights' dtype (bitsandbytes'
`bnb_4bit_quant_storage`), so they shard like the other weights; ZeRO-2, DDP and one process keep bitsandbytes' uint8.
A combination labkit cannot check (packing under ZeRO-3) is refused by `labkit check` in one line naming the
combination and the alternatives (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.errors import CardError
from labkit.model.loading import pick_dtype, quantization_config, sharded_loading

pytest.importorskip("bitsandbytes")


def _qlora(**distributed: object) -> object:
    card = load_card(REPO / "params" / "examples" / "dialogsum-phi2-qlora-sft.yaml").card
    changes = {"model.dtype": "bfloat16", **{f"distributed.{k}": v for k, v in distributed.items()}}
    return updated(card, changes)


@pytest.mark.parametrize(("distributed", "storage"), [
    ({"launcher": "accelerate", "strategy": "deepspeed", "zero_stage": 3, "num_processes": 2}, torch.bfloat16),
    ({"launcher": "accelerate", "strategy": "fsdp", "num_processes": 2}, torch.bfloat16),
    ({"launcher": "accelerate", "strategy": "deepspeed", "zero_stage": 2, "num_processes": 2}, torch.uint8),
    ({"launcher": "accelerate", "strategy": "ddp", "num_processes": 2}, torch.uint8),
    ({}, torch.uint8),
])
def test_the_4bit_storage_dtype_follows_the_sharding(distributed: dict, storage: torch.dtype) -> None:
    config = quantization_config(_qlora(**distributed), "cpu")
    assert config.load_in_4bit and config.bnb_4bit_quant_storage == storage


def test_the_zero3_qlora_storage_is_the_weights_dtype() -> None:
    card = updated(_qlora(launcher="accelerate", strategy="deepspeed", zero_stage=3, num_processes=2),
                   {"model.dtype": "float32", "train.precision": "fp32"})
    assert quantization_config(card, "cpu").bnb_4bit_quant_storage == pick_dtype(card, "cpu") == torch.float32


def test_no_sharded_loading_without_the_process_state() -> None:
    assert sharded_loading() is None  # no process group, no ZeRO-3 config: from_pretrained loads whole, as before


def test_packing_under_zero3_exits_2_naming_the_combination_and_the_alternatives(tmp_path: Path) -> None:
    card = tmp_path / "zero3-packing.yaml"
    card.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\ntrain:\n  packing: true\ndistributed:\n"
                    "  launcher: accelerate\n  strategy: deepspeed\n  zero_stage: 3\n  num_processes: 2\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "LABKIT_RUNS": str(tmp_path / "runs")}
    done = subprocess.run([sys.executable, "-m", "labkit", "check", str(card)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "train.packing" in line]
    assert len(lines) == 1 and f"{card}:3: train.packing: true with distributed.strategy: deepspeed, zero_stage: 3" \
        in lines[0], lines
    for alternative in ("distributed.zero_stage: 2", "distributed.strategy: fsdp", "train.packing: false"):
        assert alternative in lines[0], lines[0]
    for name, fine in (("zero2", "strategy: deepspeed, zero_stage: 2"), ("fsdp", "strategy: fsdp")):
        alternative = tmp_path / f"{name}.yaml"  # the alternatives the line names load
        alternative.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\ntrain: {{packing: true}}\n"
                               f"distributed: {{launcher: accelerate, {fine}, num_processes: 2}}\n")
        assert load_card(alternative).card.train.packing


def test_the_refusal_is_a_card_error_on_load(tmp_path: Path) -> None:
    card = tmp_path / "c.yaml"
    card.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\ntrain: {{packing: true}}\n"
                    "distributed: {launcher: accelerate, strategy: deepspeed, zero_stage: 3, num_processes: 2}\n")
    with pytest.raises(CardError, match=r"train\.packing: true with distributed\.strategy: deepspeed, zero_stage: 3"):
        load_card(card)


def test_a_zero3_qlora_card_loads(tmp_path: Path) -> None:
    """ZeRO-3 + QLoRA is not refused: it gets the storage dtype instead."""
    card = tmp_path / "zero3-qlora.yaml"
    card.write_text(f"parent: {REPO / 'params' / 'examples' / 'dialogsum-phi2-qlora-sft.yaml'}\n"
                    "distributed: {launcher: accelerate, strategy: deepspeed, zero_stage: 3, num_processes: 2}\n")
    loaded = load_card(card).card
    assert loaded.method.kind == "qlora" and loaded.distributed.zero_stage == 3
