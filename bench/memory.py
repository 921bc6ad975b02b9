"""Benchmark: labkit's memory estimate of a complete training step against the measured peak.

For full fine-tuning, LoRA (r=16, all linear layers) and QLoRA (NF4, double quantisation) at two
sequence lengths on the quickstart model (SmolLM2-135M-Instruct, converted from its PyPI package)
at micro-batch 4: the estimate (computed on the meta device, before anything is allocated), the
measured peak of two real steps of the stage-04 trainer (each configuration in a fresh process, so
its baseline is clean) and the estimate's relative error. On the CPU the measurement is the peak
resident memory above the pre-step baseline; on CUDA `torch.cuda.max_memory_allocated`.

With `--random ARCH` the model is a random one of that architecture instead (hidden size 512, 4 layers, MLP 2048,
8 heads of 64, 4 KV heads, a 32,000-token vocabulary; the tokenizer of `tiny:gemma2`): llama, gemma, gemma2 (eager
attention, softcapped scores and logits), gemma3 (a 128-token sliding window on 5 of every 6 layers), phi3 (fused
qkv_proj and gate_up_proj, partial rotary 0.75), olmo2 (norms after each sublayer, on the whole query and key),
olmo3 (OLMo 2's block, a 128-token sliding window on 3 of every 4 layers), exaone4 (OLMo 2's norms but on each
head's query and key, a 128-token window on 3 of every 4 layers, the fourth without rotary), phi (Phi-2's parallel
block: one LayerNorm, partial rotary 0.5, a GELU MLP), cohere (Command R's parallel block: one LayerNorm written out in
float32, a SwiGLU MLP), cohere2 (Cohere's block, a 128-token window on 3 of every 4 layers, the fourth without
rotary), glm (GLM-4-9B-chat's: fused gate_up_proj, separate q/k/v with biases, half of each head rotated and
concatenated), glm4 (GLM-4-0414's: GLM's with a norm after attention and after the MLP), phi2 (phi with Phi-2's
residual dropout 0.1), seed_oss (Llama's block dropping the attention probabilities and each sublayer's output at
0.1, Seed-OSS's defaults), stablelm (StableLM 2's: LayerNorms, a quarter of each head rotated and concatenated),
stablelm_parallel_qk (StableLM 2 12B's: attention and the MLP in parallel, a LayerNorm on each head's query and key)
starcoder2 (LayerNorms, an ungated GELU MLP, dropout 0.1 on the embeddings, attention and each sublayer's output),
arcee (Llama's attention, an ungated ReLU² MLP), ernie4_5 (Llama's block, its rotary in float32), ministral3 (Ministral
3's text decoder: Llama's block), helium (Gemma's block) or hunyuan_v1_dense (Qwen3's block, its query and key norms
after the rotary).

Prints one JSON object. Run: .venv/bin/python bench/memory.py [--lengths 128 512] [--methods full lora qlora]
[--attention eager] [--random gemma2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CARD = REPO / "params" / "quickstart.yaml"


RANDOM = {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 8,
          "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32000, "max_position_embeddings": 4096}
RANDOM_CLASSES = {"llama": ("LlamaConfig", {}), "gemma": ("GemmaConfig", {}),
                  "gemma2": ("Gemma2Config", {"sliding_window": 128}),
                  "gemma3": ("Gemma3TextConfig", {"sliding_window": 128}),
                  "phi3": ("Phi3Config", {"partial_rotary_factor": 0.75}), "olmo2": ("Olmo2Config", {}),
                  "olmo3": ("Olmo3Config", {"sliding_window": 128}),
                  "exaone4": ("Exaone4Config", {"sliding_window": 128}),
                  "phi": ("PhiConfig", {"partial_rotary_factor": 0.5}), "cohere": ("CohereConfig", {}),
                  "cohere2": ("Cohere2Config", {"sliding_window": 128}), "glm": ("GlmConfig", {}),
                  "glm4": ("Glm4Config", {}),
                  # dropout in the model's config: Phi-2's residual dropout, Seed-OSS's residual and attention dropout
                  "phi2": ("PhiConfig", {"partial_rotary_factor": 0.5, "resid_pdrop": 0.1}),
                  "seed_oss": ("SeedOssConfig", {}),
                  # LayerNorm blocks: StableLM 2 (a quarter of each head rotated), StableLM 2 12B's parallel block
                  # with query and key LayerNorms, StarCoder2 (ungated GELU MLP) with every dropout at 0.1
                  "stablelm": ("StableLmConfig", {"use_qkv_bias": True}),
                  "stablelm_parallel_qk": ("StableLmConfig", {"use_parallel_residual": True, "qk_layernorm": True}),
                  "starcoder2": ("Starcoder2Config", {"residual_dropout": 0.1, "attention_dropout": 0.1,
                                                     "embedding_dropout": 0.1}),
                  # Llama's attention with AFM-4.5B's ungated ReLU² MLP; ERNIE 4.5's block (its rotary in float32)
                  "arcee": ("ArceeConfig", {}), "ernie4_5": ("Ernie4_5Config", {}),
                  # Llama's block (Ministral 3's text decoder), Gemma's (Helium), Qwen3's (HunYuan dense)
                  "ministral3": ("Ministral3Config", {}), "helium": ("HeliumConfig", {}),
                  "hunyuan_v1_dense": ("HunYuanDenseV1Config", {})}


def random_config(arch: str, tokenizer):
    """The config of `--random ARCH`, with the tokenizer's special ids."""
    import transformers

    name, extra = RANDOM_CLASSES[arch]
    return getattr(transformers, name)(**RANDOM, **extra, bos_token_id=tokenizer.bos_token_id,
                                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)


def one(method: str, seq_len: int, micro_batch: int, attention: str = "auto", arch: str | None = None) -> dict:
    """Estimate and measure one configuration in this process (`arch`: a random model of that architecture)."""
    from labkit.card.load import load_card
    from labkit.card.schema import Full, Lora, Qlora
    from labkit.card.update import updated
    from labkit.data import sources as D
    from labkit.model.loading import load_model, load_tokenizer, pick_device
    from labkit.model.method import apply_method
    from labkit.model.sources import resolve
    from labkit.preflight.measure import loss_fraction
    from labkit.preflight.timing import measure_step
    from labkit.preflight.memory import estimate_step
    from labkit.preflight.memory_check import loaded_bytes

    card = load_card(CARD).card
    if arch:  # the tiny Gemma 2's tokenizer and template (no system role) for every random model
        card = updated(card, {"model.source": "tiny:gemma2", "model.revision": None, "data.prompt.system_in": "user",
                              "data.prompt.chat_template": "model"})
    card = updated(card, {"train.micro_batch": micro_batch, "model.attn_implementation": attention, "data.max_length": max(card.data.max_length, seq_len),
                          "method": {"full": Full(kind="full"), "lora": Lora(kind="lora", r=16, alpha=32, dropout=0.0),
                                     "qlora": Qlora(kind="qlora", r=16, alpha=32, dropout=0.0)}[method]})
    device = pick_device()
    resolved = resolve(card.model.source, card.model.revision, base=CARD.parent)
    from transformers import AutoConfig

    tokenizer = load_tokenizer(resolved, card)
    rows = D.map_fields(card.data, D.load_source(card.data)[0])[:200]
    config = random_config(arch, tokenizer) if arch else AutoConfig.from_pretrained(resolved.location)
    estimate = estimate_step(config, card, seq_len, device=device, loss_fraction=loss_fraction(tokenizer, card, rows))
    if arch:
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=estimate["attention"],
                                                 dtype=getattr(torch, estimate["dtype"])).to(device)
        model = apply_method(model, card)
    else:
        model = apply_method(load_model(resolved, card, device), card)
    weights = loaded_bytes(model)
    result = measure_step(card, model, tokenizer, rows, seq_len, Path(tempfile.mkdtemp()), device=device)
    step = result["memory"]["delta_bytes"]
    return {"method": method, "seq_len": seq_len, "micro_batch": micro_batch, "device": device,
            "attention": estimate["attention"],
            "estimate_step_bytes": estimate["step_bytes"], "measured_step_bytes": step,
            "step_relative_error": round((estimate["step_bytes"] - step) / step, 4),
            "estimate_peak_bytes": estimate["peak_bytes"], "measured_peak_bytes": weights + step,
            "peak_relative_error": round((estimate["peak_bytes"] - weights - step) / (weights + step), 4),
            "measured_by": result["memory"]["method"], "seconds_per_step": round(result["seconds_per_step"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--methods", nargs="+", default=["full", "lora", "qlora"])
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--attention", default="auto", help="model.attn_implementation (eager keeps the scores)")
    parser.add_argument("--random", choices=sorted(RANDOM_CLASSES),
                        help="a random model of this architecture instead of the quickstart's (full and lora)")
    parser.add_argument("--one", nargs=2, metavar=("METHOD", "SEQ_LEN"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.random and "qlora" in args.methods and not args.one:
        parser.error("--random builds its model from a config: no 4-bit weights to load; give --methods full lora")
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.micro_batch, args.attention, args.random)))
        return
    results = []
    for method in args.methods:
        for seq_len in args.lengths:
            out = subprocess.run([sys.executable, __file__, "--one", method, str(seq_len), "--micro-batch", str(args.micro_batch),
                                  "--attention", args.attention, *(["--random", args.random] if args.random else [])],
                                 capture_output=True, text=True, env={**os.environ, "LABKIT_BATCH": "1"})
            if out.returncode:
                raise SystemExit(f"{method} @ {seq_len}: {out.stderr.strip().splitlines()[-1]}")
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"{method:6s} {seq_len:5d}: step estimate {results[-1]['estimate_step_bytes'] / 2**20:8.1f} MiB, "
                  f"measured {results[-1]['measured_step_bytes'] / 2**20:8.1f} MiB "
                  f"({results[-1]['step_relative_error']:+.1%})", file=sys.stderr)
    worst = max(abs(r["step_relative_error"]) for r in results)
    model = f"random {args.random} (hidden 512, 4 layers)" if args.random else "SmolLM2-135M-Instruct (quickstart)"
    print(json.dumps({"benchmark": "memory_estimate_vs_measured", "model": model,
                      "results": results, "max_abs_step_relative_error": worst,
                      "max_abs_peak_relative_error": max(abs(r["peak_relative_error"]) for r in results),
                      "target": 0.15 if results and results[0]["device"] == "cpu" else 0.10}, indent=1))


if __name__ == "__main__":
    main()
