"""The tokens training fed the model, counted (labkit.train.token_count), against a count of the collated batches;
FLOPs per token, the device peak and MFU (labkit.train.flops)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from labkit.card.update import updated
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.train.flops import flops_per_token, forward_parameters, gpu_peak, measured_cpu_peak, peak_flops
from labkit.train.token_count import STATE_FILE, TokenCount, batch_tokens, cost_record
from labkit.train.trainer import build_trainer, to_dataset


def _one_epoch(card, packing: bool):
    return updated(card, {"train.max_steps": None, "train.epochs": 1, "train.grad_accum": 2, "train.micro_batch": 3,
                          "train.packing": packing})


def _trained(card, tiny_model, rows, folder: Path, **kwargs):
    tokenizer = load_tokenizer(tiny_model, card)
    model = apply_method(load_model(tiny_model, card, "cpu"), card)
    trainer = build_trainer(card, model, tokenizer, rows, folder, device="cpu", disable_tqdm=True, **kwargs)
    trainer.train()
    return trainer, tokenizer


def _collated_count(trainer, card) -> tuple[int, int]:
    """The dataset the trainer trains on, collated by its own collator in micro-batches, counted independently:
    real tokens are each row's length, loss tokens its scored labels after the first position."""
    dataset = trainer.train_dataset
    tokens = loss = 0
    for start in range(0, len(dataset), card.train.micro_batch):
        chunk = [dataset[i] for i in range(start, min(start + card.train.micro_batch, len(dataset)))]
        batch = trainer.data_collator(chunk)
        assert batch["input_ids"].shape[1] >= max(len(r["input_ids"]) for r in chunk)  # padded to the longest
        tokens += sum(len(r["input_ids"]) for r in chunk)
        loss += int(sum((torch.as_tensor(lab)[1:] != -100).sum() for lab in batch["labels"]))
    return tokens, loss


@pytest.mark.parametrize("packing", [False, True])
def test_the_counter_equals_a_count_of_the_collated_batches(card, rows, tiny_model, tmp_path, packing) -> None:
    card = _one_epoch(card, packing)
    trainer, tokenizer = _trained(card, tiny_model, rows, tmp_path)
    counter = next(c for c in trainer.callback_handler.callbacks if isinstance(c, TokenCount))
    tokens, loss = _collated_count(trainer, card)
    assert (counter.tokens, counter.loss_tokens) == (tokens, loss)
    assert 0 < loss < tokens and counter.session_tokens == tokens and counter.seconds > 0
    dataset = trainer.train_dataset
    if packing:  # several examples share a row: fewer rows than examples, the same tokens
        assert len(dataset) < len(rows)
        assert tokens == sum(len(r["input_ids"]) for r in to_dataset(tokenizer, card, rows))
    padded = sum(trainer.data_collator([dataset[i]])["input_ids"].numel() for i in range(len(dataset)))
    assert tokens == padded  # one row alone has no padding
    record = cost_record(trainer)
    assert record["tokens"] == tokens and record["loss_tokens"] == loss
    assert 0 < record["mfu"] < 1 and record["peak_flops"] > 0 and record["peak_source"].startswith("measured")
    n, trainable = forward_parameters(trainer.model)
    assert record["flops_per_token"] == 4 * n + 2 * trainable and 0 < trainable < n  # LoRA: 4N + 6N_adapter


def test_the_totals_carry_across_a_resume(card, rows, tiny_model, tmp_path) -> None:
    card = updated(_one_epoch(card, False), {"train.save_steps": 1})
    whole, _ = _trained(card, tiny_model, rows[:12], tmp_path / "whole", checkpoints=True)
    first = next(c for c in whole.callback_handler.callbacks if isinstance(c, TokenCount))
    assert (tmp_path / "whole" / "checkpoint-1" / STATE_FILE).is_file()
    tokenizer = load_tokenizer(tiny_model, card)
    model = apply_method(load_model(tiny_model, card, "cpu"), card)
    resumed = build_trainer(card, model, tokenizer, rows[:12], tmp_path / "whole", device="cpu", checkpoints=True,
                            disable_tqdm=True)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-1"))
    again = next(c for c in resumed.callback_handler.callbacks if isinstance(c, TokenCount))
    assert (again.tokens, again.loss_tokens) == (first.tokens, first.loss_tokens)
    assert 0 < again.session_tokens < first.tokens  # this session trained the steps after checkpoint-1 only


def test_batch_tokens_reads_masks_position_ids_and_completion_masks() -> None:
    ids = torch.ones((2, 6), dtype=torch.long)
    labels = torch.tensor([[-100, -100, 5, 5, -100, -100], [-100, 5, 5, 5, 5, 5]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1] * 6])
    assert [int(x) for x in batch_tokens({"input_ids": ids, "attention_mask": mask, "labels": labels})] == [10, 7]
    positions = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 3]])  # packed rows, the first padded by one
    four_d = torch.zeros((2, 1, 6, 6))
    assert int(batch_tokens({"input_ids": ids, "attention_mask": four_d, "position_ids": positions})[0]) == 11
    assert int(batch_tokens({"input_ids": ids, "position_ids": positions})[0]) == 11  # padding-free
    dpo = {"input_ids": ids, "attention_mask": mask, "completion_mask": torch.tensor([[0, 0, 1, 1, 0, 0], [0] * 6])}
    assert [int(x) for x in batch_tokens(dpo)] == [10, 2]
    orpo = {"chosen_input_ids": ids, "chosen_attention_mask": mask, "chosen_labels": labels,
            "rejected_input_ids": ids[:1], "rejected_attention_mask": mask[:1], "rejected_labels": labels[:1]}
    assert [int(x) for x in batch_tokens(orpo)] == [14, 9]


def test_forward_parameters_leave_out_lookups_and_count_the_head_once() -> None:
    embed = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)

    class Tiny(torch.nn.Module):
        def __init__(self, tied: bool) -> None:
            super().__init__()
            self.embed, self.body, self.head = embed if not tied else torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4), head
            if tied:
                self.head = torch.nn.Linear(4, 10, bias=False)
                self.head.weight = self.embed.weight

        def get_output_embeddings(self):
            return self.head

    assert forward_parameters(Tiny(tied=False)) == (20 + 40, 60)  # body 16 + 4 bias, head 40; the lookup excluded
    assert forward_parameters(Tiny(tied=True)) == (20 + 40, 60)  # the tied head multiplies: counted once
    assert flops_per_token(100, 100) == 600 and flops_per_token(100, 1) == 402  # 6N; 4N + 2N_trainable


def test_peaks_from_the_spec_sheets_and_measured_on_the_cpu() -> None:
    assert gpu_peak("NVIDIA H100 80GB HBM3", "bfloat16")[0] == 989e12
    assert gpu_peak("NVIDIA H100 PCIe", "bfloat16")[0] == 756e12
    assert gpu_peak("Tesla T4", "float16")[0] == 65e12 and gpu_peak("Tesla T4", "bfloat16") is None
    assert gpu_peak("Tesla V100-SXM2-16GB", "float16")[0] == 125e12
    assert gpu_peak("NVIDIA GeForce RTX 4090", "bfloat16")[0] == 165.2e12
    assert gpu_peak("NVIDIA H100 80GB HBM3", "float32") is None  # no dense fp32 figure: MFU left out
    assert measured_cpu_peak("float32") > 1e8  # any CPU multiplies faster than 0.1 GFLOP/s
    peak, source = peak_flops("cpu", "fp32")
    assert peak == measured_cpu_peak("float32", threads=torch.get_num_threads()) and "measured" in source


def test_a_4bit_qlora_model_counts_the_same_weights_as_lora(card, tiny_model) -> None:
    """bitsandbytes stores two 4-bit weights per byte: N counts the weights (quant_state.shape), not the bytes."""
    from labkit.card.schema import Qlora

    lora = apply_method(load_model(tiny_model, card, "cpu"), card)
    qcard = updated(card, {"method": Qlora(kind="qlora", r=4, alpha=8, dropout=0.0)})
    qlora = apply_method(load_model(tiny_model, qcard, "cpu"), qcard)
    assert any(hasattr(p, "quant_state") for p in qlora.parameters())  # really 4-bit
    assert forward_parameters(qlora) == forward_parameters(lora)
