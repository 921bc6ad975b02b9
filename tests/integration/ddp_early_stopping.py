"""Worker of test_early_stopping's DDP test, run on every process of `accelerate launch`: trains the tiny model with
early stopping on a generation metric and writes what this rank saw to OUT/rank<N>.json.

Usage: accelerate launch --config_file CONFIG tests/integration/ddp_early_stopping.py OUT (OUT holds card.json)
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from labkit.card.schema import Card
from labkit.data import sources as D
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.model.sources import resolve
from labkit.train.early_stopping import metric_key
from labkit.train.trainer import build_trainer


def main(out: Path) -> None:
    card = Card.model_validate(json.loads((out / "card.json").read_text()))
    tiny = resolve(card.model.source)
    rows = [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()]
    model = apply_method(load_model(tiny, card, "cpu"), card)
    trainer = build_trainer(card, model, load_tokenizer(tiny, card), rows[:32], out / "trainer", eval_rows=rows[32:40],
                            device="cpu", checkpoints=True, disable_tqdm=True)
    trainer.train()
    key = metric_key(card.train.early_stopping)
    digest = hashlib.sha256()
    for name, tensor in sorted(trainer.model.named_parameters()):
        if tensor.requires_grad:
            digest.update(name.encode() + tensor.detach().cpu().numpy().tobytes())
    seen = {"rank": trainer.args.process_index, "world_size": trainer.args.world_size,
            "evals": [[r["step"], r[key]] for r in trainer.state.log_history if key in r],
            "best": [trainer.state.best_global_step, trainer.state.best_metric], "step": trainer.state.global_step,
            "use_cache": trainer.model.config.use_cache, "weights": digest.hexdigest()}
    (out / f"rank{seen['rank']}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
