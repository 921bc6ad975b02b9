"""Stage 04's training, in the notebook's kernel or on every process of an `accelerate launch`.

`run(stage)` trains in the kernel for `distributed.launcher: none`; for `accelerate` it writes an
accelerate config next to the run's data (archived with the run) and launches
`python -m labkit.cli.worker train RUN_DIR` on every process, each building the same trainer. Either
way rank 0 writes `training/outcome.json` (a `TrainingOutcome`), `log_history.jsonl` and the adapter, and the stage
reads those files, never process output: `finish(stage)` records the stage done from them.

The worker process is `labkit.cli.worker` (`accelerate launch --config_file … -m labkit.cli.worker train RUN_DIR`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

from labkit.core import io
from labkit.core.machines import join_timeout
from labkit.core.runs import Run
from labkit.data.prompting import encode_rows
from labkit.errors import StageFailed, TrainingInterrupted
from labkit.model.method import apply_method
from labkit.stages.context import Stage
from labkit.stages.records import (
    ACCELERATE_CONFIG,
    ADAPTER,
    CHECKPOINTS,
    LOG_HISTORY,
    OUTCOME,
    PACKING_CHECK,
    RENDEZVOUS,
    TrainingOutcome,
    TrainingSummary,
)
from labkit.train.distributed import accelerate_config, launch_command, run_launch
from labkit.train.early_stopping import summary as early_stopping_summary
from labkit.train.packing import isolation_check
from labkit.train.resilience import last_checkpoint
from labkit.train.token_count import cost_record
from labkit.train.trainer import build_trainer, loss_history


def train(stage: Stage) -> TrainingOutcome:
    """Train the card's method on the run's training split, continuing from the newest checkpoint.

    Args:
        stage: the training Stage (card, run, tokenizer, data, device).
    Returns:
        the outcome (written to training/outcome.json by rank 0).
    """
    card = stage.card
    model = apply_method(stage.load_model(), card)
    if card.train.packing and not any(p.is_meta for p in model.parameters()):  # FSDP: rank 0 checks (the others: meta)
        _check_packing(stage, model)
    validation = stage.split("validation")
    trainer = build_trainer(card, model, stage.tokenizer, stage.split("train"), stage.path(CHECKPOINTS),
                            eval_rows=validation, device=stage.device, checkpoints=True)
    # the signal handlers from here until the last file is written: a signal after the last step kills no
    # process mid-save (the run stops before its next stage instead: labkit.cli.runner)
    with trainer.labkit_interruption.held():
        return _train_and_write(stage, trainer, len(validation))


def _train_and_write(stage: Stage, trainer: Any, validation_rows: int) -> TrainingOutcome:
    """Train from the newest checkpoint; rank 0 writes the outcome, the loss history and (unless interrupted) the
    adapter."""
    card = stage.card
    resume_from = last_checkpoint(stage.path(CHECKPOINTS))
    if trainer.is_world_process_zero():
        print(f"continuing from {resume_from}" if resume_from else "starting from step 0", flush=True)
    result = trainer.train(resume_from_checkpoint=resume_from)
    interrupted = trainer.labkit_interruption.report(stage.path(CHECKPOINTS), stage.run.run_id)
    outcome: TrainingOutcome = {
        "steps": trainer.state.global_step, "planned_steps": trainer.state.max_steps, "metrics": result.metrics,
        "resumed_from": resume_from, "budget_exhausted": trainer.labkit_budget.exhausted,
        "budget_warning": trainer.labkit_budget.warning, "world_size": trainer.args.world_size,
        "interrupted": interrupted, "best_step": trainer.state.best_global_step,
        "best_eval_loss": trainer.state.best_metric if trainer.args.metric_for_best_model == "eval_loss" else None,
        "early_stopped": False, "early_stopping": None,
        "cost": cast(Any, cost_record(trainer))}  # every process: on the CPU each measures its matmul rate at once
    outcome["early_stopped"] = bool(card.train.early_stopping and trainer.state.global_step < trainer.state.max_steps
                                    and not outcome["budget_exhausted"] and not interrupted)
    # which checkpoint became the adapter, and why (the metric's value at each evaluation)
    outcome["early_stopping"] = early_stopping_summary(trainer.state, card, validation_rows, outcome["early_stopped"])
    adapter_dir = stage.path(ADAPTER)
    if not outcome["interrupted"]:  # every rank: under FSDP / ZeRO-3 the state is gathered collectively (rank 0 writes)
        trainer.save_model(str(adapter_dir))
    if trainer.is_world_process_zero():
        stage.save_jsonl(LOG_HISTORY, loss_history(trainer))
        if not outcome["interrupted"]:
            stage.tokenizer.save_pretrained(adapter_dir)
            save_adapter_info(adapter_dir, stage)
        stage.save_json(OUTCOME, outcome)
    return outcome


def _check_packing(stage: Stage, model: Any) -> None:
    """Before training packed: each of a few examples must have the same loss packed as alone."""
    examples = [{"input_ids": e.input_ids, "labels": e.labels}
                for e in encode_rows(stage.tokenizer, stage.card, stage.split("train")[:6])]
    check = isolation_check(model, examples, stage.card.data.max_length)
    stage.save_json(PACKING_CHECK, check)
    if not check["ok"]:
        raise StageFailed(f"packing would let examples attend to each other: a packed example's loss differs by "
                           f"{check['max_difference']:.2e} (tolerance {check['tolerance']:.0e}); set train.packing: false")


def run(stage: Stage) -> TrainingOutcome:
    """Train for the stage: in this process, or through `accelerate launch` as the card says.

    Returns:
        the outcome written by rank 0 (training/outcome.json).
    Raises:
        TrainingInterrupted: a signal stopped training after a checkpoint.
        StageFailed: the launched training failed (with the end of its output).
    """
    outcome_path = stage.path(OUTCOME)
    outcome_path.unlink(missing_ok=True)
    if stage.card.distributed.launcher == "accelerate":
        _launch(stage)
    else:
        train(stage)
    outcome: TrainingOutcome = io.read_json(outcome_path)
    if outcome["interrupted"]:
        raise TrainingInterrupted(outcome["interrupted"])
    return outcome


def finish(stage: Stage) -> TrainingSummary:
    """Stage 04's record, from the files training wrote (outcome.json, log_history.jsonl), never from a cell's values.

    Args:
        stage: the open training Stage, after `run`.
    Returns:
        the summary written to training/summary.json: steps, the trainer, first and last training loss, training
        seconds (the trainer's train_runtime), processes, the checkpoint resumed from, whether the budget stopped it.
    Raises:
        MissingInput: training has not written its outcome.
    """
    outcome: TrainingOutcome = stage.read(stage.name, OUTCOME)
    losses = [r["loss"] for r in stage.read(stage.name, LOG_HISTORY) if "loss" in r]
    return cast(TrainingSummary, stage.done(
        steps=outcome["steps"], trainer=stage.card.train.trainer, first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None, train_seconds=outcome["metrics"].get("train_runtime"),
        world_size=outcome["world_size"], resumed_from=outcome["resumed_from"],
        budget_exhausted=outcome["budget_exhausted"]))


def _launch(stage: Stage) -> None:
    """`accelerate launch` this module on every process; SIGTERM / Ctrl-C are passed on to the workers. On several
    machines, a launch that ends after the join timeout before every process met fails with which machines did not
    join (torch's static rendezvous waits `LABKIT_JOIN_TIMEOUT` seconds for them)."""
    config = stage.path(ACCELERATE_CONFIG)
    io.write_atomic(config, accelerate_config(stage.card, stage.device))
    machines = stage.card.distributed.num_machines
    command = launch_command(config, stage.run.dir, machines)  # rank, head: environment
    met = stage.path(RENDEZVOUS)
    met.unlink(missing_ok=True)  # a resumed run meets again
    print("$ " + " ".join(command), flush=True)
    start = time.monotonic()
    code, tail = run_launch(command, lambda line: print(line, flush=True))
    if code != 0 and not stage.path(OUTCOME).exists():
        waited = time.monotonic() - start
        if machines > 1 and not met.exists() and waited >= join_timeout():
            raise StageFailed(not_met(stage.run, machines, waited, tail[-1] if tail else ""))
        raise StageFailed(f"accelerate launch exited with {code}:\n" + "\n".join(tail[-12:]))


def record_rendezvous(stage: Stage, world_size: int) -> None:
    """Record that every process of a launch on several machines met (the first process calls it once its process
    group is up): a launch that fails without this record failed before the machines met.

    Args:
        stage: the training Stage, in the first process.
        world_size: the processes that met.
    """
    stage.save_json(RENDEZVOUS, {"machines": stage.card.distributed.num_machines, "processes": world_size,
                                 "time": io.utc_now()})


def not_met(run: Run, machines: int, waited: float, last: str) -> str:
    """Why a launch on several machines ended before its processes met: one line naming the machines that did not
    join (no `logs/machine-<rank>.log`: never started joining; with one: did not connect), and what to run.

    Args:
        run: the run (its logs folder, its id).
        machines: the card's machine count.
        waited: seconds the launch ran.
        last: the launcher's last output line (torch's own statement).
    Returns:
        the line.
    """
    logs = run.dir / "logs"
    absent = [r for r in range(1, machines) if not (logs / f"machine-{r}.log").exists()]
    started = [r for r in range(1, machines) if r not in absent]

    def machines_(ranks: list[int]) -> str:
        return f"machine{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"

    said = ([f"{machines_(absent)} never ran `labkit run --join {run.run_id}`"] if absent else []) + \
        ([f"{machines_(started)} started joining but did not connect (logs/machine-<rank>.log)"] if started else [])
    return (f"the {machines} machines did not all meet in {waited:.0f} s (LABKIT_JOIN_TIMEOUT {join_timeout():g} s): "
            f"{'; '.join(said)}. Start `labkit run --join {run.run_id}` on every other machine (its NODE_RANK, "
            "the same MASTER_ADDR, MASTER_PORT and --runs folder), then run this machine's command again: it resumes "
            f"the run. The launcher's last line: {last[:160]}")


def save_adapter_info(path: Path, stage: Stage) -> None:
    """Tie a saved adapter to the exact base model revision (written next to adapter_config.json)."""
    io.write_json(path / "labkit_base_model.json", {"source": stage.model_source.source,
                                                   "revision": stage.model_source.revision,
                                                   "card_hash": stage.loaded.hash, "run_id": stage.run.run_id})
