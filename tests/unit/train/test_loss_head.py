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
from labkit.model.sources import resolve
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


def test_a_mixture_of_experts_load_balancing_loss_weighted_as_trl_weights_it(tmp_path: Path) -> None:
    """The router's aux loss is added once per micro-batch by the model's forward; TRL's path averages it over the
    accumulated micro-batches (and leaves it out of the DDP rescaling): labkit's head must weigh it the same."""
    card = updated(load_card(REPO / "params" / "smoke.yaml").card, {"model.source": "tiny:qwen3moe",
                                                                     "train.grad_accum": 2})
    source = resolve("tiny:qwen3moe")
    rows = [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()][:12]
    trainer = build_trainer(card, apply_method(load_model(source, card, "cpu"), card), load_tokenizer(source, card),
                            rows, tmp_path, device="cpu")
    assert trainer.aux_loss_enabled and trainer.router_aux_loss_coef > 0  # TRL's default for an MoE: the model's own
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(3)])
    trainer.current_gradient_accumulation_steps = 2  # set by the training loop: the aux term is halved per micro-batch
    scored = torch.tensor(int((batch["labels"][:, 1:] != -100).sum()) * 2)
    ours, our_grads = _loss_and_grads(trainer, CompletionSFTTrainer.compute_loss, batch, scored)
    trls, trl_grads = _loss_and_grads(trainer, SFTTrainer.compute_loss, batch, scored)
    assert torch.allclose(ours, trls, rtol=1e-5, atol=1e-6), (ours, trls)
    router = [n for n in trl_grads if ".mlp.gate." in n]
    assert router, sorted(trl_grads)  # peft's all-linear adapts the router's weight too: the aux loss reaches it
    for name, grad in trl_grads.items():
        assert torch.allclose(our_grads[name], grad, rtol=1e-4, atol=1e-6), name
