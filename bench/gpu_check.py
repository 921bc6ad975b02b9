"""One prepared GPU check: the decisions, memory estimate, throughput and packing check of labkit on a real GPU.

On one CUDA (or ROCm) GPU, in under 8 minutes, with the quickstart model when it is in the cache, else a Llama
built on the fly (12 layers, hidden 1024; the tiny tokenizer), all at the device profile's precision (bf16 where
native, else fp16):

- the device profile and `labkit.model.placement.decide`'s choices for the packed card;
- a LoRA and a QLoRA training step: the memory estimate (`labkit.preflight.memory.estimate_step`) against
  `torch.cuda.max_memory_allocated` (target: within 10 %), and seconds per step;
- tokens/s of labkit's packed path against the padded-to-max-length and the dynamic-padding recipes of
  `bench/throughput.py` (targets 2× and 1.5×);
- the packed-vs-alone loss check at the dtype's tolerance.

Prints one JSON object. Without a GPU it says it needs CUDA, prints {"skipped": …} and exits 0;
`--cpu-dry-run` runs every part on the CPU with a small model and one step (to check the script, not the GPU).

Run: .venv/bin/python bench/gpu_check.py [--steps 6] [--seq-len 512] [--cpu-dry-run]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
CARD = REPO / "params" / "examples" / "ticket-packed.yaml"


def _model_source(card, small: bool) -> tuple[str, str]:
    """The quickstart model when the cache has it, else a Llama built here (returns source, what)."""
    from labkit.model.sources import resolve

    if not small:
        try:
            resolve(card.model.source, card.model.revision, base=CARD.parent)
            return card.model.source, "quickstart SmolLM2-135M-Instruct"
        except Exception:  # noqa: BLE001 — not cached and no network: build one
            pass
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tiny = resolve("tiny:llama")
    tokenizer = AutoTokenizer.from_pretrained(tiny.location)
    size = dict(hidden_size=256, intermediate_size=704, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2) if small else dict(hidden_size=1024, intermediate_size=2816,
                                                          num_hidden_layers=12, num_attention_heads=16,
                                                          num_key_value_heads=4)
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=2048, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **size)
    folder = Path(tempfile.mkdtemp(prefix="labkit-gpu-check-")) / "model"
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder), f"Llama built on the fly ({size['num_hidden_layers']} layers, hidden {size['hidden_size']})"


def _memory(card, source, tokenizer, rows, seq_len: int, device: str, kind: str) -> dict:
    """One method's measured step against the estimate."""
    import torch
    from transformers import AutoConfig

    from labkit.model.loading import load_model
    from labkit.model.method import apply_method
    from labkit.model.sources import resolve
    from labkit.preflight.measure import measure_step
    from labkit.preflight.memory import estimate_step

    data = card.model_dump()
    data["method"] = {"kind": kind, "r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}
    data["train"]["packing"] = False
    card = type(card).model_validate(data)
    resolved = resolve(source)
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = apply_method(load_model(resolved, card, device), card)
    weights = torch.cuda.memory_allocated() if device == "cuda" else None
    with contextlib.redirect_stdout(sys.stderr):
        got = measure_step(card, model, tokenizer, rows, seq_len, Path(tempfile.mkdtemp()), device=device)
    est = estimate_step(AutoConfig.from_pretrained(resolved.location), card, seq_len, device=device)
    measured = got["memory"]["delta_bytes"]
    out = {"method": kind, "seq_len": seq_len, "micro_batch": card.train.micro_batch,
           "estimate_step_bytes": est["step_bytes"], "measured_step_bytes": measured, "measured_by": got["memory"]["method"],
           "step_error": abs(est["step_bytes"] - measured) / measured if measured else None,
           "seconds_per_step": got["seconds_per_step"], "dtype": est["dtype"]}
    if weights is not None:
        out.update(estimate_weights_bytes=est["weights_bytes"], measured_weights_bytes=weights,
                   peak_error=abs(est["peak_bytes"] - (weights + measured)) / (weights + measured))
    del model
    return out


def _throughput(card, source, tokenizer, rows, steps: int, device: str) -> dict:
    """Tokens/s of labkit's packed path against the padded and the dynamic-padding recipes (one round each)."""
    from throughput import _Counting, _PadToMax
    from trl import SFTTrainer

    from labkit.card.update import updated
    from labkit.model.loading import load_model
    from labkit.model.method import apply_method
    from labkit.model.sources import resolve
    from labkit.train.trainer import build_trainer

    out = {}
    for recipe in ("labkit", "padded", "dynamic"):
        c = card
        if recipe != "labkit":
            c = updated(card, {"train.packing": False, "train.micro_batch": 4 if recipe == "padded" else 2,
                               "train.grad_accum": 1 if recipe == "padded" else 4})
        model = apply_method(load_model(resolve(source), c, device), c)
        trainer = build_trainer(c, model, tokenizer, rows, Path(tempfile.mkdtemp()), device=device, max_steps=steps,
                                logging_steps=steps, disable_tqdm=True)
        if recipe != "labkit":
            trainer.compute_loss = SFTTrainer.compute_loss.__get__(trainer)
        if recipe == "padded":
            trainer.data_collator = _PadToMax(tokenizer.pad_token_id, c.data.max_length)
        counter = _Counting(trainer.data_collator)
        counter.attach(trainer)
        start = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):
            trainer.train()
        out[recipe] = counter.tokens / (time.perf_counter() - start)
        del model, trainer
    return {"tokens_per_second": out, "ratio_vs_padded": out["labkit"] / out["padded"],
            "ratio_vs_dynamic": out["labkit"] / out["dynamic"], "targets": {"vs_padded": 2.0, "vs_dynamic": 1.5}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="optimiser steps per throughput recipe")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per row of the memory check")
    parser.add_argument("--cpu-dry-run", action="store_true", help="run every part on the CPU, small and short")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available() and not args.cpu_dry_run:
        print("gpu_check: needs a CUDA (or ROCm) GPU; none is visible here (--cpu-dry-run checks the script on the "
              "CPU)", file=sys.stderr)
        print(json.dumps({"benchmark": "gpu_check", "skipped": "needs a CUDA GPU"}))
        return 0
    from labkit.card.load import load_card
    from labkit.card.update import updated
    from labkit.core.device import capture
    from labkit.data import sources as D
    from labkit.data.prompting import encode_rows
    from labkit.model.loading import load_model, load_tokenizer
    from labkit.model.placement import decide
    from labkit.model.sources import resolve
    from labkit.train.packing import isolation_check

    start = time.perf_counter()
    device = "cpu" if args.cpu_dry_run else "cuda"
    steps, seq_len = (1, 64) if args.cpu_dry_run else (args.steps, args.seq_len)
    card = load_card(CARD).card
    source, what = _model_source(card, small=args.cpu_dry_run)
    card = updated(card, {"model.source": source, "model.revision": None, "model.dtype": "auto", "train.precision": "auto"})
    profile = capture(device)
    made = decide(card, profile, world_size=1)
    tokenizer = load_tokenizer(resolve(source), card)
    rows = [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()]
    train, held = rows[:-8], rows[-8:]
    memory = [_memory(card, source, tokenizer, train, seq_len, device, kind) for kind in ("lora", "qlora")]
    speed = _throughput(card, source, tokenizer, train[: 64 if args.cpu_dry_run else None], steps, device)
    model = load_model(resolve(source), card, device)
    examples = [{"input_ids": e.input_ids, "labels": e.labels} for e in encode_rows(tokenizer, card, held)]
    packing = isolation_check(model, examples, card.data.max_length)
    packing.pop("per_example")
    print(json.dumps({"benchmark": "gpu_check", "device": profile.as_dict(), "model": what, "decisions": made.as_dict(),
                      "memory": memory, "throughput": speed, "packing_check": packing,
                      "memory_target": "estimate within 10 % of max_memory_allocated",
                      "seconds": time.perf_counter() - start, "cpu_dry_run": args.cpu_dry_run}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
