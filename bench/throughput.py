"""Benchmark: training throughput of labkit's stage-04 trainer (packed rows) against two classic recipes.

All three train the quickstart model with the quickstart's LoRA (r=16, all linear layers) on the
quickstart's training rows for the same number of optimiser steps, through TRL's SFTTrainer:

- labkit: `train.packing: true` — rows of up to `data.max_length` tokens, block-diagonal masks,
  the card's micro-batch;
- padded: every example padded to `data.max_length` (the classic QLoRA tutorials), micro-batch 4;
- dynamic: the classic tutorial as written — dynamic padding, micro-batch 2 × gradient accumulation 4.

Throughput counts training tokens that are not padding, per second of `trainer.train()`. The three
run interleaved (round robin) `--rounds` times in one process; medians are reported, with the
final training loss of each so the result quality can be compared. Prints one JSON object.

Run: .venv/bin/python bench/throughput.py [--steps 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class _PadToMax:
    """The classic recipe's collator: every example padded to max_length."""

    def __init__(self, pad_id: int, length: int) -> None:
        self.pad_id, self.length = pad_id, length

    def __call__(self, rows: list[dict]) -> dict:
        import torch

        n = len(rows)
        ids = torch.full((n, self.length), self.pad_id, dtype=torch.long)
        labels = torch.full((n, self.length), -100, dtype=torch.long)
        mask = torch.zeros((n, self.length), dtype=torch.long)
        for i, r in enumerate(rows):
            k = min(len(r["input_ids"]), self.length)
            ids[i, :k], labels[i, :k], mask[i, :k] = torch.tensor(r["input_ids"][:k]), torch.tensor(r["labels"][:k]), 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def _trainer(recipe: str, card, resolved, tokenizer, rows, steps: int):
    from labkit.loading import load_model
    from labkit.method import apply_method
    from labkit.training import build_trainer

    card = card.model_copy(deep=True)
    overrides: dict = {}
    if recipe == "labkit":
        card.train.packing = True
    elif recipe == "padded":
        card.train.micro_batch = 4
    else:
        card.train.micro_batch, card.train.grad_accum = 2, 4
    model = apply_method(load_model(resolved, card, "cpu"), card)
    trainer = build_trainer(card, model, tokenizer, rows, Path(tempfile.mkdtemp()), device="cpu", max_steps=steps,
                            logging_steps=steps, disable_tqdm=True, **overrides)
    if recipe == "padded":
        trainer.data_collator = _PadToMax(tokenizer.pad_token_id, card.data.max_length)
    return trainer


class _Counting:
    """Wraps a collator and counts the real (non-padding) tokens of every batch it builds."""

    def __init__(self, collate) -> None:
        self.collate, self.tokens = collate, 0

    def __call__(self, rows: list[dict]) -> dict:
        self.tokens += sum(min(len(r["input_ids"]), 10**9) for r in rows)
        return self.collate(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from labkit import data as D
    from labkit.cards import load_card
    from labkit.loading import load_tokenizer
    from labkit.models import resolve

    card = load_card(REPO / "params" / "quickstart.yaml").card
    resolved = resolve(card.model.source, card.model.revision, base=REPO / "params")
    tokenizer = load_tokenizer(resolved, card)
    rows = [r for r in D.map_fields(card, D.load_source(card)[0]) if r["input"].strip()]
    recipes = ("labkit", "padded", "dynamic")
    results: dict[str, list] = {r: [] for r in recipes}
    for round_ in range(args.rounds):
        for recipe in recipes:
            trainer = _trainer(recipe, card, resolved, tokenizer, rows, args.steps)
            counter = trainer.data_collator = _Counting(trainer.data_collator)
            start = time.perf_counter()
            with contextlib.redirect_stdout(sys.stderr):  # the trainer's log lines; stdout is the JSON only
                out = trainer.train()
            seconds = time.perf_counter() - start
            tokens = counter.tokens
            results[recipe].append({"tokens_per_second": tokens / seconds, "seconds": seconds, "tokens": tokens,
                                    "train_loss": out.metrics["train_loss"]})
            print(f"round {round_ + 1} {recipe:8s} {tokens / seconds:8.1f} tok/s", file=sys.stderr)
    med = {r: statistics.median(x["tokens_per_second"] for x in v) for r, v in results.items()}
    print(json.dumps({"benchmark": "training_throughput", "model": "SmolLM2-135M-Instruct (quickstart), LoRA r=16",
                      "optimiser_steps": args.steps, "rounds": args.rounds,
                      "median_tokens_per_second": med,
                      "ratio_vs_padded_to_max_length": med["labkit"] / med["padded"],
                      "ratio_vs_dynamic_microbatch2_accum4": med["labkit"] / med["dynamic"],
                      "median_train_loss": {r: statistics.median(x["train_loss"] for x in v) for r, v in results.items()},
                      "targets": {"vs_padded": 2.0, "vs_dynamic": 1.5}, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
