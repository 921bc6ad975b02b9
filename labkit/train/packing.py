"""Packing several training examples into one row, with attention kept inside each example.

Rows are filled best-fit-decreasing up to `data.max_length` tokens (TRL's packer). Each example keeps its own position ids
(restarting at 0). Two ways keep examples apart, chosen by `labkit.model.placement` from the device:

- `block_mask` (the CPU, MPS, an explicit sdpa / eager): the collator builds a block-diagonal causal attention mask
  (4D, additive), which transformers passes to SDPA or eager attention as it is.
- `padding_free` (a GPU with flash_attention_2 or flex_attention): the collator passes no mask, only the restarting
  position ids; transformers 5.24 (`masking_utils.find_packed_sequence_indices`, used when the mask is None and
  there is no KV cache, as in training) turns them into flash-attn's variable-length sequences or flex attention's
  document mask, on the GPU — no batch × seq × seq tensor is built on the CPU.

With a KV cache (a plain `model(...)` call in eval mode) transformers does not look for packed sequences, so
restarting position ids alone do not isolate examples there. The loss positions are unchanged: each example's
first token is a prompt token, already masked, so no example is trained to predict the next one.
"""

from __future__ import annotations

from typing import Any

import datasets
import torch
import torch.nn.functional as F
from trl.data_utils import pack_dataset

from labkit.model.placement import PACK_TOLERANCE


IGNORE = -100


def pack(examples: list[dict[str, list[int]]], max_length: int) -> list[dict[str, list[int]]]:
    """Pack tokenised examples (input_ids, labels) into rows of at most `max_length` tokens (best fit decreasing).

    TRL's `pack_dataset` (strategy "bfd") places each example, longest first, in the fullest row it still
    fits, so rows come out nearly full and a micro-batch of them carries little padding; it is deterministic.

    Args:
        examples: tokenised examples (each at most `max_length` tokens after cleaning; longer ones are cut).
        max_length: the longest row.
    Returns:
        rows with input_ids, labels and position_ids (restarting at every example).
    """
    if not examples:
        return []
    table = datasets.Dataset.from_list([{"input_ids": e["input_ids"][:max_length],
                                         "labels": e["labels"][:max_length]} for e in examples])
    rows = []
    for row in pack_dataset(table, max_length, strategy="bfd").to_list():
        lengths = row.pop("seq_lengths")
        row["position_ids"] = [p for n in lengths for p in range(n)]
        rows.append(row)
    return rows


def segments(position_ids: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each packed example, from where the position ids restart."""
    starts = [i for i, p in enumerate(position_ids) if p == 0] + [len(position_ids)]
    return list(zip(starts[:-1], starts[1:]))


class PackedCollator:
    """Pads packed rows to the longest in the batch and builds their block-diagonal causal mask.

    A row without position_ids is one example (stage 03 measures with such rows of a fixed length). With
    `block_mask=False` no mask is built: the position ids alone mark the examples (padding-free attention).
    """

    def __init__(self, pad_token_id: int, dtype: Any = None, block_mask: bool = True) -> None:
        self.pad_token_id = pad_token_id
        self.dtype = dtype
        self.block_mask = block_mask

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        dtype = self.dtype or torch.float32
        length = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), length), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), length), IGNORE, dtype=torch.long)
        positions = torch.zeros((len(rows), length), dtype=torch.long)
        if not self.block_mask:
            for b, row in enumerate(rows):
                n = len(row["input_ids"])
                ids[b, :n] = torch.tensor(row["input_ids"])
                labels[b, :n] = torch.tensor(row["labels"])
                positions[b, :n] = torch.tensor(list(row.get("position_ids") or range(n)))
            return {"input_ids": ids, "labels": labels, "position_ids": positions}
        allowed = torch.zeros((len(rows), 1, length, length), dtype=torch.bool)
        causal = torch.ones((length, length), dtype=torch.bool).tril()
        for b, row in enumerate(rows):
            n = len(row["input_ids"])
            row_positions = list(row.get("position_ids") or range(n))
            ids[b, :n] = torch.tensor(row["input_ids"])
            labels[b, :n] = torch.tensor(row["labels"])
            positions[b, :n] = torch.tensor(row_positions)
            for start, end in segments(row_positions):
                allowed[b, 0, start:end, start:end] = causal[: end - start, : end - start]
            allowed[b, 0, n:, :] = torch.eye(length, dtype=torch.bool)[n:]  # padding attends to itself only
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
        return {"input_ids": ids, "labels": labels, "position_ids": positions, "attention_mask": mask}


def isolation_check(model: Any, examples: list[dict[str, list[int]]], max_length: int, tolerance: float | None = None,
                    block_mask: bool | None = None, cache: bool = False) -> dict[str, Any]:
    """Each example's loss must be the same packed and on its own (the check the stage runs before packing).

    Args:
        model: the model to train (its attention implementation is what is checked).
        examples: a few tokenised examples (input_ids, labels).
        max_length: the packing length.
        tolerance: largest allowed absolute difference of a per-example mean loss (default: the placement's
            tolerance for the dtype the model computes in, `labkit.model.placement.PACK_TOLERANCE`).
        block_mask: pass the block-diagonal mask (False: restarting position ids only — the padding-free path;
            default: the path the placement chose for training, `model.labkit_decisions["packing"]`).
        cache: run the packed forward with a KV cache (with `block_mask=False`: shows that the position ids alone
            do not isolate examples then).
    Returns:
        {"ok", "max_difference", "per_example": [{"alone", "packed"}], "tolerance"}.
    """
    def token_losses(logits: Any, labels: Any) -> Any:
        return F.cross_entropy(logits[0, :-1].float(), labels[0, 1:], ignore_index=IGNORE, reduction="none")

    device = next(model.parameters()).device
    dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
    made = getattr(model, "labkit_decisions", None) or {}
    if tolerance is None:
        tolerance = made.get("packing_tolerance") or PACK_TOLERANCE.get(str(dtype).replace("torch.", ""), 5e-2)
    if block_mask is None:
        block_mask = made.get("packing") != "padding_free"
    rows = pack(examples, max_length)
    collate = PackedCollator(pad_token_id=0, dtype=dtype, block_mask=block_mask)
    was_training = model.training
    model.eval()
    alone, packed = [], {}  # packed: by the example's tokens (the packer reorders examples)
    with torch.no_grad():
        for ex in examples:
            ids, labels = torch.tensor([ex["input_ids"]], device=device), torch.tensor([ex["labels"]], device=device)
            losses = token_losses(model(input_ids=ids).logits, labels)
            alone.append(losses.sum().item() / max(int((labels[0, 1:] != IGNORE).sum()), 1))
        for row in rows:
            batch = {k: v.to(device) for k, v in collate([row]).items()}
            mask = batch.get("attention_mask")
            losses = token_losses(model(input_ids=batch["input_ids"], attention_mask=mask, use_cache=cache,
                                        position_ids=batch["position_ids"]).logits, batch["labels"])
            for start, end in segments(row["position_ids"]):
                valid = (batch["labels"][0, start + 1: end] != IGNORE).sum().item()
                tokens = tuple(row["input_ids"][start:end])
                packed[tokens] = losses[start: end - 1].sum().item() / max(valid, 1)
    model.train(was_training)
    packed = [packed.get(tuple(ex["input_ids"][:max_length]), float("nan")) for ex in examples]
    diffs = [abs(a - p) for a, p in zip(alone, packed)]
    return {"ok": all(d <= tolerance for d in diffs), "max_difference": max(diffs),  # a missing example (nan) fails
            "tolerance": tolerance, "rows": len(rows), "path": "block_mask" if block_mask else "padding_free",
            "per_example": [{"alone": a, "packed": p} for a, p in zip(alone, packed)]}
