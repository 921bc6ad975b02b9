"""Beyond one device: stage 04 through `accelerate launch` with 2 CPU processes (DDP over gloo), for real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import labkit
from labkit.cards import CardError, load_card
from labkit.distributed import accelerate_config

REPO = Path(__file__).resolve().parent.parent


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "training" / "log_history.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_ddp_two_cpu_processes_match_one_process(tmp_path: Path, smoke_run) -> None:
    card = tmp_path / "smoke-ddp.yaml"
    card.write_text(yaml.safe_dump({
        "parent": str(REPO / "params" / "smoke.yaml"), "experiment": {"variant": "tiny-lora-ddp2"},
        "train": {"micro_batch": 2},  # 2 processes × 2 = the smoke card's batch of 4
        "distributed": {"launcher": "accelerate", "strategy": "ddp", "num_processes": 2}}))
    runs = tmp_path / "runs"
    proc = labkit("run", str(card), runs=runs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = [p for p in (runs / "smoke").iterdir() if not p.name.startswith("_")]
    outcome = json.loads((run / "training" / "outcome.json").read_text())
    assert outcome["world_size"] == 2 and outcome["steps"] == 8
    config = yaml.safe_load((run / "training" / "accelerate_config.yaml").read_text())
    assert config["num_processes"] == 2 and config["distributed_type"] == "MULTI_GPU"
    single, ddp = _losses(smoke_run[0]), _losses(run)
    assert single.keys() == ddp.keys() and len(ddp) >= 4
    for step, loss in single.items():  # same global batch, same data order: equal up to float summation order
        assert abs(ddp[step] - loss) <= 1e-5 * abs(loss), (step, loss, ddp[step])
    assert (run / "training" / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((run / "comparison" / "verdict.json").read_text())["primary"]["metric"] == "field_accuracy"


def test_fsdp_config_and_card_rules(tmp_path: Path) -> None:
    loaded = load_card(REPO / "params" / "examples" / "ticket-ddp.yaml")
    card = loaded.card.model_copy(deep=True)
    card.distributed.strategy = "fsdp"
    fsdp = yaml.safe_load(accelerate_config(card, "cuda"))
    assert fsdp["distributed_type"] == "FSDP" and fsdp["fsdp_config"]["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\ndistributed: {{num_processes: 2}}\n")
    with pytest.raises(CardError, match=r"bad.yaml.*distributed.*num_processes > 1 needs launcher: accelerate"):
        load_card(bad)
