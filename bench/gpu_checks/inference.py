"""The GPU check's inference parts: a batch of 4-bit generation, and the packed-vs-alone check of the packed path.

Generation runs labkit's evaluation procedure (`labkit.evaluate.procedure.evaluate_rows`: the card's prompts, greedy
decoding, stop ids, ROUGE) on the random Llama loaded in 4 bits (bitsandbytes NF4) and checks the logits of the
batch's prompts are finite. The packing check is the one stage 04 runs before packed training
(`labkit.train.packing.isolation_check`), on the path the device's placement chooses (padding-free position ids
through flex or flash attention on a GPU, labkit's block mask on the CPU).
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

from .models import card_data, write_card


def _rows(card: Any, n: int) -> list[dict[str, Any]]:
    from labkit.data import sources as D

    return [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()][:n]


def _prompt_logits_finite(model: Any, tokenizer: Any, card: Any, rows: list[dict[str, Any]]) -> bool:
    """One forward pass over the rows' prompts, left-padded as generation pads them: are all logits finite?"""
    import torch

    from labkit.data.prompting import prompt_ids

    prompts = [prompt_ids(tokenizer, card, r["input"]) for r in rows]
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits
    return bool(torch.isfinite(logits[mask.to(device).bool()]).all())


def generation(source: str, device: str, precision: str, rows: int = 8) -> dict[str, Any]:
    """A batch of `rows` prompts through the evaluation procedure, the model loaded in 4 bits.

    Args:
        source: the model source (the random Llama).
        device: "cuda" or "cpu".
        precision: "bf16" or "fp32" (the 4-bit layers' compute dtype follows it).
        rows: the batch (one batch: eval.batch_size is 8).
    Returns:
        {"rows", "answers", "seconds", "answers_non_empty", "new_tokens", "new_tokens_per_second", "logits_finite",
         "metrics"} (a random model often repeats one token: its answers may be blank).
    """
    import torch

    from labkit.evaluate.procedure import evaluate_rows
    from labkit.model.loading import load_model, load_tokenizer
    from labkit.model.sources import resolve

    card = write_card(card_data(source, precision, False, 4, variant="generation")).card
    resolved = resolve(source)
    tokenizer = load_tokenizer(resolved, card)
    model = load_model(resolved, card, device)
    quantised = sum(1 for m in model.modules() if type(m).__name__ == "Linear4bit")
    batch = _rows(card, rows)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        scored, metrics = evaluate_rows(model, tokenizer, card, batch, "gpu check")
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    new_tokens = sum(len(tokenizer(r["prediction"], add_special_tokens=False)["input_ids"]) for r in scored)
    finite = _prompt_logits_finite(model, tokenizer, card, batch)
    del model
    return {"model": source, "linear_4bit_layers": quantised, "rows": len(batch), "answers": len(scored),
            "max_new_tokens": card.eval.max_new_tokens, "seconds": round(seconds, 3),
            "answers_non_empty": sum(1 for r in scored if r["prediction"].strip()), "new_tokens": new_tokens,
            "new_tokens_per_second": new_tokens / seconds if seconds else None, "logits_finite": finite,
            "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))}}


def packing(source: str, device: str, precision: str) -> dict[str, Any]:
    """The packed-vs-alone check of six examples on the path the placement chooses for a packed card.

    Args:
        source: the model source.
        device: "cuda" or "cpu".
        precision: "bf16" or "fp32".
    Returns:
        {"ok", "max_difference", "tolerance", "attention", "packing"}.
    """
    from labkit.card.update import updated
    from labkit.data.prompting import encode_rows
    from labkit.model.loading import load_model, load_tokenizer
    from labkit.model.sources import resolve
    from labkit.train.packing import isolation_check

    card = write_card(card_data(source, precision, False, 4, variant="packing")).card
    card = updated(card, {"train.packing": True, "method": {"kind": "lora", "r": 16, "alpha": 32, "dropout": 0.0}})
    resolved = resolve(source)
    tokenizer = load_tokenizer(resolved, card)
    model = load_model(resolved, card, device)
    examples = [{"input_ids": e.input_ids, "labels": e.labels} for e in encode_rows(tokenizer, card, _rows(card, 6))]
    found = isolation_check(model, examples, card.data.max_length)
    found.pop("per_example", None)
    made = getattr(model, "labkit_decisions", {}) or {}
    del model
    return {**found, "attention": made.get("attention"), "packing": made.get("packing")}
