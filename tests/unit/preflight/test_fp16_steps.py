"""Stage 03's step checks under an fp16 loss scaler and with non-finite numerics (tiny model, real TRL trainer).

accelerate gives the trainer a loss scaler (torch's GradScaler) for fp16 on a GPU only; here the real Accelerator
gets a real CPU GradScaler, so transformers' loop, accelerate's scaled backward and optimiser step, and torch's
inf/NaN detection all run as on a T4 in fp16. Its first scale, 2^127, overflows the scaled loss in float32
(as 2^16 overflows fp16 gradients), so the first step's gradients are inf and the scaler skips it, backing off to
2^16, fp16's own starting scale. A healthy run must pass; a frozen adapter, a scaler that never finds a finite
scale and a NaN loss must not.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.preflight.arms import SCALER_SKIPS
from labkit.preflight.stepchecks import accumulation_check, update_check
from labkit.train.trainer import build_trainer


def _scaler(monkeypatch, init_scale: float, backoff: float = 2.0**-111) -> None:
    """Every Accelerator made from here on holds a real GradScaler starting at `init_scale` (as fp16 on a GPU)."""
    original = Accelerator.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, backoff_factor=backoff)

    monkeypatch.setattr(Accelerator, "__init__", init)


@pytest.fixture
def fp16_scaler(monkeypatch):
    _scaler(monkeypatch, 2.0**127)


@pytest.fixture
def hopeless_scaler(monkeypatch):
    _scaler(monkeypatch, float("inf"))  # inf × loss at every step: no step is ever taken


def _model(card, tiny_model, tamper=None):
    model = apply_method(load_model(tiny_model, card, "cpu"), card)
    if tamper:
        tamper(model)
    return model


def _update(card, tiny_model, rows, tamper=None) -> dict:
    trainer = build_trainer(card, _model(card, tiny_model, tamper), load_tokenizer(tiny_model, card), rows[:8],
                            Path(tempfile.mkdtemp()), device="cpu", max_steps=2 + SCALER_SKIPS,
                            lr_scheduler_type="constant", warmup_steps=0, disable_tqdm=True)
    return update_check(trainer, card, steps=2)


def _nan_loss(model) -> None:
    """A bug that makes every hidden state NaN before the LM head (as an fp16 attention overflow does)."""
    norm = next(m for n, m in model.named_modules() if n.endswith("model.norm"))
    norm.register_forward_hook(lambda module, args, output: output * float("nan"))


def _freeze_one_adapter(model) -> None:
    next(p for n, p in model.named_parameters() if ".lora_B." in n).requires_grad_(False)


def test_steps_the_loss_scaler_skips_are_named_and_not_counted(card, tiny_model, rows, fp16_scaler) -> None:
    result = _update(card, tiny_model, rows)
    assert result["ok"], result["problems"]
    skipped = result["skipped_steps"]
    assert skipped == [1]  # the first step, as an fp16 run skips its first steps
    assert result["steps"] == 2 and result["trainer_steps"] == len(skipped) + 2
    # the first step taken moved exactly LoRA's B (a skipped step moved nothing)
    assert result["changed_step_1"] == result["first_step_movers"] == 7 * 2
    assert result["changed"] == result["expected"] == 2 * 7 * 2
    assert result["nonfinite"] == []
    log = result["step_log"]
    assert [s["skipped"] for s in log] == [True] * len(skipped) + [False, False]
    assert all(s["nonfinite_gradients"] for s in log[:len(skipped)]) and not any(s["nonfinite_gradients"] for s in log[-2:])
    assert log[0]["scale"] == 2.0**127 and log[-1]["scale"] == 2.0**16
    assert all(s["loss"] is not None and s["loss"] > 0 for s in log)


def test_a_frozen_adapter_still_fails_under_the_loss_scaler(card, tiny_model, rows, fp16_scaler) -> None:
    result = _update(card, tiny_model, rows, tamper=_freeze_one_adapter)
    assert not result["ok"] and result["skipped_steps"]
    assert any("should train are frozen" in p for p in result["problems"])
    assert any("did not change" in p for p in result["problems"])


def test_accumulation_compares_unscaled_gradients_of_the_steps_taken(card, tiny_model, rows, fp16_scaler) -> None:
    tokenizer = load_tokenizer(tiny_model, card)
    result = accumulation_check(card, lambda: _model(card, tiny_model), tokenizer, rows, micro_batch=2, accum=3)
    assert result["ok"], result
    assert result["relative_difference"] < 1e-5 and result["nonfinite"] == [] and result["skipped"] is None
    assert result["skipped_steps"]["whole"] and result["skipped_steps"]["accumulated"]


def test_a_scaler_that_never_takes_a_step_fails_both_checks(card, tiny_model, rows, hopeless_scaler) -> None:
    update = _update(card, tiny_model, rows)
    assert not update["ok"] and update["steps"] == 0 and len(update["skipped_steps"]) == 2 + SCALER_SKIPS
    assert any("no optimiser step was taken" in p for p in update["nonfinite"])
    tokenizer = load_tokenizer(tiny_model, card)
    accumulation = accumulation_check(card, lambda: _model(card, tiny_model), tokenizer, rows, micro_batch=2, accum=3)
    assert not accumulation["ok"] and accumulation["skipped"] is None
    assert any("no optimiser step was taken" in p for p in accumulation["nonfinite"])


def test_a_nan_loss_is_its_own_finding(card, tiny_model, rows) -> None:
    update = _update(card, tiny_model, rows, tamper=_nan_loss)
    assert not update["ok"]
    assert update["nonfinite"][0] == "step 1: the loss is nan"
    assert any("inf/NaN gradients" in p for p in update["nonfinite"])
    assert set(update["nonfinite"]) <= set(update["problems"])
    tokenizer = load_tokenizer(tiny_model, card)
    accumulation = accumulation_check(card, lambda: _model(card, tiny_model, _nan_loss), tokenizer, rows,
                                      micro_batch=2, accum=3)
    assert not accumulation["ok"]
    assert "one batch of 6: step 1: the loss is nan" in accumulation["nonfinite"]
