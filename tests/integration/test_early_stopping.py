"""Early stopping on a generation metric (labkit/train/early_stopping.py), on the tiny model with the real trainer:
the metric logged at each evaluation is labkit's evaluation of that step's weights, transformers' early stopping
and best-checkpoint choice use it, training is undisturbed by the generation, a resumed run reproduces the
uninterrupted one, and the card refuses what cannot work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from transformers import TrainerCallback

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.card.schema import EarlyStopping
from labkit.data import sources as D
from labkit.data.prompting import prompt_ids
from labkit.errors import CardError
from labkit.evaluate.generation import generate_answers
from labkit.evaluate.procedure import evaluate_rows
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.train.early_stopping import shard
from labkit.train.trainer import build_trainer, loss_history

MAX_STEPS = 24


def _card(metric: str = "rougeL", patience: int = 2, **train: object):
    """The smoke card, evaluated every 2 steps, with early stopping on `metric` (rougeL: a random tiny model
    scores above 0 on it now and then, so the values are not all the same)."""
    return updated(load_card(REPO / "params" / "smoke.yaml").card, {
        "train.lr": 2e-2, "train.max_steps": MAX_STEPS, "train.eval_steps": 2,
        "train.save_total_limit": 20,  # keep every checkpoint, so each logged value can be re-measured
        "train.early_stopping": EarlyStopping(metric=metric, patience=patience),
        **{f"train.{key}": value for key, value in train.items()}})


def _rows(card) -> tuple[list[dict], list[dict]]:
    rows = [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()]
    return rows[:32], rows[32:40]


def _train(card, tiny_model, out: Path, extra: list | None = None, resume: str | None = None):
    train_rows, eval_rows = _rows(card)
    model = apply_method(load_model(tiny_model, card, "cpu"), card)
    trainer = build_trainer(card, model, load_tokenizer(tiny_model, card), train_rows, out, eval_rows=eval_rows,
                            device="cpu", checkpoints=True, disable_tqdm=True)
    for callback in extra or []:
        trainer.add_callback(callback)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory, tiny_model):
    out = tmp_path_factory.mktemp("stop-rouge")
    return _train(_card(), tiny_model, out), out


def _lora(model) -> dict:
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


def test_stops_on_the_generation_metric_and_keeps_the_best_checkpoint(stopped, tiny_model) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file

    trainer, out = stopped
    card = _card()
    evals = [(r["step"], r["eval_rougeL"]) for r in trainer.state.log_history if "eval_rougeL" in r]
    assert [s for s, _ in evals] == list(range(2, trainer.state.global_step + 1, 2))  # one value per evaluation
    assert all("eval_loss" in r for r in trainer.state.log_history if "eval_rougeL" in r)  # in the evaluation's row
    assert len({v for _, v in evals}) > 1, "the metric moved during training"
    best_step, best = max(evals, key=lambda e: (e[1], -e[0]))  # the highest, the earliest on a tie
    assert trainer.state.global_step < MAX_STEPS, "stopped early"
    assert trainer.args.metric_for_best_model == "eval_rougeL" and trainer.args.greater_is_better
    assert (trainer.state.best_global_step, trainer.state.best_metric) == (best_step, best)
    assert evals[-1][0] - best_step == 2 * card.train.early_stopping.patience  # exactly `patience` evaluations later
    assert best_step != trainer.state.global_step, "this case must tell the best checkpoint from the last one"

    # every logged value is labkit's evaluation (stages 01/05) of that checkpoint's weights on those rows
    tokenizer = load_tokenizer(tiny_model, card)
    _, eval_rows = _rows(card)
    for step, value in evals:
        model = PeftModel.from_pretrained(load_model(tiny_model, card, "cpu"), str(out / f"checkpoint-{step}"))
        _, metrics = evaluate_rows(model, tokenizer, card, eval_rows, f"checkpoint-{step}")
        assert metrics["overall"]["rougeL"] == value, step

    # the best checkpoint was loaded at the end: its weights are the model's (and the last step's are not)
    weights = _lora(trainer.model)
    saved = load_file(str(out / f"checkpoint-{best_step}" / "adapter_model.safetensors"))
    last = load_file(str(out / f"checkpoint-{trainer.state.global_step}" / "adapter_model.safetensors"))
    assert saved.keys() == weights.keys() and all(weights[k].equal(saved[k]) for k in saved)
    assert not all(weights[k].equal(last[k]) for k in last)
    assert trainer.model.config.use_cache is False  # the generation's KV cache did not leak into training

    rows = [r for r in loss_history(trainer) if "eval_rougeL" in r]  # what stage 04 writes and plots
    assert [(r["step"], r["eval_rougeL"]) for r in rows] == evals and all("eval_generation_runtime" in r for r in rows)

    from labkit.train.early_stopping import summary

    done = summary(trainer.state, card, len(eval_rows), stopped_early=True)
    assert done["best_checkpoint"] == f"checkpoint-{best_step}" and done["best_value"] == best
    assert done["evaluations"] == [{"step": s, "value": v} for s, v in evals] and done["examples"] == len(eval_rows)
    assert done["why"].startswith(f"checkpoint-{best_step}: eval_rougeL = {best:.4f}, the highest of {len(evals)}")


def test_sharded_generation_forms_the_single_process_batches(stopped, tiny_model) -> None:
    trainer, _ = stopped
    card = updated(_card(), {"eval.batch_size": 3})
    tokenizer = load_tokenizer(tiny_model, card)
    train_rows, eval_rows = _rows(card)
    rows = eval_rows + train_rows[:5]  # 13 rows: batches of 3, the last one short
    single = generate_answers(trainer.model, tokenizer, card, rows)
    assert sum(bool(a) for a in single) >= len(rows) // 2, "non-empty answers, so the comparison means something"
    lengths = [len(prompt_ids(tokenizer, card, r["input"])) for r in rows]
    for world in (2, 3):
        merged: dict[int, str] = {}
        for rank in range(world):
            mine = shard(lengths, card.eval.batch_size, rank, world)
            merged.update(zip(mine, generate_answers(trainer.model, tokenizer, card, [rows[i] for i in mine])))
        assert [merged[i] for i in range(len(rows))] == single, world


def test_examples_scores_the_first_validation_rows(stopped, tiny_model) -> None:
    from transformers import TrainerState

    from labkit.train.early_stopping import GenerationMetric

    trainer, _ = stopped
    card = updated(_card(), {"train.early_stopping.examples": 5})
    tokenizer = load_tokenizer(tiny_model, card)
    _, eval_rows = _rows(card)
    callback = GenerationMetric(card, tokenizer, eval_rows)
    state = TrainerState(global_step=7)
    state.log_history = [{"eval_loss": 1.0, "eval_runtime": 0.1, "step": 7}]  # the row the evaluation just logged
    metrics, model = {"eval_loss": 1.0}, trainer.model
    model.train()
    callback.on_evaluate(trainer.args, state, None, metrics=metrics, model=model)
    _, expected = evaluate_rows(model, tokenizer, card, eval_rows[:5], "first 5")
    assert callback.rows == eval_rows[:5]
    assert metrics["eval_rougeL"] == expected["overall"]["rougeL"] == state.log_history[0]["eval_rougeL"]
    assert model.training and model.config.use_cache is False  # left as it was found


class _StopAt(TrainerCallback):
    """Ends training after `step` (its checkpoint is written): the process that was killed there."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
        if state.global_step == self.step:
            control.should_training_stop = True
        return control


def _curve(trainer) -> list[tuple]:
    return [(r["step"], r.get("loss"), r.get("eval_loss"), r.get("eval_rougeL")) for r in loss_history(trainer)
            if "loss" in r or "eval_loss" in r]


def test_resumed_run_reproduces_the_uninterrupted_one(stopped, tiny_model, tmp_path: Path) -> None:
    reference, _ = stopped
    stop = reference.state.global_step - 2  # one evaluation before the stop: the patience counter is not 0 there
    first = _train(_card(), tiny_model, tmp_path, extra=[_StopAt(stop)])
    assert first.state.global_step == stop
    resumed = _train(_card(), tiny_model, tmp_path, resume=str(tmp_path / f"checkpoint-{stop}"))
    assert _curve(resumed) == _curve(reference)  # bit for bit: losses, validation losses, the metric
    assert resumed.state.global_step == reference.state.global_step  # the patience counter continued
    assert (resumed.state.best_global_step, resumed.state.best_metric) == (reference.state.best_global_step,
                                                                          reference.state.best_metric)
    assert all(a.equal(b) for a, b in zip(_lora(resumed.model).values(), _lora(reference.model).values()))


def test_notebook_progress_bar_survives_a_stop_2_steps_after_resuming(tiny_model, tmp_path: Path) -> None:
    """Found by SIGKILL-ing a `labkit run` at checkpoint-8 and resuming: early stopping ended the resumed run at
    step 10, and transformers' notebook progress bar raised a TypeError in on_train_end (stage 04 failed)."""
    from transformers import TrainerControl, TrainerState
    from transformers.utils.notebook import NotebookProgressCallback

    from labkit.train.callbacks import thin_progress

    card = _card()
    train_rows, eval_rows = _rows(card)
    trainer = build_trainer(card, apply_method(load_model(tiny_model, card, "cpu"), card),
                            load_tokenizer(tiny_model, card), train_rows, tmp_path, eval_rows=eval_rows, device="cpu",
                            checkpoints=True, disable_tqdm=True)
    trainer.add_callback(NotebookProgressCallback())  # what transformers adds in a notebook kernel (papermill)
    thin_progress(trainer, card.train.logging_steps)  # build_trainer's own progress set-up, run again: swaps it
    (bar,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, NotebookProgressCallback)]
    for callback, fails in ((NotebookProgressCallback(), True), (bar, False)):
        state, control = TrainerState(max_steps=MAX_STEPS, num_train_epochs=1), TrainerControl()
        callback.on_train_begin(trainer.args, state, control)
        for step in (9, 10):  # resumed from checkpoint-8, stopped at step 10
            state.global_step, state.epoch = step, step / MAX_STEPS
            callback.on_step_end(trainer.args, state, control)
        if fails:
            with pytest.raises(TypeError):  # transformers 5.24 as installed: when this passes no more, drop the fix
                callback.on_train_end(trainer.args, state, control)
        else:
            callback.on_train_end(trainer.args, state, control)


def test_generation_leaves_training_undisturbed(tiny_model, tmp_path: Path) -> None:
    import torch

    # LoRA dropout draws random numbers at every training step: a disturbed RNG state, or a model left in eval
    # mode, would change the training losses against the same run with early stopping on eval_loss
    card = updated(_card(patience=100, max_steps=8), {"method.dropout": 0.1})
    with_metric = _train(card, tiny_model, tmp_path / "metric")
    card = updated(_card("eval_loss", patience=100, max_steps=8), {"method.dropout": 0.1})
    without = _train(card, tiny_model, tmp_path / "loss")
    losses = [(r["step"], r["loss"]) for r in with_metric.state.log_history if "loss" in r]
    assert len(losses) == 8 and losses == [(r["step"], r["loss"]) for r in without.state.log_history if "loss" in r]
    assert [r["eval_loss"] for r in with_metric.state.log_history if "eval_loss" in r] == \
        [r["eval_loss"] for r in without.state.log_history if "eval_loss" in r]
    # and why: greedy generation draws no random numbers at all (the callback restores the states regardless)
    before = torch.get_rng_state().clone()
    _, eval_rows = _rows(card)
    generate_answers(with_metric.model, load_tokenizer(tiny_model, card), card, eval_rows)
    assert torch.equal(before, torch.get_rng_state())


# ---------------------------------------------------------------------------------------------- the card
def _load(tmp_path: Path, **sections: dict) -> object:
    """A child of the smoke card; with early stopping it drops the smoke card's save_steps, which early stopping
    would override (labkit.card.consistency refuses it)."""
    if "early_stopping" in sections.get("train", {}):
        sections = {**sections, "train": {"save_steps": None, **sections["train"]}}
    path = tmp_path / "card.yaml"
    path.write_text(yaml.safe_dump({"parent": str(REPO / "params" / "smoke.yaml"), **sections}))
    return load_card(path)


def _refused(tmp_path: Path, **sections: dict) -> str:
    with pytest.raises(CardError) as info:
        _load(tmp_path, **sections)
    assert "\n" not in str(info.value) and "card.yaml:" in str(info.value)
    return str(info.value)


def test_card_accepts_a_generation_metric(tmp_path: Path) -> None:
    card = _load(tmp_path, train={"early_stopping": {"metric": "field_accuracy", "patience": 3, "examples": 10}}).card
    assert (card.train.early_stopping.metric, card.train.early_stopping.examples) == ("field_accuracy", 10)
    assert _load(tmp_path, train={"early_stopping": {"patience": 2}}).card.train.early_stopping.metric == "eval_loss"


def test_card_refuses_what_cannot_be_stopped_on(tmp_path: Path) -> None:
    msg = _refused(tmp_path, train={"early_stopping": {"metric": "accuracyy", "patience": 2}})
    assert "train.early_stopping.metric" in msg and "unknown metric 'accuracyy'" in msg and "field_accuracy" in msg
    msg = _refused(tmp_path, train={"early_stopping": {"metric": "per_category_f1", "patience": 2}})
    assert "train.early_stopping.metric" in msg and "not a single number" in msg
    msg = _refused(tmp_path, train={"early_stopping": {"patience": 2, "examples": 5}})
    assert "train.early_stopping" in msg and "examples is only for a generation metric" in msg
    msg = _refused(tmp_path, train={"early_stopping": {"metric": "json_valid_rate", "patience": 2}},
                   data={"target_format": {"kind": "label"}}, experiment={
                       "target": {"behaviour": "classification", "primary_metric": "accuracy", "min_improvement": 0.1},
                       "guardrails": []})
    assert "train.early_stopping.metric: json_valid_rate needs data.target_format.kind: json" in msg


def test_card_refuses_a_generation_metric_under_fsdp(tmp_path: Path) -> None:
    fsdp = {"launcher": "accelerate", "strategy": "fsdp", "num_processes": 2}
    msg = _refused(tmp_path, train={"early_stopping": {"metric": "field_accuracy", "patience": 2}}, distributed=fsdp)
    assert "train.early_stopping.metric" in msg and "fsdp" in msg and "use eval_loss, or strategy ddp" in msg
    assert _load(tmp_path, train={"early_stopping": {"patience": 2}}, distributed=fsdp).card.distributed.strategy == "fsdp"


# ---------------------------------------------------------------------------------------------- DDP
def test_ddp_ranks_agree_on_the_metric_and_the_stop(tmp_path: Path, tiny_model) -> None:
    """2 CPU processes (gloo) through accelerate launch, each writing what it saw."""
    from labkit.train.distributed import accelerate_config

    card = updated(_card(patience=1, micro_batch=2), {  # 2 processes × 2 rows: the smoke card's batch of 4
        "eval.batch_size": 3,  # 8 rows in batches of 3, 3, 2: rank 0 answers the first and the last, rank 1 the middle
        "distributed.launcher": "accelerate", "distributed.strategy": "ddp", "distributed.num_processes": 2})
    config = tmp_path / "accelerate.yaml"
    config.write_text(accelerate_config(card, "cpu"))
    (tmp_path / "card.json").write_text(card.model_dump_json())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
                           str(REPO / "tests" / "integration" / "ddp_early_stopping.py"), str(tmp_path)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert seen[0]["world_size"] == 2 and seen[0]["evals"], seen
    assert seen[0] == {**seen[1], "rank": 0}  # same values, same best step, same stop, same loaded weights
    assert seen[0]["step"] < MAX_STEPS, "stopped early"
