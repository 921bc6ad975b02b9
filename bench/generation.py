"""Benchmark: evaluation throughput of labkit's batched generation against one example at a time.

Both recipes answer the quickstart card's validation prompts with the quickstart model
(SmolLM2-135M-Instruct from its PyPI package, fp32), greedily, up to `eval.max_new_tokens`, stopping
at EOS, from the same prompt token ids (`labkit.data.prompting.prompt_ids`):

- labkit: `labkit.evaluate.generation.generate_answers` — prompts sorted by length, left-padded into batches
  of `eval.batch_size` (16), one `generate` call per batch with a KV cache;
- single: the classic tutorial loop — one prompt per `model.generate` call, no padding.

The two are interleaved at the level of labkit's own batches: the prompts are sorted by length and
cut every batch size exactly as `generate_answers` does, and each batch is answered by both recipes
back to back (which goes first alternates), after a short warm-up of both; a 2-core machine shared
with other work changes speed within minutes, and this way both recipes see nearly the same load.
This is repeated `--rounds` times; reported: medians of the per-round seconds and examples per second, the
median of the per-round ratios (the headline: each round times both recipes under the same load),
the median per-batch ratio, and each round's 1-minute load average at its start (this process's own
2 threads count: about 2 means nothing else ran). The answers are compared text for text in every
round: they must be identical, and every mismatch is listed (id and both texts) and makes the exit
status 1. Prints one JSON object.

Run: .venv/bin/python bench/generation.py [--rounds 3] [--limit N] [--batch-size B] [--rows FILE]
The rows are the validation split of the newest quickstart run (`make run` makes one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from labkit.core import io

REPO = Path(__file__).resolve().parent.parent
CARD = REPO / "params" / "quickstart.yaml"


def single(model, tokenizer, card, rows: list[dict], new_tokens: dict) -> list[str]:
    """The classic recipe: one prompt per generate call, greedy, same prompt ids, length limit and EOS.
    Records in new_tokens how many tokens each answer took (EOS included)."""
    import torch

    from labkit.data.prompting import prompt_ids

    answers = []
    with torch.inference_mode():
        for row in rows:
            ids = torch.tensor([prompt_ids(tokenizer, card, row["input"])])
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=card.eval.max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id, temperature=None, top_p=None, top_k=None)
            answers.append(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip())
            new_tokens[row["id"]] = out.shape[1] - ids.shape[1]
    return answers


def _cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else what platform says."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def validation_rows(card, given: str | None) -> Path:
    """The validation split of the newest run of the card's experiment (or the file given)."""
    from labkit.core.runs import runs_root

    if given:
        return Path(given)
    found = sorted((runs_root(REPO) / card.experiment.id).glob("*/data/validation.jsonl"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"no prepared run of {card.experiment.id} under {runs_root(REPO)}: run `make run` first, or pass --rows")
    return found[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=0, help="first N validation examples (default: all)")
    parser.add_argument("--batch-size", type=int, default=0, help="override the card's eval.batch_size")
    parser.add_argument("--rows", help="a JSONL file of prepared rows (id, input) instead of the newest run's validation split")
    args = parser.parse_args()
    import torch
    import transformers

    from labkit.card.load import load_card
    from labkit.card.update import updated
    from labkit.data.prompting import prompt_ids
    from labkit.evaluate.generation import generate_answers
    from labkit.model.loading import load_model, load_tokenizer
    from labkit.model.sources import resolve

    card = load_card(CARD).card
    if args.batch_size:
        card = updated(card, {"eval.batch_size": args.batch_size})
    path = validation_rows(card, args.rows)
    rows = io.read_jsonl(path)
    rows = rows[: args.limit] if args.limit else rows
    resolved = resolve(card.model.source, card.model.revision, base=CARD.parent)
    tokenizer = load_tokenizer(resolved, card)
    model = load_model(resolved, card, "cpu")
    assert next(model.parameters()).dtype == torch.float32, "the comparison is defined in fp32"
    new_tokens: dict[str, int] = {}
    recipes = {"labkit": lambda rs: generate_answers(model, tokenizer, card, rs, desc="labkit"),
               "single": lambda rs: single(model, tokenizer, card, rs, new_tokens)}
    for run in recipes.values():  # warm-up (first-call kernel set-up), not timed
        run(rows[:2])
    # The batches labkit forms (prompts sorted by length, then cut every batch_size): each is timed with both
    # recipes back to back, so both meet nearly the same load (a batch takes seconds one way and tens of
    # seconds the other, so a burst of load can still land unevenly: per_round records the load).
    lengths = [len(prompt_ids(tokenizer, card, r["input"])) for r in rows]
    ordered = [rows[i] for i in sorted(range(len(rows)), key=lambda i: (lengths[i], i))]
    chunks = [ordered[i:i + card.eval.batch_size] for i in range(0, len(ordered), card.eval.batch_size)]
    times: dict[str, list[float]] = {name: [] for name in recipes}
    chunk_ratios: list[float] = []
    per_round: list[dict] = []
    mismatches: dict[str, dict] = {}
    first: dict[str, dict[str, str]] = {}
    unstable: dict[str, set] = {name: set() for name in recipes}
    for round_ in range(args.rounds):
        answers: dict[str, dict[str, str]] = {name: {} for name in recipes}
        total = dict.fromkeys(recipes, 0.0)
        load = os.getloadavg()[0]
        for k, chunk in enumerate(chunks):
            seconds = {}
            for name in (list(recipes) if (round_ + k) % 2 == 0 else list(reversed(recipes))):
                start = time.perf_counter()
                out = recipes[name](chunk)
                seconds[name] = time.perf_counter() - start
                answers[name].update(zip((r["id"] for r in chunk), out, strict=True))
            chunk_ratios.append(seconds["single"] / seconds["labkit"])
            for name in recipes:
                total[name] += seconds[name]
        per_round.append({"labkit_s": round(total["labkit"], 2), "single_s": round(total["single"], 2),
                          "ratio": round(total["single"] / total["labkit"], 2), "load_1min": round(load, 2)})
        for name in recipes:
            times[name].append(total[name])
            first.setdefault(name, answers[name])
            unstable[name] |= {i for i, a in answers[name].items() if a != first[name][i]}  # must repeat itself
        for row in rows:
            a, b = answers["labkit"][row["id"]], answers["single"][row["id"]]
            if a != b:
                mismatches.setdefault(row["id"], {"id": row["id"], "labkit": a, "single": b, "rounds": []})["rounds"].append(round_ + 1)
        print(f"round {round_ + 1}: labkit {total['labkit']:7.1f} s, single {total['single']:7.1f} s "
              f"({total['single'] / total['labkit']:.2f}x), {len(mismatches)} mismatches so far", file=sys.stderr)
    med = {name: statistics.median(t) for name, t in times.items()}
    result = {
        "benchmark": "generation_throughput", "model": "SmolLM2-135M-Instruct (quickstart), fp32",
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "processor": _cpu_name(),
                    "device": "cpu", "torch": torch.__version__, "transformers": transformers.__version__,
                    "attn_implementation": model.config._attn_implementation},
        "rows": str(path.relative_to(REPO) if path.is_relative_to(REPO) else path), "examples": len(rows),
        "batch_size": card.eval.batch_size, "max_new_tokens": card.eval.max_new_tokens, "rounds": args.rounds,
        "median_seconds": {n: round(s, 2) for n, s in med.items()},
        "median_examples_per_second": {n: round(len(rows) / s, 3) for n, s in med.items()},
        # each round times both recipes under the same load: the paired per-round ratio is the headline
        "ratio_labkit_vs_single": statistics.median(r["ratio"] for r in per_round), "target_ratio": 4.0,
        "ratio_of_median_seconds": round(med["single"] / med["labkit"], 2),
        "median_ratio_per_batch": round(statistics.median(chunk_ratios), 2), "batches_per_round": len(chunks),
        "per_round": per_round,
        "mean_new_tokens": round(statistics.mean(new_tokens[r["id"]] for r in rows), 1),
        "answers_reaching_max_new_tokens": sum(new_tokens[r["id"]] == card.eval.max_new_tokens for r in rows),
        "identical": f"{len(rows) - len(mismatches)}/{len(rows)}", "mismatches": list(mismatches.values()),
        "changed_between_rounds": {n: sorted(ids) for n, ids in unstable.items()},
    }
    print(json.dumps(result, indent=1, ensure_ascii=False))
    return 1 if mismatches or any(unstable.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
