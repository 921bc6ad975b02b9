"""Stage 04's trainer on the tiny model: early stopping on the validation loss, with the best checkpoint kept."""

from __future__ import annotations

from pathlib import Path

from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.card.schema import EarlyStopping
from labkit.data import sources as D
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.train.trainer import build_trainer


def test_early_stopping_on_validation_loss(tmp_path: Path, tiny_model) -> None:
    card = updated(load_card(REPO / "params" / "smoke.yaml").card, {
        "train.lr": 0.5,  # large: after a few steps the validation loss improves by less than min_delta
        "train.max_steps": 16, "train.eval_steps": 1, "train.early_stopping": EarlyStopping(patience=2, min_delta=0.02)})
    rows = [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()]
    model = apply_method(load_model(tiny_model, card, "cpu"), card)
    trainer = build_trainer(card, model, load_tokenizer(tiny_model, card), rows[:32], tmp_path, eval_rows=rows[32:40],
                            device="cpu", checkpoints=True, disable_tqdm=True)
    trainer.train()
    evals = [(e["step"], e["eval_loss"]) for e in trainer.state.log_history if "eval_loss" in e]
    best_step, best = min(evals, key=lambda x: x[1])
    assert trainer.state.global_step < 16, "stopped early"
    assert trainer.state.best_metric == best and trainer.state.best_global_step == best_step
    # the rule: stop once `patience` evaluations in a row fail to beat the best so far by more than min_delta
    # (at lr 0.5 Adam amplifies float-order differences, so the curve itself is not pinned down here)
    waited, running_best = [], None
    for _, loss in evals:
        if running_best is None or running_best - loss > 0.02:
            waited.append(0)
        else:
            waited.append(waited[-1] + 1)
        running_best = loss if running_best is None else min(running_best, loss)
    assert waited[-1] == 2 and 2 not in waited[:-1], (evals, waited)
    assert (tmp_path / f"checkpoint-{best_step}").is_dir()  # the best checkpoint is kept (and loaded at the end)  # the best checkpoint is kept (and loaded at the end)


def _qlora_losses(card, tiny_model, rows, output: Path, evaluate: bool) -> list[float]:
    model = apply_method(load_model(tiny_model, card, "cpu"), card)
    trainer = build_trainer(card, model, load_tokenizer(tiny_model, card), rows[:16], output,
                            eval_rows=rows[32:36] if evaluate else None, device="cpu", disable_tqdm=True,
                            logging_steps=1)
    trainer.train()
    assert evaluate == any("eval_loss" in e for e in trainer.state.log_history)
    return [e["loss"] for e in trainer.state.log_history if "loss" in e]


def test_qlora_training_on_the_cpu_is_the_same_with_and_without_validation_passes(tmp_path: Path, tiny_model) -> None:
    """A validation pass (eval mode, no grad) must leave the QLoRA steps after it as they were: on a CPU with
    AVX512-BF16 bitsandbytes would otherwise leave its 4-bit weights in an inference layout with no backward."""
    card = updated(load_card(REPO / "params" / "smoke.yaml").card, {
        "method.kind": "qlora", "train.max_steps": 4, "train.eval_steps": 1, "train.scheduler": "constant"})
    rows = [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()]
    plain = _qlora_losses(card, tiny_model, rows, tmp_path / "plain", evaluate=False)
    evaluated = _qlora_losses(card, tiny_model, rows, tmp_path / "evaluated", evaluate=True)
    assert len(plain) == 4 and plain == evaluated


def _trainable(trainer) -> dict:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def test_resuming_from_the_last_steps_checkpoint_trains_no_further_step(tmp_path: Path, tiny_model) -> None:
    """max_steps ends mid-epoch (4 of 8 batches): transformers' loop would fetch the next batch and train step 5 on
    resume (it checks max_steps after a step), so a run resumed after its final checkpoint would differ from itself."""
    card = updated(load_card(REPO / "params" / "smoke.yaml").card, {"train.max_steps": 4})
    rows = [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()][:32]
    tokenizer = load_tokenizer(tiny_model, card)

    def trainer():
        model = apply_method(load_model(tiny_model, card, "cpu"), card)
        return build_trainer(card, model, tokenizer, rows, tmp_path, device="cpu", checkpoints=True, disable_tqdm=True)

    first = trainer()
    first.train()
    assert first.state.global_step == 4 and (tmp_path / "checkpoint-4").is_dir()
    resumed = trainer()
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert resumed.state.global_step == 4 and not (tmp_path / "checkpoint-5").exists()
    before, after = _trainable(first), _trainable(resumed)
    assert before.keys() == after.keys() and all(bool((before[k] == after[k]).all()) for k in before)


def test_resuming_a_run_that_stopped_early_trains_no_further_step(tmp_path: Path, tiny_model) -> None:
    """Early stopping ended training at step 2 (checkpoint-2 holds the patience counter that stopped it); a process
    killed before stage 04 ended resumes from there. transformers clears the stop on `on_train_begin`, so the resumed
    run trained on to the next evaluation (step 3, a new checkpoint, perhaps a new best) instead of stopping."""
    card = updated(load_card(REPO / "params" / "smoke.yaml").card, {
        "train.max_steps": 16, "train.eval_steps": 1,
        "train.early_stopping": EarlyStopping(patience=1, min_delta=100.0)})  # no evaluation counts as better
    rows = [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()]
    tokenizer = load_tokenizer(tiny_model, card)

    def trainer():
        model = apply_method(load_model(tiny_model, card, "cpu"), card)
        return build_trainer(card, model, tokenizer, rows[:32], tmp_path, eval_rows=rows[32:36], device="cpu",
                             checkpoints=True, disable_tqdm=True)

    first = trainer()
    first.train()
    assert first.state.global_step == 2 and (tmp_path / "checkpoint-2").is_dir(), "stopped at the second evaluation"
    resumed = trainer()
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert resumed.state.global_step == 2 and not (tmp_path / "checkpoint-3").exists()
    assert [e["step"] for e in resumed.state.log_history if "eval_loss" in e] == [1, 2]
    before, after = _trainable(first), _trainable(resumed)  # both the best checkpoint's (step 1), loaded at the end
    assert before.keys() == after.keys() and all(bool((before[k] == after[k]).all()) for k in before)
