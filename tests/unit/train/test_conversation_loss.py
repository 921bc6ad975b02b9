"""`data.prompt.loss_on: every_answer` reaches the trainer: TRL's collator keeps the labels labkit wrote, so a batch
carries the loss on every assistant turn of the shipped support conversations, and a real step trains on them."""

from __future__ import annotations

import math
from pathlib import Path

from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.data import sources as D
from labkit.data.prompting import IGNORE, encode_rows
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.train.trainer import build_trainer


def test_a_batch_carries_the_loss_of_every_answer_and_a_step_trains_on_it(tmp_path: Path, tiny_model) -> None:
    child = tmp_path / "every.yaml"
    child.write_text(f"parent: {REPO / 'params' / 'examples' / 'support-chat-every-answer.yaml'}\n"
                     "model: {source: 'tiny:llama', dtype: float32}\ntrain: {micro_batch: 4, max_steps: 1}\n")
    card = load_card(child).card
    rows = D.map_fields(card.data, D.load_source(card.data)[0])[:4]
    assert all(row["input"].count('"assistant"') >= 1 for row in rows)  # each has an earlier answer to learn
    tokenizer = load_tokenizer(tiny_model, card)
    encoded = {tuple(e.input_ids): e.labels for e in encode_rows(tokenizer, card, rows)}
    last = sum(e.loss_tokens for e in encode_rows(tokenizer, updated(card, {"data.prompt.loss_on": "last_answer"}), rows))
    trainer = build_trainer(card, apply_method(load_model(tiny_model, card, "cpu"), card), tokenizer, rows,
                            tmp_path / "out", device="cpu", disable_tqdm=True)
    batch = next(iter(trainer.get_train_dataloader()))
    carried = 0
    for ids, labels, mask in zip(batch["input_ids"].tolist(), batch["labels"].tolist(), batch["attention_mask"].tolist()):
        n = sum(mask)
        assert labels[:n] == encoded[tuple(ids[:n])] and all(x == IGNORE for x in labels[n:])
        carried += sum(x != IGNORE for x in labels)
    assert carried > last  # the earlier answers' tokens, beside the last answers'
    trainer.train()
    assert math.isfinite(trainer.state.log_history[0]["loss"])
