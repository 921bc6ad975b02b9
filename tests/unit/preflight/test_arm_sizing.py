"""Stage 03's comparison arms are sized before they run (tiny model, real TRL trainer): an arm the estimate says
cannot fit is skipped with its reason and never started; an out-of-memory error raised inside an arm (CUDA's or the
CPU allocator's) is reported the same way, not raised; any other error still is; an ORPO card's accumulation
check, whose result is ignored, is not run."""

from __future__ import annotations

import pytest
import torch
from conftest import REPO

from labkit.card.load import load_card
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.preflight.arms import out_of_memory
from labkit.preflight.sizing import arm_bytes
from labkit.preflight.stepchecks import accumulation_check, checkpointing_check


class Models:
    """A fresh model per arm, counting the arms started; `fail` (rows in the batch -> error) raises in the forward."""

    def __init__(self, card, tiny_model, fail: dict[int | None, BaseException] | None = None) -> None:
        self.card, self.tiny_model, self.fail, self.made = card, tiny_model, fail or {}, 0

    def __call__(self):
        self.made += 1
        model = apply_method(load_model(self.tiny_model, self.card, "cpu"), self.card)
        first = self.made == 1

        def hook(module, args, kwargs):
            ids = kwargs.get("input_ids")
            error = self.fail.get(ids.shape[0] if ids is not None else -1) or (self.fail.get(None) if first else None)
            if error is not None:
                raise error

        model.register_forward_pre_hook(hook, with_kwargs=True)
        return model


def test_an_arm_the_estimate_says_cannot_fit_is_skipped_with_its_reason(card, tiny_model, rows) -> None:
    tokenizer = load_tokenizer(tiny_model, card)
    models = Models(card, tiny_model)
    config = apply_method(load_model(tiny_model, card, "cpu"), card).config
    result = accumulation_check(card, models, tokenizer, rows, micro_batch=2, accum=3, config=config, free_bytes=2**20)
    assert result["ok"] and models.made == 0  # nothing ran
    whole = result["needed_bytes"]["whole"]
    assert whole > 2**20
    assert result["skipped"] == (f"not measurable on this device: needs {whole / 2**30:.2f} GiB of 0.00 GiB "
                                 f"(one batch of 6 rows at {result['skipped'].split(' at ')[1].split(' ')[0]} tokens)")
    assert result["relative_difference"] is None and result["problems"] == []


def test_the_arm_without_checkpointing_is_skipped_when_only_the_checkpointed_one_fits(card, tiny_model, rows) -> None:
    tokenizer = load_tokenizer(tiny_model, card)
    config = apply_method(load_model(tiny_model, card, "cpu"), card).config
    plain = arm_bytes(config, card, 256, card.train.micro_batch, False, "cpu")
    checkpointed = arm_bytes(config, card, 256, card.train.micro_batch, True, "cpu")
    assert plain > checkpointed
    models = Models(card, tiny_model)
    result = checkpointing_check(card, models, tokenizer, rows, seq_len=256, config=config,
                                 free_bytes=(plain + checkpointed) / 2)
    assert result["ok"] and models.made == 0
    assert result["skipped"].startswith(f"not measurable on this device: needs {plain / 2**30:.2f} GiB of ")
    assert "without activation checkpointing" in result["skipped"]
    assert result["needed_bytes"] == {"plain": plain}


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 24.09 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:118] data. DefaultCPUAllocator: can't allocate memory: you tried "
                 "to allocate 25870000000 bytes. Error code 12 (Cannot allocate memory)"),
], ids=["cuda", "cpu"])
def test_out_of_memory_in_an_arm_is_reported_not_raised(card, tiny_model, rows, error) -> None:
    tokenizer = load_tokenizer(tiny_model, card)
    models = Models(card, tiny_model, fail={6: error})  # only the whole batch of 2 × 3 rows runs out
    result = accumulation_check(card, models, tokenizer, rows, micro_batch=2, accum=3)
    assert result["ok"] and models.made == 1
    assert result["skipped"].startswith("not measurable on this device: out of memory (one batch of 6 rows at ")
    assert str(error).splitlines()[0][:60] in result["skipped"]
    config = models().config
    models = Models(card, tiny_model, fail={None: error})  # the first arm, without checkpointing, runs out
    result = checkpointing_check(card, models, tokenizer, rows, seq_len=64, config=config, free_bytes=2**40)
    assert result["ok"] and models.made == 1
    assert result["skipped"].startswith("not measurable on this device: needs ")
    assert "without activation checkpointing); out of memory: " in result["skipped"]


def test_another_error_in_an_arm_is_still_raised(card, tiny_model, rows) -> None:
    assert not out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert out_of_memory(MemoryError()) and out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    tokenizer = load_tokenizer(tiny_model, card)
    models = Models(card, tiny_model, fail={None: RuntimeError("mat1 and mat2 shapes cannot be multiplied")})
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        accumulation_check(card, models, tokenizer, rows, micro_batch=2, accum=3)


def test_the_orpo_accumulation_check_whose_result_is_ignored_is_not_run(tiny_model, rows) -> None:
    card = load_card(REPO / "params" / "smoke-orpo-base.yaml").card
    models = Models(card, tiny_model)
    result = accumulation_check(card, models, None, rows, micro_batch=2, accum=2, skip_ignored=True)
    assert result["ok"] and models.made == 0
    assert result["skipped"].startswith("not run: its result is ignored") and "grad_accum: 1" in result["skipped"]
