"""Stage 04 stops on a non-finite loss or gradient norm (`labkit.train.callbacks.FiniteCheck`), on the real TRL
trainer and the tiny model: the error names the step, the last finite loss and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import REPO
from transformers import TrainerCallback

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.data import sources as D
from labkit.errors import LabkitError, NonFiniteError
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.train.callbacks import FiniteCheck, numerics_fix
from labkit.train.trainer import build_trainer


class _NanFrom(TrainerCallback):
    """Turns the model's logits to NaN from the step `step` on (a forward hook on the LM head, armed at that step)."""

    def __init__(self, model: torch.nn.Module, step: int) -> None:
        self.step, self.armed = step, False
        model.lm_head.register_forward_hook(lambda _m, _i, out: out * float("nan") if self.armed else out)

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
        self.armed = state.global_step + 1 >= self.step


def _trainer(tmp_path: Path, tiny_model, nan_step: int, **card_keys) -> tuple:
    card = updated(load_card(REPO / "params" / "smoke.yaml").card, {"train.max_steps": 6, **card_keys})
    rows = [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()]
    base = load_model(tiny_model, card, "cpu")
    injector = _NanFrom(base, nan_step)
    trainer = build_trainer(card, apply_method(base, card), load_tokenizer(tiny_model, card), rows[:24], tmp_path,
                            device="cpu", checkpoints=True, disable_tqdm=True)
    trainer.add_callback(injector)
    return trainer, card


def test_a_nan_loss_stops_training_at_its_step_naming_the_last_finite_loss_and_fix(tmp_path: Path, tiny_model) -> None:
    trainer, card = _trainer(tmp_path, tiny_model, nan_step=3)
    with pytest.raises(NonFiniteError) as raised:
        trainer.train()
    message = str(raised.value)
    assert isinstance(raised.value, LabkitError) and raised.value.exit_code == 1
    assert "\n" not in message
    assert message.startswith("training stopped at step 3: the loss is nan")
    finite = [e["loss"] for e in trainer.state.log_history if e.get("step") == 2 and "loss" in e]
    assert f"last finite loss {finite[0]:.4f} at step 2" in message
    assert "lower train.lr (now 0.005)" in message and "train.max_grad_norm" in message
    assert trainer.state.global_step == 3  # stopped there: no step after the NaN one


def test_a_healthy_run_is_not_stopped(tmp_path: Path, tiny_model) -> None:
    trainer, _ = _trainer(tmp_path, tiny_model, nan_step=99, **{"train.max_steps": 3})
    trainer.train()
    assert trainer.state.global_step == 3
    assert any(isinstance(c, FiniteCheck) for c in trainer.callback_handler.callbacks)
    assert trainer.args.logging_nan_inf_filter is False  # a NaN is logged as NaN, never averaged away


class _Logged:
    global_step = 5


def _optimizer(grad: float, scale: float):
    """A real accelerate optimizer with a real loss scaler, after one step on a gradient of `grad`."""
    from accelerate.optimizer import AcceleratedOptimizer

    weight = torch.nn.Parameter(torch.ones(2))
    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    optimizer = AcceleratedOptimizer(torch.optim.SGD([weight], lr=0.1), device_placement=False, scaler=scaler)
    scaler.scale((weight * grad).sum()).backward()
    optimizer.step()
    return optimizer


def test_a_non_finite_gradient_norm_stops_unless_the_fp16_scaler_skipped_the_step() -> None:
    check = FiniteCheck("fix: something")
    check.on_log(None, _Logged, None, logs={"loss": 2.5, "grad_norm": 1.0})
    # fp16: the scaler skips a step whose scaled gradients overflow while it searches its scale: not a failure
    skipped = _optimizer(float("inf"), scale=2.0**16)
    assert skipped.step_was_skipped
    check.on_log(None, _Logged, None, logs={"loss": 2.4, "grad_norm": float("inf")}, optimizer=skipped)
    with pytest.raises(NonFiniteError, match=r"step 5: the gradient norm is inf \(last finite loss 2.4000 at step 5\)"):
        check.on_log(None, _Logged, None, logs={"loss": 2.3, "grad_norm": float("inf")})  # bf16 / fp32: no scaler
    with pytest.raises(NonFiniteError, match="gradient norm is nan"):  # overflowing even below a scale of 1
        check.on_log(None, _Logged, None, logs={"loss": 2.3, "grad_norm": float("nan")},
                     optimizer=_optimizer(float("nan"), scale=0.5))
    with pytest.raises(NonFiniteError, match="the evaluation of step 5: eval_loss is nan"):
        check.on_evaluate(None, _Logged, None, metrics={"eval_loss": float("nan"), "eval_runtime": 1.0})


def test_the_fix_names_bf16_and_eager_attention_in_fp16_only() -> None:
    fp16 = numerics_fix(2e-4, 1.0, "fp16", "sdpa")
    assert "train.precision: bf16" in fp16 and "model.attn_implementation: eager" in fp16 and "lower train.lr" in fp16
    assert "eager" not in numerics_fix(2e-4, 1.0, "fp16", "labkit_eager_fp32").split("65504")[1]
    assert "bf16" not in numerics_fix(2e-4, 1.0, "bf16", "sdpa") and "now 1" in numerics_fix(2e-4, 1.0, "bf16", "sdpa")


def test_stage_04_failing_on_a_non_finite_loss_is_a_failed_run_with_exit_1(tmp_path: Path) -> None:
    import json

    import nbformat

    from labkit.cli import runner
    from labkit.core import runs as R
    from labkit.errors import StageFailed

    nb_dir = tmp_path / "notebooks"
    nb_dir.mkdir()
    kernel = {"name": "python3", "language": "python", "display_name": "Python 3"}
    book = nbformat.v4.new_notebook(metadata={"kernelspec": kernel, "language_info": {"name": "python"}})
    book.cells = [nbformat.v4.new_code_cell("card = run_dir = None", metadata={"tags": ["parameters"]}),
                  nbformat.v4.new_code_cell("from labkit.errors import NonFiniteError\n"
                                            "raise NonFiniteError('training stopped at step 3: the loss is nan "
                                            "(last finite loss 2.0000 at step 2); fix: a lower train.lr')")]
    nbformat.write(book, nb_dir / R.NOTEBOOKS["training"])
    run = R.new_run(load_card(REPO / "params" / "smoke.yaml"), tmp_path / "runs")
    with pytest.raises(StageFailed) as raised:
        runner._execute(run, ("training",), nb_dir, lambda line: None)
    assert raised.value.exit_code == 1  # a stage that failed on valid input, not bad input (2)
    assert "NonFiniteError: training stopped at step 3: the loss is nan" in str(raised.value)
    status = json.loads((run.dir / "status.json").read_text())
    assert status["status"] == "failed" and "step 3" in status["error"]
