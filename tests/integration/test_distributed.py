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


def test_a_signal_during_the_stop_agreement_stops_every_process_at_the_same_step(tmp_path: Path) -> None:
    """Process 0 is signalled while it waits in the agreement's all-reduce at step 1: it must not stop there alone
    (process 1 would train step 2 and wait for it forever); both stop at step 2, and either can name the cause."""
    import os
    import subprocess
    import sys

    card = load_card(REPO / "params" / "examples" / "ticket-ddp.yaml").card
    config = tmp_path / "accelerate.yaml"
    config.write_text(accelerate_config(updated(card, {"distributed.num_processes": 2}), "cpu"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
                           "--main_process_port", "0", str(REPO / "tests" / "integration" / "ddp_signal.py"),
                           str(tmp_path)], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [s["decisions"] for s in seen] == [[False, True], [False, True]], seen
    assert (seen[0]["signal"], seen[1]["signal"]) == ("SIGTERM", None)
    assert seen[0]["report"].startswith("SIGTERM at step 2") and seen[1]["report"].startswith(
        "a signal to another process at step 2")


def test_two_machines_make_one_run_with_the_one_machine_loss_curve(ddp_run: Path, tmp_path: Path) -> None:
    """Two "machines" on this host (1 CPU process each, rendezvous on 127.0.0.1, one shared runs folder). The head
    alone `labkit run CARD --run-id ID` gives up after LABKIT_JOIN_TIMEOUT with one line naming the machine that
    never joined; its command again with the other's `labkit run --join ID` beside it resumes → one run, one
    registry `started` line, one outcome.json of world size 2, and the loss curve of the same card on one machine."""
    import os
    import socket
    import subprocess
    import sys

    card = tmp_path / "smoke-2machines.yaml"
    card.write_text(yaml.safe_dump({
        "parent": str(REPO / "params" / "smoke.yaml"), "experiment": {"variant": "tiny-lora-2machines"},
        "train": {"micro_batch": 2},
        "distributed": {"launcher": "accelerate", "strategy": "ddp", "num_processes": 2, "num_machines": 2}}))
    runs = tmp_path / "runs"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SKYPILOT_"))}
    env.update(LABKIT_RUNS=str(runs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LABKIT_JOIN_TIMEOUT="300")

    def start(rank: int, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "labkit", "run", *args], cwd=REPO, text=True,
                                env={**env, "NODE_RANK": str(rank)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    alone = subprocess.run([sys.executable, "-m", "labkit", "run", str(card), "--run-id", "two-machines"], cwd=REPO,
                           text=True, env={**env, "NODE_RANK": "0", "LABKIT_JOIN_TIMEOUT": "15"}, capture_output=True,
                           timeout=900)
    assert alone.returncode != 0, alone.stdout + alone.stderr
    said = [line for line in (alone.stdout + alone.stderr).splitlines() if "did not all meet" in line]
    assert said and "LABKIT_JOIN_TIMEOUT 15 s" in said[0] and "machine 1 never ran `labkit run --join two-machines`" \
        in said[0], alone.stdout[-3000:] + alone.stderr[-3000:]
    first = json.loads((runs / "smoke" / "two-machines" / "status.json").read_text())
    assert first["status"] == "failed" and first["stages"]["parameter_check"]["status"] == "done"
    assert not (runs / "smoke" / "two-machines" / "training" / "rendezvous.json").exists()
    joiner = start(1, "--join", "two-machines")  # first: it waits for the head's stage 04
    head = start(0, str(card), "--run-id", "two-machines")  # the same command again: resumes at stage 04
    head_out, _ = head.communicate(timeout=900)
    join_out, _ = joiner.communicate(timeout=300)
    assert head.returncode == 0, head_out
    assert joiner.returncode == 0, join_out
    assert join_out.strip().splitlines()[-1].startswith("joined smoke/two-machines: training done, 8 steps on 2 "
                                                         "processes"), join_out
    (run,) = [p for p in (runs / "smoke").iterdir() if not p.name.startswith("_")]
    assert run.name == "two-machines"
    registry = [json.loads(line) for line in (runs / "registry.jsonl").read_text().splitlines()]
    assert [e["event"] for e in registry].count("started") == 1 and {e["run_id"] for e in registry} == {run.name}
    assert [e["event"] for e in registry].count("resumed") == 1
    assert json.loads((run / "training" / "rendezvous.json").read_text())["processes"] == 2
    outcome = json.loads((run / "training" / "outcome.json").read_text())
    assert outcome["world_size"] == 2 and outcome["steps"] == 8
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "completed" and status["pid"] == head.pid
    # the joining machine wrote its log (and its processes their share of each checkpoint), nothing of the run's record
    envs = sorted(p.name for p in run.glob("env*.json"))  # the head's first session and its resumed one, none else
    assert len(envs) == 2 and envs[0] == "env.json" and envs[1].startswith("env.resumed-"), envs
    assert "joined smoke/two-machines" in (run / "logs" / "machine-1.log").read_text()
    assert sorted(p.name for p in (run / "logs").iterdir() if p.name.startswith("machine-")) == ["machine-1.log"]
    one_machine, two_machines = _losses(ddp_run), _losses(run)
    assert one_machine.keys() == two_machines.keys() and len(two_machines) >= 4
    for step, loss in one_machine.items():  # the same global batch on 2 processes: equal up to summation order
        assert abs(two_machines[step] - loss) <= 1e-5 * abs(loss), (step, loss, two_machines[step])
    again = subprocess.run([sys.executable, "-m", "labkit", "run", str(card), "--run-id", "two-machines"], cwd=REPO,
                           text=True, env={**env, "NODE_RANK": "0"}, capture_output=True, timeout=300)
    assert again.returncode == 0 and "is already completed: nothing to do" in again.stdout, again.stdout + again.stderr
