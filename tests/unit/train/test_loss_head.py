"""labkit's completion-only loss head gives TRL's loss and gradients while projecting only the scored positions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import REPO
from trl import SFTTrainer

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.data import sources as D
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.train.loss_head import CompletionSFTTrainer
from labkit.train.packing import PackedCollator
from labkit.train.trainer import build_trainer


def _trainer(tmp_path: Path, tiny_model, packing: bool):
    card = updated(load_card(REPO / "params" / "smoke.yaml").card, {"train.packing": packing})
    rows = [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()][:12]
    model = apply_method(load_model(tiny_model, card, "cpu"), card)
    return build_trainer(card, model, load_tokenizer(tiny_model, card), rows, tmp_path, device="cpu")


def _loss_and_grads(trainer, method, batch, num_items):
    trainer.model.zero_grad()
    loss = method(trainer, trainer.model, dict(batch), num_items_in_batch=num_items)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


@pytest.mark.parametrize("packing", [False, True], ids=["dynamic-padding", "packed"])
def test_completion_only_head_matches_trl(tmp_path: Path, tiny_model, packing: bool) -> None:
    trainer = _trainer(tmp_path, tiny_model, packing)
    assert isinstance(trainer, CompletionSFTTrainer)
    rows = [trainer.train_dataset[i] for i in range(3)]
    batch = trainer.data_collator(rows)
    assert isinstance(trainer.data_collator, PackedCollator) == packing
    scored = int((batch["labels"][:, 1:] != -100).sum())
    assert 0 < scored < batch["labels"][:, 1:].numel() // 2  # most positions carry no loss: the point of it
    head_inputs = []
    handle = trainer.model.get_output_embeddings().register_forward_hook(lambda m, a, o: head_inputs.append(a[0].shape))
    for num_items in (None, torch.tensor(scored + 5)):
        ours, our_grads = _loss_and_grads(trainer, CompletionSFTTrainer.compute_loss, batch, num_items)
        trls, trl_grads = _loss_and_grads(trainer, SFTTrainer.compute_loss, batch, num_items)
        assert torch.allclose(ours, trls, rtol=1e-5, atol=1e-6), (ours, trls)
        for name, grad in trl_grads.items():
            assert torch.allclose(our_grads[name], grad, rtol=1e-4, atol=1e-6), name
    handle.remove()
    assert head_inputs[0] == (1, scored, trainer.model.config.hidden_size)  # the head saw the scored positions only
