"""Rejected answers from the base model (`data.rejected: {from: base_model}`): preference pairs for DPO / ORPO from
SFT-style data, without hand labelling.

Each row the run trains on (`labkit.data.pairs.rows_to_answer`: with train.max_steps, only the rows its steps
read) and each validation row gets as rejected answer the base model's own greedy answer to the row's prompt, with
the evaluation's generation procedure (`labkit.evaluate.generation.generate_answers`: batched, greedy,
`eval.max_new_tokens`). The answers are generated once and cached in the labkit cache (`rejected/<key>.jsonl`),
keyed by the model revision, the data version, the prompt format (the card's prompt section and the tokenizer's chat
template) and the generation settings; a later run with the same key reads the file and loads no model.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from labkit.card.experiment_and_data import Prompt
from labkit.card.schema import Card
from labkit.core.io import read_json, read_jsonl, utc_now, write_json, write_jsonl
from labkit.data.sources import sha256_text
from labkit.evaluate.generation import generate_answers
from labkit.evaluate.length import size_generation
from labkit.model.sources import cache_dir

SPLITS = ("train", "validation")


def cache_key(card: Card, tokenizer: Any, model_revision: str, data_version: str) -> dict[str, Any]:
    """What the base model's answers depend on: model revision, data version, prompt format, generation settings."""
    return {"model_revision": model_revision, "data_version": data_version,
            "prompt": card.data.prompt.model_dump(mode="json", exclude=Prompt.TRAINING_ONLY),
            "chat_template_sha256": sha256_text(getattr(tokenizer, "chat_template", None) or ""),
            "weights": {"dtype": card.model.dtype, "quantised_4bit": card.method.kind == "qlora"},
            "max_length": card.data.max_length, "generation": {"decoding": card.eval.decoding,
                                                                "max_new_tokens": card.eval.max_new_tokens}}


def base_model_answers(card: Card, tokenizer: Any, model_revision: str, load_model: Callable[[], Any],
                       root: Path | None = None) -> Callable[[dict[str, list[dict[str, Any]]], str], dict[str, Any]]:
    """The answerer `labkit.data.prepare.prepare` calls to fill the rejected answers (the model is loaded on a miss only).

    Args:
        card: the card (prompt, eval settings).
        tokenizer: the base model's tokenizer.
        model_revision: the base model's exact revision.
        load_model: loads the base model on its device as the baseline does, 4-bit for qlora (called at most once,
            and only when the cache misses).
        root: the cache folder (default: the labkit cache's `rejected/`).
    Returns:
        answer(splits, data_version) -> {"answers": {split: {row id: answer}}, "cache": {...}} where cache names the
        key, the file, whether this call generated the answers, added the rows the cache lacked ("extended") or
        reused them, the rows it generated, the seconds that took (loading the model included) and the seconds the
        cached answers took when they were generated.
    """
    folder = root or cache_dir() / "rejected"

    def answer(splits: dict[str, list[dict[str, Any]]], data_version: str) -> dict[str, Any]:
        sized = card  # a card without eval.max_new_tokens: sized from these rows' references (labkit.evaluate.length)
        if card.eval.max_new_tokens is None:
            tokens = size_generation(tokenizer, [r["target"] for name in SPLITS for r in splits[name]])["max_new_tokens"]
            sized = card.model_copy(update={"eval": card.eval.model_copy(update={"max_new_tokens": tokens})})
        key = cache_key(sized, tokenizer, model_revision, data_version)
        digest = sha256_text(json.dumps(key, sort_keys=True))[:16]
        path, meta_path = folder / f"{digest}.jsonl", folder / f"{digest}.json"
        wanted = {name: [r["id"] for r in splits[name]] for name in SPLITS}
        cached: dict[str, dict[str, str]] = {name: {} for name in SPLITS}
        meta: dict[str, Any] = read_json(meta_path) if path.exists() and meta_path.exists() else {}
        if meta:
            for row in read_jsonl(path):
                cached[row["split"]][row["id"]] = row["rejected"]
        missing = {name: [r for r in splits[name] if r["id"] not in cached[name]] for name in SPLITS}
        taken = float(meta.get("seconds", 0.0))  # what generating the cached answers took
        if not any(missing.values()):
            return {"answers": cached, "cache": {"key": key, "file": str(path), "status": "reused", "generated_rows": 0,
                                                 "seconds": 0.0, "cached_seconds": taken}}
        start = time.perf_counter()
        model = load_model()
        for name in SPLITS:  # only the rows the cache lacks (a longer run of the same data adds its extra rows)
            if missing[name]:
                texts = generate_answers(model, tokenizer, sized, missing[name], desc=f"base model's answers ({name})")
                cached[name].update(zip([r["id"] for r in missing[name]], texts, strict=True))
        del model
        seconds = time.perf_counter() - start
        generated = sum(len(rows) for rows in missing.values())
        write_jsonl(path, [{"split": n, "id": i, "rejected": a} for n in SPLITS for i, a in cached[n].items()])
        write_json(meta_path, {"key": key, "rows": {n: len(cached[n]) for n in SPLITS}, "generated": utc_now(),
                               "seconds": taken + seconds})
        return {"answers": cached, "cache": {"key": key, "file": str(path), "status": "generated" if generated == sum(
            len(ids) for ids in wanted.values()) else "extended", "generated_rows": generated, "seconds": seconds,
            "cached_seconds": taken}}

    return answer
