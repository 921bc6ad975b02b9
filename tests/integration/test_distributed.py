"""Beyond one device: stage 04 through `accelerate launch` with 2 CPU processes (DDP over gloo), for real."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import yaml
from conftest import REPO, labkit

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.errors import CardError
from labkit.model.method import trainer_checkpointing
from labkit.train.distributed import accelerate_config


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "training" / "log_history.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ddp")
    card = folder / "smoke-ddp.yaml"
    card.write_text(yaml.safe_dump({
        "parent": str(REPO / "params" / "smoke.yaml"), "experiment": {"variant": "tiny-lora-ddp2"},
        "train": {"micro_batch": 2},  # 2 processes × 2 = the smoke card's batch of 4
        "distributed": {"launcher": "accelerate", "strategy": "ddp", "num_processes": 2}}))
    runs = folder / "runs"
    proc = labkit("run", str(card), runs=runs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = [p for p in (runs / "smoke").iterdir() if not p.name.startswith("_")]
    return run


def test_ddp_two_cpu_processes_match_one_process(ddp_run: Path, smoke_run) -> None:
    run = ddp_run
    outcome = json.loads((run / "training" / "outcome.json").read_text())
    assert outcome["world_size"] == 2 and outcome["steps"] == 8
    config = yaml.safe_load((run / "training" / "accelerate_config.yaml").read_text())
    assert config["num_processes"] == 2 and config["distributed_type"] == "MULTI_GPU"
    single, ddp = _losses(smoke_run[0]), _losses(run)
    assert single.keys() == ddp.keys() and len(ddp) >= 4
    for step, loss in single.items():  # same global batch, same data order: equal up to float summation order
        assert abs(ddp[step] - loss) <= 1e-5 * abs(loss), (step, loss, ddp[step])
    # the same batches, counted on two processes and summed: the one process's count (labkit.train.token_count)
    alone = json.loads((smoke_run[0] / "training" / "outcome.json").read_text())["cost"]
    cost = outcome["cost"]
    assert cost["world_size"] == 2 and (cost["tokens"], cost["loss_tokens"]) == (alone["tokens"], alone["loss_tokens"])
    assert 0 < cost["mfu"] < 1 and cost["peak_flops"] > 0
    assert (run / "training" / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((run / "comparison" / "verdict.json").read_text())["primary"]["metric"] == "field_accuracy"


def test_fsdp_config_and_card_rules(tmp_path: Path) -> None:
    loaded = load_card(REPO / "params" / "examples" / "ticket-ddp.yaml")
    card = updated(loaded.card, {"distributed.strategy": "fsdp"})
    fsdp = yaml.safe_load(accelerate_config(card, "cuda"))
    assert fsdp["distributed_type"] == "FSDP" and fsdp["fsdp_config"]["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    # checkpointing on: FSDP's own, the trainer's off (transformers refuses both: tests/unit/train/test_fsdp_checkpointing)
    checkpointed = updated(card, {"train.gradient_checkpointing": True})
    assert yaml.safe_load(accelerate_config(checkpointed, "cuda"))["fsdp_config"]["fsdp_activation_checkpointing"] is True
    assert not trainer_checkpointing(checkpointed) and trainer_checkpointing(updated(checkpointed, {
        "distributed.strategy": "ddp"}))
    with pytest.raises(ValueError, match=r"strategy: fsdp needs CUDA GPUs .*use strategy: ddp"):
        accelerate_config(card, "cpu")  # accelerate would wrap CPU processes in DDP: nothing sharded
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\ndistributed: {{num_processes: 2}}\n")
    with pytest.raises(CardError, match=r"bad.yaml.*distributed.*num_processes > 1 needs launcher: accelerate"):
        load_card(bad)


def test_sigterm_under_ddp_checkpoints_every_worker_and_resumes(ddp_run: Path) -> None:
    from test_resilience import _rewind_to_training, _start_resume, _wait_for_checkpoint

    run = _rewind_to_training(ddp_run, "tiny-lora-ddp2-terminated")
    proc = _start_resume(run)
    _wait_for_checkpoint(run, proc)
    proc.send_signal(signal.SIGTERM)  # → the kernel → the workers, who agree on a step and checkpoint
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out + err
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "interrupted" and status["stages"]["training"]["status"] == "interrupted"
    step = int(status["stages"]["training"]["error"].split("SIGTERM at step ")[1].split(";")[0])
    checkpoint = run / "training" / "trainer" / f"checkpoint-{step}"
    assert (checkpoint / "trainer_state.json").exists() and len(list(checkpoint.glob("rng_state_*.pth"))) == 2
    resumed = labkit("run", "--resume", run.name, runs=run.parent.parent)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert _losses(run) == _losses(ddp_run)
