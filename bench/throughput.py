"""Benchmark: training throughput of labkit's stage-04 trainer against two classic recipes.

All three train the quickstart model with the quickstart's LoRA (r=16, all linear layers) on the same
training rows for the same number of optimiser steps, at the same precision (the card's, fp32):

- labkit: stage 04's trainer as `params/examples/ticket-packed.yaml` configures it — packed rows
  (best fit decreasing, block-diagonal attention), one packed row per micro-batch × 4, and labkit's
  loss head, which projects only the positions that carry a loss (`labkit.train.loss_head`);
- padded: every example padded to `data.max_length` (the classic QLoRA tutorials), micro-batch 4,
  through TRL's SFTTrainer as it comes;
- dynamic: the classic tutorial as written — TRL's SFTTrainer as it comes, dynamic padding,
  micro-batch 2 × gradient accumulation 4.

Throughput counts the training tokens that are not padding, of the batches the optimiser steps
consumed, per second of `trainer.train()`. The three run interleaved (round robin) `--rounds` times
in one process; medians are reported. Result quality: each trained model's mean loss on the same 40
held-out examples (one at a time, no padding), next to its final training loss. Prints one JSON object.

Run: .venv/bin/python bench/throughput.py [--steps 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CARD = REPO / "params" / "examples" / "ticket-packed.yaml"
HELD_OUT = 40


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


class _Counting:
    """Wraps a collator; the trainer's training_step takes each batch's real (non-padding) token count in order.

    The data loader may collate a batch ahead of the step that uses it, so counts queue up and a step
    takes the oldest: batches collated but never trained on are not counted.
    """

    def __init__(self, collate) -> None:
        self.collate, self.pending, self.tokens = collate, deque(), 0

    def __call__(self, rows: list[dict]) -> dict:
        self.pending.append(sum(len(r["input_ids"]) for r in rows))
        return self.collate(rows)

    def attach(self, trainer) -> None:
        trainer.data_collator = self
        step = trainer.training_step

        def counted(*args, **kwargs):
            self.tokens += self.pending.popleft()
            return step(*args, **kwargs)

        trainer.training_step = counted


def _trainer(recipe: str, card, resolved, tokenizer, rows, steps: int):
    from trl import SFTTrainer

    from labkit.card.update import updated
    from labkit.model.loading import load_model
    from labkit.model.method import apply_method
    from labkit.train.trainer import build_trainer

    if recipe != "labkit":  # the classic recipes: no packing, TRL's own loss
        card = updated(card, {"train.packing": False, "train.micro_batch": 4 if recipe == "padded" else 2,
                              "train.grad_accum": 1 if recipe == "padded" else 4})
    model = apply_method(load_model(resolved, card, "cpu"), card)
    trainer = build_trainer(card, model, tokenizer, rows, Path(tempfile.mkdtemp()), device="cpu", max_steps=steps,
                            logging_steps=steps, disable_tqdm=True)
    if recipe != "labkit":
        trainer.compute_loss = SFTTrainer.compute_loss.__get__(trainer)  # TRL's SFTTrainer as it comes
    if recipe == "padded":
        trainer.data_collator = _PadToMax(tokenizer.pad_token_id, card.data.max_length)
    return trainer


def _held_out_loss(model, examples) -> float:
    """Mean completion loss per example on the held-out examples, one at a time (no padding, no packing)."""
    import torch

    model.eval()
    with torch.no_grad():
        losses = [model(input_ids=torch.tensor([e.input_ids]), labels=torch.tensor([e.labels])).loss.item()
                  for e in examples]
    return statistics.fmean(losses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from labkit.card.load import load_card
    from labkit.data import sources as D
    from labkit.data.prompting import encode_rows
    from labkit.model.loading import load_tokenizer
    from labkit.model.sources import resolve

    card = load_card(CARD).card
    resolved = resolve(card.model.source, card.model.revision, base=CARD.parent)
    tokenizer = load_tokenizer(resolved, card)
    rows = [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()]
    train, held_out = rows[:-HELD_OUT], encode_rows(tokenizer, card, rows[-HELD_OUT:])
    recipes = ("labkit", "padded", "dynamic")
    results: dict[str, list] = {r: [] for r in recipes}
    for round_ in range(args.rounds):
        for recipe in recipes:
            trainer = _trainer(recipe, card, resolved, tokenizer, train, args.steps)
            counter = _Counting(trainer.data_collator)
            counter.attach(trainer)
            start = time.perf_counter()
            with contextlib.redirect_stdout(sys.stderr):  # the trainer's log lines; stdout is the JSON only
                out = trainer.train()
            seconds = time.perf_counter() - start
            results[recipe].append({"tokens_per_second": counter.tokens / seconds, "seconds": seconds,
                                    "tokens": counter.tokens, "train_loss": out.metrics["train_loss"],
                                    "held_out_loss": _held_out_loss(trainer.model, held_out)})
            print(f"round {round_ + 1} {recipe:8s} {counter.tokens / seconds:8.1f} tok/s "
                  f"held-out loss {results[recipe][-1]['held_out_loss']:.3f}", file=sys.stderr)
    med = {r: statistics.median(x["tokens_per_second"] for x in v) for r, v in results.items()}
    print(json.dumps({"benchmark": "training_throughput", "model": "SmolLM2-135M-Instruct (quickstart), LoRA r=16",
                      "labkit_card": str(CARD.relative_to(REPO)), "optimiser_steps": args.steps, "rounds": args.rounds,
                      "median_tokens_per_second": med,
                      "ratio_vs_padded_to_max_length": med["labkit"] / med["padded"],
                      "ratio_vs_dynamic_microbatch2_accum4": med["labkit"] / med["dynamic"],
                      "median_held_out_loss": {r: statistics.median(x["held_out_loss"] for x in v)
                                               for r, v in results.items()},
                      "median_train_loss": {r: statistics.median(x["train_loss"] for x in v) for r, v in results.items()},
                      "targets": {"vs_padded": 2.0, "vs_dynamic": 1.5}, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
