"""The models and cards of the GPU check: tiny:phi, tiny:mistral and a random Llama 3.2-1B-shaped model, all offline.

The Llama is built from a config on the fly (random weights, no hub): on a GPU the shape of Llama 3.2 1B (16 layers,
hidden 2048, 32 heads over 8 key/value heads, tied embeddings, rope θ 500,000, a 128,256-row vocabulary: about 1.24B
parameters); in the CPU dry run the same structure made small (2 layers, hidden 128, 4 heads over 1, 4,096 rows).
Its tokenizer is tiny:llama3's (600 tokens): the rows past it are never seen in the data, as in tiny:llama3, and are
zeroed so that a greedy answer is made of the tokenizer's tokens, but the loss head and the memory it needs are those
of the real vocabulary.

Every arm trains the classic QLoRA recipe of the DialogSum cards (params/examples/dialogsum-*.yaml) on labkit's
built-in dialogues: NF4 with double quantisation, r 16 on all linear layers (dropout: `LORA_DROPOUT`),
`paged_adamw_8bit`, a plain prompt (the base models have no chat template), ROUGE with stemming.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0,
                max_position_embeddings=8192, rms_norm_eps=1e-5)
# head_dim 32: bitsandbytes' CPU 4-bit kernels need output features divisible by 32 (k_proj, v_proj: one head)
# and a 4,096-row vocabulary: the 128,256 rows' LM head makes a CPU step take tens of seconds on 2 cores
LLAMA_SMALL = {**LLAMA_1B, "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 4096}
# the DialogSum cards' LoRA dropout (stage 03's comparison arms run with dropout off: labkit.preflight.arms.no_dropout)
LORA_DROPOUT = 0.05
# the dtypes a precision name sets: model.dtype, train.precision, method.quantisation.compute_dtype
PRECISIONS = {"bf16": ("bfloat16", "bf16", "bfloat16"), "fp16": ("float16", "fp16", "float16"),
              "fp32": ("float32", "fp32", "float32")}


@dataclass
class Arm:
    """One training configuration of the check.

    Attributes:
        name: the arm's name in the JSON.
        model: "phi", "mistral" or "llama".
        precision: "bf16", "fp16" or "fp32".
        checkpointing: activation checkpointing.
        seq_len: tokens per row of the memory and speed measurement.
        micro_batch: rows per micro-batch.
        stage03: run stage 03's update, accumulation and checkpointing checks on it.
        memory_target: the estimate must be within 10 % of `max_memory_allocated` (and the fit verdict cover
            `max_memory_reserved`) on this arm; tiny models' steps are a few MiB, below what fixed allocations
            (cuBLAS workspaces, the allocator's 2 MiB blocks) let an estimate resolve, so they report only.
    """

    name: str
    model: str
    precision: str
    checkpointing: bool
    seq_len: int
    micro_batch: int
    stage03: bool = True
    memory_target: bool = False
    quantised: bool = True


def arms(cuda: bool) -> tuple[list[Arm], list[dict[str, str]]]:
    """The training arms on this device, and what is skipped here with the reason.

    On a GPU: both tiny models in bf16 and forced fp16, the 1B Llama in bf16 with and without activation
    checkpointing and in fp16, all QLoRA. On the CPU: the same list, float32 in place of bf16 (labkit refuses bf16 and
    fp16 training precision on the CPU), the fp16 arms skipped and named, and LoRA on the float32 base in place of
    QLoRA (named too): bitsandbytes' CPU 4-bit layers dequantise on every call (a step of tiny:phi takes seconds) and
    compute below float32 precision (stage 03's accumulation check, at the float32 tolerance 1e-4, then differs by
    2–3e-3 on every model). The CPU dry run still loads, trains, generates and exports in 4 bits
    (`labkit.model.loading`, the generation and export parts).

    Args:
        cuda: whether a CUDA GPU runs the check.
    Returns:
        (arms to run, [{"arm", "reason"}] skipped or changed on this device).
    """
    # every measured row holds the end of an example (a completion) only if it is at least data.max_length (384) long
    tiny_len, big_len, big_mb = (512, 1024, 4) if cuda else (384, 384, 2)
    wide = "bf16" if cuda else "fp32"
    listed = [Arm(f"phi-{wide}", "phi", wide, True, tiny_len, 4 if cuda else 2),
              Arm("phi-fp16", "phi", "fp16", True, tiny_len, 4 if cuda else 2),
              Arm(f"mistral-{wide}", "mistral", wide, True, tiny_len, 4 if cuda else 2),
              Arm("mistral-fp16", "mistral", "fp16", True, tiny_len, 4 if cuda else 2),
              Arm(f"llama-{wide}-checkpointing", "llama", wide, True, big_len, big_mb, memory_target=cuda),
              Arm(f"llama-{wide}-plain", "llama", wide, False, big_len, big_mb, stage03=False, memory_target=cuda),
              Arm("llama-fp16-checkpointing", "llama", "fp16", True, big_len, big_mb, memory_target=cuda)]
    if cuda:
        return listed, []
    skipped = [{"arm": a.name, "reason": "fp16 training: labkit refuses fp16 (and bf16) precision on the CPU; "
                "runs on a GPU"} for a in listed if a.precision == "fp16"]
    kept = [a for a in listed if a.precision != "fp16"]
    for a in kept:
        a.quantised = False
    skipped.append({"arm": "every training arm", "reason": "LoRA on the float32 base in place of QLoRA on the CPU "
                    "(bitsandbytes' CPU 4-bit layers: slow and below float32 precision); 4 bits run in the generation "
                    "and export parts"})
    return kept, skipped


def build_llama(folder: Path, cuda: bool) -> dict[str, Any]:
    """Build the random Llama (1B on a GPU, small on the CPU) with tiny:llama3's tokenizer into `folder`.

    The weights are initialised on the GPU when there is one (seconds instead of a minute of CPU time) and saved
    in bfloat16, the dtype a hub checkpoint of it would have.

    Args:
        folder: where to save it (a local model source for `labkit.model.sources.resolve`).
        cuda: build the 1B shape on the GPU (else the small shape on the CPU).
    Returns:
        {"folder", "parameters", "config"}.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from labkit.model.sources import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve("tiny:llama3").location)
    shape = LLAMA_1B if cuda else LLAMA_SMALL
    config = LlamaConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **shape)
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():  # rows past the tokenizer score 0 (tied head): greedy answers stay decodable text
        model.get_input_embeddings().weight[len(tokenizer):] = 0
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    count = sum(p.numel() for p in model.parameters())
    del model
    if cuda:
        torch.cuda.empty_cache()
    return {"folder": str(folder), "parameters": count, "config": {k: shape[k] for k in sorted(shape)}}


def sources(llama_folder: Path) -> dict[str, str]:
    """The model source of each model name."""
    return {"phi": "tiny:phi", "mistral": "tiny:mistral", "llama": str(llama_folder)}


def card_data(source: str, precision: str, checkpointing: bool, micro_batch: int, max_length: int = 384,
              variant: str = "arm", quantised: bool = True, short: bool = False) -> dict[str, Any]:
    """The DialogSum recipe on built-in dialogues, as card data (see the module docstring).

    Args:
        source: the model source.
        precision: "bf16", "fp16" or "fp32" (`PRECISIONS`).
        checkpointing: train.gradient_checkpointing.
        micro_batch: train.micro_batch (grad_accum 2, so the accumulation check has two micro-batches).
        max_length: data.max_length (the dialogues are 164–369 tokens with the tiny tokenizers).
        variant: experiment.variant.
        quantised: method qlora (else lora, the same adapter on the unquantised base).
        short: a short run for the CPU dry run's export: 30 dialogues, 2 steps of 2 rows without accumulation.
    Returns:
        the card as a dict (YAML-ready).
    """
    weights, train_precision, compute = PRECISIONS[precision]
    method = {"kind": "qlora" if quantised else "lora", "r": 16, "alpha": 32, "dropout": LORA_DROPOUT,
              "target_modules": "all-linear"}
    if quantised:
        method["quantisation"] = {"type": "nf4", "double_quant": True, "compute_dtype": compute}
    return {
        "experiment": {"id": "gpu-check", "variant": variant,
                       "hypothesis": "A plumbing check of labkit on this device, random model (no research claim).",
                       "target": {"behaviour": "summarisation", "primary_metric": "rougeL", "min_improvement": 0.05},
                       "guardrails": [{"metric": "mean_length_ratio", "max": 1.5}]},
        "data": {"source": {"builtin": "dialogues", "rows": 30 if short else 60, "seed": 7},
                 "fields": {"input": "dialogue", "target": "summary", "category": "topic", "id": "id"},
                 "target_format": {"kind": "text"},
                 "cleaning": ["strip", "drop_empty", {"drop_longer_than_tokens": max_length}],
                 "split": {"validation": 0.2, "test": 0.15, "seed": 13},
                 "leakage": {"near_duplicate_threshold": 0.85, "policy": "drop_from_train"},
                 "prompt": {"format": "plain", "system": "Summarise the dialogue in one or two sentences.",
                            "instruction": "{input}"},
                 "max_length": max_length},
        "model": {"source": source, "dtype": weights},
        "method": method,
        "train": {"trainer": "sft", "seed": 42, "max_steps": 2 if short else 8, "micro_batch": micro_batch,
                  "grad_accum": 1 if short else 2, **({"eval_steps": 2, "save_steps": 2} if short else {}),
                  "lr": 2.0e-4, "scheduler": "constant", "warmup_ratio": 0.0, "optimizer": "paged_adamw_8bit",
                  "gradient_checkpointing": checkpointing, "precision": train_precision, "logging_steps": 1},
        "eval": {"split": "validation", "batch_size": 8, "max_new_tokens": 24, "decoding": "greedy",
                 "rouge": {"use_stemmer": True}},
        "budget": {"max_minutes": 10, "price_per_gpu_hour": 0.0},
    }


def write_card(data: dict[str, Any], folder: Path | None = None) -> Any:
    """Write card data as YAML and load it as labkit loads a card.

    Args:
        data: from `card_data`.
        folder: where to write card.yaml (default: a new temporary folder).
    Returns:
        the `labkit.card.load.LoadedCard`.
    """
    from labkit.card.load import load_card

    folder = folder or Path(tempfile.mkdtemp(prefix="labkit-gpu-check-card-"))
    path = folder / f"{data['experiment']['variant']}.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps(data)), sort_keys=False), encoding="utf-8")
    return load_card(path)
