"""Early stopping on the card's metric: the validation loss, or a generation metric scored as stages 01 and 05 score it.

With `train.early_stopping.metric: eval_loss` transformers' evaluation loop gives the number. With a generation
metric (`field_accuracy`, `rougeL`, …) the `GenerationMetric` callback answers the validation rows at every
evaluation with labkit's batched generation and the card's eval settings (prompt, greedy decoding,
`max_new_tokens`, `batch_size`), scores the answers with `labkit.scoring.metrics` and adds `eval_<metric>` to the
evaluation's metrics. transformers' own machinery then uses it: `metric_for_best_model`, `load_best_model_at_end`
and `EarlyStoppingCallback` (patience, min_delta).

Why an `on_evaluate` callback (transformers 5.24, `Trainer.evaluate`): the evaluation logs its metrics dict (one
row appended to `state.log_history`), calls `on_evaluate` on every callback in list order with that same dict,
and returns it to `_maybe_log_save_evaluate`, which passes it to `_determine_best_metric` (best_metric,
best_global_step) before the checkpoint of that step is saved. A value added to the dict by a callback listed
before `EarlyStoppingCallback` is therefore read by the early stopping and by the best-checkpoint choice, and the
row already logged is completed in place, so the checkpoint's trainer_state.json holds it. No Trainer subclass:
it composes with whichever trainer labkit builds.

Training is left as it was found: the model's train/eval mode, `config.use_cache` and the RNG states (python,
numpy, torch, CUDA) are restored after generating, so the training curve is the one without the metric and a run
resumed from a checkpoint reproduces it. Under DDP each rank answers its share of the very batches one process
would form (`labkit.evaluate.generation.batches`), the answers are gathered on every rank, and every rank scores the same
answers, so all ranks hold the same value and agree on the best checkpoint and on stopping. FSDP is refused by
card validation (`labkit.card.schema.Card`).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from transformers import EarlyStoppingCallback, TrainerCallback

from labkit.card.schema import Card, EarlyStopping
from labkit.data.prompting import prompt_ids
from labkit.evaluate.generation import batches, generate_with_stops
from labkit.evaluate.procedure import score_answers
from labkit.scoring.metrics import metric_value


LOSS = "eval_loss"


def metric_key(stopping: EarlyStopping) -> str:
    """The key the trainer's metrics and log history hold the metric under (`eval_loss`, `eval_field_accuracy`)."""
    return stopping.metric if stopping.metric == LOSS else f"eval_{stopping.metric}"


def greater_is_better(stopping: EarlyStopping) -> bool:
    """The metric's direction: the loss goes down, every generation metric of labkit.scoring.metrics (rates, F1, ROUGE) up."""
    return stopping.metric != LOSS


def trainer_arguments(stopping: EarlyStopping, eval_steps: int) -> dict[str, Any]:
    """The SFTConfig/TrainingArguments fields early stopping needs.

    Args:
        stopping: the card's train.early_stopping.
        eval_steps: the evaluation interval; every evaluation is also a checkpoint, so the best one can be restored.
    Returns:
        save_steps, load_best_model_at_end, metric_for_best_model, greater_is_better, and
        restore_callback_states_from_checkpoint (the patience counter continues across a resume).
    """
    return {"save_steps": eval_steps, "load_best_model_at_end": True, "metric_for_best_model": metric_key(stopping),
            "greater_is_better": greater_is_better(stopping), "restore_callback_states_from_checkpoint": True}


def callbacks(card: Card, tokenizer: Any, eval_rows: list[dict[str, Any]]) -> list[Any]:
    """The callbacks, in the order they must run: the generation metric (if any), then transformers' early stopping.

    Args:
        card: the card (train.early_stopping set).
        tokenizer: the tokenizer.
        eval_rows: the prepared validation rows.
    Returns:
        [GenerationMetric, EarlyStoppingCallback] or [EarlyStoppingCallback] for eval_loss.
    """
    stopping = card.train.early_stopping
    early = EarlyStoppingCallback(early_stopping_patience=stopping.patience, early_stopping_threshold=stopping.min_delta)
    return [early] if stopping.metric == LOSS else [GenerationMetric(card, tokenizer, eval_rows), early]


def shard(lengths: list[int], size: int, rank: int, world: int) -> list[int]:
    """The rows one rank answers: every `world`-th of the batches a single process would form, from `rank` on.

    Given these rows in this order, `generate_answers` forms exactly these batches again (they are consecutive
    runs of the length order), so each answer comes from the batch, and padding, of a single-process evaluation.

    Args:
        lengths: prompt lengths of all rows.
        size: eval.batch_size.
        rank: this process's rank.
        world: the number of processes.
    Returns:
        row indices, in the order to answer them.
    """
    return [i for batch in batches(lengths, size)[rank::world] for i in batch]


def score(model: Any, tokenizer: Any, card: Card, rows: list[dict[str, Any]], metric: str) -> float:
    """The generation metric on `rows` (on every rank of a distributed run, the same value).

    Args:
        model: the model being trained (unwrapped: no DDP collective runs in its forward).
        tokenizer: the tokenizer.
        card: the card (prompt, eval settings, target format).
        rows: the rows to answer and score.
        metric: a name from labkit.scoring.names.METRICS.
    Returns:
        the metric over `rows`, scored by labkit.evaluate.procedure.score_answers as stages 01 and 05 score.
    """
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    rank = dist.get_rank() if world > 1 else 0
    lengths = [len(prompt_ids(tokenizer, card, r["input"])) for r in rows]
    mine = shard(lengths, card.eval.batch_size, rank, world)
    answers = generate_with_stops(model, tokenizer, card, [rows[i] for i in mine], desc=f"eval {metric}: generating")
    pairs = list(zip(mine, answers))
    if world > 1:
        parts: list[Any] = [None] * world
        dist.all_gather_object(parts, pairs)
        pairs = [p for part in parts for p in part]
    by_index = dict(pairs)
    _, metrics = score_answers(card, rows, [by_index[i] for i in range(len(rows))])
    return float(metric_value(metrics, metric))


def _rng_states() -> dict[str, Any]:
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


class GenerationMetric(TrainerCallback):
    """At every evaluation: answer the validation rows, score them, add `eval_<metric>` to the metrics and the log.

    Must be listed before transformers' EarlyStoppingCallback (`callbacks` does it).

    Attributes:
        rows: the validation rows scored (the first train.early_stopping.examples, or all).
        key: the metric's key, e.g. eval_field_accuracy.
    """

    def __init__(self, card: Card, tokenizer: Any, eval_rows: list[dict[str, Any]]) -> None:
        stopping = card.train.early_stopping
        self.card, self.tokenizer, self.metric = card, tokenizer, stopping.metric
        self.rows = list(eval_rows[:stopping.examples] if stopping.examples else eval_rows)
        self.key = metric_key(stopping)

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None,
                    model: Any = None, **kwargs: Any) -> None:
        """Add the metric to `metrics` (read next by EarlyStoppingCallback and the best-checkpoint choice)."""
        start = time.monotonic()
        rng, mode, cache = _rng_states(), model.training, model.config.use_cache
        try:
            value = score(model, self.tokenizer, self.card, self.rows, self.metric)
        finally:  # leave training exactly as it was
            _set_rng_states(rng)
            model.train(mode)
            model.config.use_cache = cache
        seconds = round(time.monotonic() - start, 3)
        added = {self.key: value, "eval_generation_runtime": seconds}
        metrics.update(added)
        row = state.log_history[-1] if state.log_history else {}
        if row.get("step") == state.global_step and "eval_runtime" in row:  # the row this evaluation just logged
            row.update(added)
        else:
            state.log_history.append({**added, "epoch": state.epoch, "step": state.global_step})
        if state.is_world_process_zero:
            print(f"step {state.global_step}: {self.key} = {value:.4f} on {len(self.rows)} validation rows "
                  f"({seconds:.1f} s of generation)", flush=True)


def summary(state: Any, card: Card, validation_rows: int, stopped_early: bool) -> dict[str, Any] | None:
    """Which checkpoint became the adapter and why, as data for training/outcome.json (None without early stopping).

    Args:
        state: the trainer's state after `train()`.
        card: the card.
        validation_rows: the size of the validation split.
        stopped_early: whether the early stopping ended training (not the step limit, the budget or a signal).
    Returns:
        {"metric", "greater_is_better", "patience", "min_delta", "examples" (validation rows scored),
         "evaluations": [{"step", "value"}], "best_step", "best_value", "best_checkpoint", "stopped_early",
         "stopped_at_step", "why"}.
    """
    stopping = card.train.early_stopping
    if stopping is None:
        return None
    key, up = metric_key(stopping), greater_is_better(stopping)
    evaluations = [{"step": r["step"], "value": r[key]} for r in state.log_history if key in r]
    best = state.best_model_checkpoint and Path(state.best_model_checkpoint).name
    why = (f"{best}: {key} = {state.best_metric:.4f}, the {'highest' if up else 'lowest'} of {len(evaluations)} "
           f"evaluations (the earliest on a tie); its weights are the adapter" if best and evaluations
           else "no checkpoint was evaluated: the adapter is the last step's weights")
    if stopped_early:
        why += (f". Training stopped at step {state.global_step}: {stopping.patience} evaluations in a row "
                f"without an improvement of more than {stopping.min_delta} (train.early_stopping.patience, min_delta)")
    examples = min(stopping.examples or validation_rows, validation_rows)  # always None for eval_loss (card check)
    return {"metric": key, "greater_is_better": up, "patience": stopping.patience, "min_delta": stopping.min_delta,
            "examples": examples, "evaluations": evaluations, "best_step": state.best_global_step,
            "best_value": state.best_metric, "best_checkpoint": best, "stopped_early": stopped_early,
            "stopped_at_step": state.global_step, "why": why}
