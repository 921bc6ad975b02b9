"""Estimate the memory of one complete training step before anything is allocated.

The model is built on PyTorch's `meta` device from its config (no weights, no memory) and the
card's method is applied to it, so parameter counts, trainable sets and dtypes are exact for any
architecture. The activation term counts, per decoder layer and per token, the tensors autograd keeps
for the backward pass of the block's architecture (`labkit.preflight.activations.ARCHITECTURES`): a Llama-style
block (Llama, Llama 3, Mistral, Qwen2, Gemma: RMSNorm, rotary attention through SDPA, gated MLP; Qwen3's adds a norm
on each head's query and key; Gemma 2's and Gemma 3's a norm after attention and after the MLP, Gemma 2's softcapped
eager attention, Gemma 3's query and key norms; SmolLM3, Granite, Seed-OSS and ERNIE 4.5 as Llama's, Arcee's with an
ungated ReLU² MLP; Phi-3's (and GLM-4's) fused
gate_up_proj, GLM-4-0414's with Gemma 2's four norms; OLMo 2's and EXAONE 4's norms after each sublayer; Cohere's
one float32 LayerNorm feeding attention and the MLP in parallel; StableLM's LayerNorms and concatenating partial
rotary; Starcoder2's LayerNorms and ungated GELU MLP), or Phi's (one LayerNorm, attention and a GELU MLP
in parallel, partial rotary), with the dropout the config sets (a mask per dropped tensor). Any other architecture
is not modelled: the estimate says so (`modelled: false`, `note`) and stage 03 shows the measurement alone; the
loss term follows the loss implementation the trainer uses: TRL's chunked "fused" LM head on CUDA, and on the CPU
labkit's head over the positions that carry a loss (`labkit.train.loss_head`). Each term is explained in the
notebook of stage 03 and checked against a measurement there and in `bench/memory.py`.

Preference trainers (train.trainer dpo/orpo) run the chosen and the rejected sequence of each pair in
one forward, so a micro-batch of b pairs is 2b rows. DPO adds a reference forward without gradients
(adapter off) after the policy's; ORPO has no fused head: it builds the full logits and a log-softmax
of the chosen half, and their gradients.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from labkit.card.schema import OPTIMIZERS, Card
from labkit.core.device import DeviceProfile, device_kind
from labkit.errors import ModelSourceError
from labkit.model.loading import causal_lm_refusal, decisions, pick_dtype
from labkit.model.method import apply_method, towers
from labkit.model.placement import decide, for_architecture
from labkit.preflight.activations import activation_units, architecture, eager_transient_bytes, text_config
from labkit.preflight.activations import window_share
from labkit.preflight.records import ACTIVATIONS_CHECKPOINTED, ACTIVATIONS_PLAIN, BREAKDOWN, OPTIMIZER_STATES_PREFIX
from labkit.preflight.records import UPCAST_PREFIX, MemoryEstimate

GIB = 1024**3
TOKEN_TILE = 4096  # trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE (TRL 1.16)
VOCAB_TILE = 32768  # trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE (TRL 1.16)
# Live tile-sized buffers while TRL's fused head folds one tile, counted from its code paths:
# Triton (CUDA) works in place on the one projection tile; the torch fallback (CPU: the DPO trainer's
# head there) holds the tile and its elementwise temporaries (z, exp, masks; the gradient formula).
TILES = {"triton": (1.0, 1.0), "torch": (4.25, 8.25)}
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "uint8": 1, "int8": 1}


@dataclass
class Shape:
    """What the estimate needs to know of a decoder-only model (read from its config)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    attention_dropout: float = 0.0  # dropout on the attention probabilities in training (Seed-OSS: 0.1)
    residual_dropout: float = 0.0  # dropout on each sublayer's output before its residual (Phi-2, Seed-OSS: 0.1)
    mlp_dropout: float = 0.0  # dropout on the MLP's output alone (StableLM's hidden_dropout)
    embedding_dropout: float = 0.0  # dropout on the embeddings, once per token (Starcoder2; Phi's embd_pdrop)

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def q(self) -> int:
        """The width of the queries and of the attention output (hidden size, unless head_dim says otherwise: Qwen3,
        Mistral NeMo)."""
        return self.heads * self.head_dim


def weight_dtype(card: Card, device: str | DeviceProfile) -> str:
    """The dtype name the card's weights load in on `device` (a device string of this machine, or a profile)."""
    if isinstance(device, DeviceProfile):
        return decide(card, device, world_size=1, kernels={}).weight_dtype
    return str(pick_dtype(card, device)).replace("torch.", "")


def shape_of(config: Any) -> Shape:
    """Read the layer count and widths from a transformers config (text part of multimodal ones)."""
    c = text_config(config)
    heads, model_type = c.num_attention_heads, getattr(c, "model_type", "")
    return Shape(layers=c.num_hidden_layers, hidden=c.hidden_size, intermediate=getattr(c, "intermediate_size", 4 * c.hidden_size),
                 heads=heads, kv_heads=getattr(c, "num_key_value_heads", None) or heads,
                 head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads, vocab=c.vocab_size,
                 attention_dropout=float(getattr(c, "attention_dropout", 0.0) or 0.0),
                 residual_dropout=float(getattr(c, "resid_pdrop", 0.0) or getattr(c, "residual_dropout", 0.0) or 0.0),
                 mlp_dropout=float(getattr(c, "hidden_dropout", 0.0) or 0.0) if model_type == "stablelm" else 0.0,
                 # Starcoder2's, and Phi's embd_pdrop (Phi-3's config has one that transformers never applies)
                 embedding_dropout=float(getattr(c, "embedding_dropout", 0.0) or 0.0) or (
                     float(getattr(c, "embd_pdrop", 0.0) or 0.0) if model_type == "phi" else 0.0))


def meta_model(config: Any, card: Card) -> Any:
    """The card's model with its method applied, on the meta device (no memory is allocated).

    Args:
        config: the base model's transformers config.
        card: the card (method, trust_remote_code).
    Returns:
        the (PEFT-wrapped for lora/qlora) model whose parameters live on `meta`.
    Raises:
        ModelSourceError: a config transformers cannot build as a causal LM (`causal_lm_refusal`).
    """
    refusal = causal_lm_refusal(config)
    if refusal:
        raise ModelSourceError(f"model.source {card.model.source}: {refusal}")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=card.model.trust_remote_code)
    return apply_method(model, card, meta=True)


def _quantised_names(model: Any) -> set[str]:
    """Linear weights bitsandbytes would store in 4 bits (every Linear except the output head)."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = set()
    for name, module in model.named_modules():
        if type(module).__name__ == "Linear" and module is not out and ".lora_" not in name and "modules_to_save" not in name:
            names.add(f"{name}.weight")
    return names


def parameter_bytes(model: Any, card: Card, dtype_bytes: int) -> dict[str, Any]:
    """Weights by storage, trainable count and adapted linears of a meta model.

    Args:
        model: from `meta_model`.
        card: the card (qlora quantisation settings).
        dtype_bytes: bytes per weight of the loaded dtype.
    Returns:
        {"frozen_bytes", "quantised_bytes", "trainable", "trainable_bytes", "adapted" (the text decoder's adapted or
         fully trained linears), "head_trainable", "norms_trainable", "tokens_trained" (peft's trainable ChatML rows,
         `labkit.model.method.trainable_tokens`), "experts" (an MoE's frozen fused experts: {"parameters", "bytes",
         "adapted" (LoRA on them)})}.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    quantised = _quantised_names(base) if card.method.kind == "qlora" else set()
    outside = towers(base)  # a vision tower's adapters cost weights and states, not text activations
    q = getattr(card.method, "quantisation", None)
    frozen_all = frozen_norms = quant = trainable = trainable_bytes = experts = expert_bytes = 0
    adapted: set[str] = set()
    norms_trainable = head_trainable = tokens_trained = False
    for name, param in model.named_parameters():
        short = name.replace("base_model.model.", "").replace(".base_layer", "")
        if param.requires_grad:
            trainable += param.numel()
            tokens_trained = tokens_trained or "trainable_tokens_delta" in short
            # PEFT keeps adapters in fp32; fully trained weights (and saved modules) keep the loaded dtype
            fp32 = "lora_" in short or card.method.kind == "qlora"
            trainable_bytes += param.numel() * (4 if fp32 else dtype_bytes)
            text = id(param) not in outside
            if "lora_A" in short and text:
                adapted.add(short.split(".lora_A")[0].rsplit(".", 1)[-1])
            elif "norm" in short:
                norms_trainable = True
            elif "lm_head" in short or "embed" in short:
                head_trainable = True
            if card.method.kind == "full" and param.dim() == 2 and "embed" not in short and text:
                adapted.add(short.rsplit(".", 2)[-2])
        elif short in quantised:
            n = param.numel()
            # 4-bit codes (2 per byte) + one absmax per 64 values (uint8 + fp32 per 256 blocks when double-quantised)
            quant += n // 2 + (n // 64 + 4 * math.ceil(n / 64 / 256) if q.double_quant else 4 * (n // 64))
        else:
            # k-bit preparation upcasts to float32: everything (upcast all, PEFT's) or the norms only (upcast norms)
            qlora = card.method.kind == "qlora"
            frozen_all += param.numel() * (4 if qlora else dtype_bytes)
            frozen_norms += param.numel() * (4 if qlora and "norm" in short else dtype_bytes)
            if ".experts." in short and param.dim() == 3:  # an MoE's fused experts: never 4-bit (not Linear layers)
                experts += param.numel()
                expert_bytes += param.numel() * (4 if qlora and (q is None or q.upcast != "norms") else dtype_bytes)
    frozen = frozen_norms if q is not None and q.upcast == "norms" else frozen_all
    return {"frozen_bytes": frozen, "frozen_bytes_upcast": {"all": frozen_all, "norms": frozen_norms},
            "quantised_bytes": quant, "trainable": trainable, "trainable_bytes": trainable_bytes,
            "adapted": sorted(adapted), "head_trainable": head_trainable, "norms_trainable": norms_trainable,
            "tokens_trained": tokens_trained, "experts": {"parameters": experts, "bytes": expert_bytes, "adapted": any(
                type(m).__name__ == "ParamWrapper" and m.get_param().dim() == 3 for m in model.modules())}}


def optimiser_bytes(params: dict[str, Any], optimizer: str) -> float:
    """Optimiser state of the trainable parameters: torch's AdamW keeps two moments in the parameter's dtype,
    bitsandbytes' 8-bit variants one byte each (paged ones can spill to CPU memory under pressure)."""
    per = OPTIMIZERS[optimizer][0]
    return params["trainable_bytes"] * 2 if per == 8.0 else params["trainable"] * per


def attention_for(card: Card, device: str | DeviceProfile, model_type: str) -> tuple[str, bool, bool]:
    """The attn_implementation the model trains with on `device` (`labkit.model.placement.decide` and
    `for_architecture`: Phi in float16 gets eager attention with float32 scores), whether it computes in float32
    (float32 weights, fp32 precision, no 16-bit compute dtype), and whether the step runs under autocast with 16-bit
    weights (bf16 / fp16 training of a 16-bit base: `activation_units`' `autocast`)."""
    made = decide(card, device, world_size=1, kernels={}) if isinstance(device, DeviceProfile) else decisions(card, device)
    made = for_architecture(made, card, model_type)
    return made.attention, (made.weight_dtype == "float32" and made.precision == "fp32"
                            and made.compute_dtype in (None, "float32")), (
        made.precision in ("bf16", "fp16") and made.weight_dtype in ("bfloat16", "float16"))


def estimate_step(config: Any, card: Card, seq_len: int, micro_batch: int | None = None, device: str = "cpu",
                  checkpointing: bool | None = None, optimizer: str | None = None, padded: bool = True,
                  params: dict[str, Any] | None = None, loss_fraction: float = 1.0) -> MemoryEstimate:
    """Estimate the peak memory of one complete training step (forward, loss, backward, optimiser update).

    Args:
        config: the base model's transformers config (nothing is loaded).
        card: the card (method, train.micro_batch, train.optimizer, train.gradient_checkpointing, model.dtype).
        seq_len: tokens per row.
        micro_batch: examples per step (default: the card's); a preference pair is two rows.
        device: "cuda" (Triton loss kernels, bf16 when supported) or "cpu".
        checkpointing: activation checkpointing (default: the card's).
        optimizer: one of OPTIMIZERS (default: the card's).
        padded: whether the batch carries padding.
        params: `parameter_bytes` of the card's meta model, when already computed (it does not depend on the batch).
        loss_fraction: the share of positions that carry a loss (completion tokens / tokens, from the data; 1.0 is
            the upper bound). On the CPU the loss head's logits cover only those positions.
    Returns:
        {"breakdown": {term id: bytes} (`labkit.preflight.records.BREAKDOWN`), "peak_bytes", "step_bytes" (peak above
         the loaded weights), "phases" ({phase id: bytes}), "phase_terms" ({phase id: {term id: bytes}}, each
         phase's sum), "alternatives",
         "architecture", "modelled", "note", ...}. With `modelled` false the activation terms are a Llama-shaped
        stand-in that no caller may show as an estimate (`note` says so).
    """
    b = micro_batch or card.train.micro_batch
    ckpt = card.train.gradient_checkpointing if checkpointing is None else checkpointing
    optim = optimizer or card.train.optimizer
    shape = shape_of(config)
    dtype = weight_dtype(card, device)
    kind = device_kind(device)
    act_bytes = _BYTES[dtype] if card.method.kind != "qlora" else 4
    params = params or parameter_bytes(meta_model(config, card), card, _BYTES[dtype])
    rows = b * (1 if card.train.trainer == "sft" else 2)  # dpo/orpo: chosen and rejected rows in one forward
    tokens = rows * seq_len
    arch = architecture(config)
    attention, float32, autocast = attention_for(card, device, arch["model_type"])
    text = text_config(config)
    softcap = bool(getattr(text, "final_logit_softcapping", None))  # TRL's fused head caps inside its tiles
    per_layer = activation_units(shape, card, params, seq_len, padded, arch["block"] or "llama", attention, act_bytes,
                                 float32, autocast=autocast and act_bytes == 2, cuda=kind == "cuda",
                                 masked=window_share(text, seq_len))
    layer_bytes = sum(per_layer.values()) * act_bytes * tokens
    transient = eager_transient_bytes(shape, attention, rows, seq_len, cuda=kind == "cuda")
    # with checkpointing each layer keeps only its input; in the backward one layer at a time is recomputed
    saved_plain, saved_ckpt = shape.layers * layer_bytes, shape.layers * shape.hidden * act_bytes * tokens
    saved = saved_ckpt if ckpt else saved_plain
    n = rows * (seq_len - 1)
    head_saved = 2 * tokens * shape.hidden * act_bytes  # final norm input and the flattened hidden states
    if shape.embedding_dropout > 0:  # also kept outside the layers: the embeddings' dropout mask (Starcoder2's, Phi's),
        # 1 byte a value on CUDA, the scaled noise on the CPU
        head_saved += tokens * shape.hidden * (1 if kind == "cuda" else act_bytes)
    grad_hidden = n * shape.hidden * 4  # the head's fp32 gradient of the hidden states
    if card.train.trainer == "sft" and kind != "cuda":
        # labkit's head (CPU): logits of the scored positions (+ their fp32 copy), log-softmax kept for the backward
        logits = math.ceil(n * min(max(loss_fraction, 0.0), 1.0)) * shape.vocab
        copy = 0 if act_bytes == 4 else 4 * logits
        head_fwd = logits * act_bytes + copy + 4 * logits
        head_bwd = 3 * 4 * logits + (logits * act_bytes if copy else 0)  # log-softmax, its incoming and outgoing grads
        if softcap:  # the model's forward caps the logits (Gemma 2): the tanh keeps its output for the backward
            head_fwd, head_bwd = head_fwd + logits * act_bytes, head_bwd + logits * act_bytes
    else:  # TRL's chunked fused head: tile-sized buffers, never the logits
        tile = min(n, TOKEN_TILE) * min(shape.vocab, VOCAB_TILE) * act_bytes
        fwd_tiles, bwd_tiles = TILES["triton" if kind == "cuda" else "torch"]
        head_fwd, head_bwd = fwd_tiles * tile, bwd_tiles * tile
    head_grad = shape.vocab * shape.hidden * 4 if params["head_trainable"] else 0
    grads = params["trainable_bytes"]
    opt_states = optimiser_bytes(params, optim)
    activations = saved + head_saved
    if params.get("tokens_trained"):
        # peft's trainable tokens merge their rows into a copy of the embedding and of the LM head matrix on every
        # forward (kept for the backward), and the embedding's copy gets a dense fp32 gradient
        activations += 2 * shape.vocab * shape.hidden * _BYTES[dtype]
        head_grad += shape.vocab * shape.hidden * 4
    head_bwd += grad_hidden + head_grad
    if card.train.trainer == "orpo":
        # TRL's ORPO: the full logits of both halves, the chosen half's contiguous copy and log-softmax (its NLL term);
        # in the backward the logits' gradient and one temporary of the same size
        logits = tokens * shape.vocab * act_bytes
        head_fwd, head_bwd = 2 * logits, 1.5 * logits + 2 * logits + grad_hidden + head_grad
        if softcap:  # as in the CPU's head above, over every position (not measured for ORPO)
            head_fwd, head_bwd = head_fwd + logits, head_bwd + logits
    # each phase's terms (`labkit.preflight.records.PHASE_TERMS`): the largest phase, the optimiser states and the
    # weights add up to the peak
    parts = {"end_of_forward": {"activations": activations, **({"loss_head_forward": head_fwd} if head_fwd >= transient
                                                               else {"layer_transient": transient})},
             "start_of_backward": {"activations": activations, "loss_head_backward": head_bwd, "layer_transient": transient},
             "optimizer_update": {"gradients": grads}}
    if card.train.trainer == "dpo":  # the reference forward (no gradients) while the policy's activations are kept
        parts["reference_forward"] = {"activations": activations, "loss_head_forward": head_fwd,
                                      "reference_layer": layer_bytes}
    if ckpt:
        parts["recomputed_layer_backward"] = {"activations": activations, "recomputed_layer": layer_bytes,
                                              "head_gradients": grad_hidden + head_grad, "layer_transient": transient}
    phases = {phase: sum(terms.values()) for phase, terms in parts.items()}
    step = opt_states + max(phases.values())
    weights = params["frozen_bytes"] + params["quantised_bytes"] + params["trainable_bytes"]
    breakdown = dict(zip(BREAKDOWN, (params["frozen_bytes"], params["quantised_bytes"], params["trainable_bytes"],
                                     grads, opt_states, activations, max(head_fwd, head_bwd))))
    alternatives = {OPTIMIZER_STATES_PREFIX + name: optimiser_bytes(params, name) for name in OPTIMIZERS}
    if card.method.kind == "qlora":  # what method.quantisation.upcast costs: all (PEFT's) vs norms only
        alternatives.update({UPCAST_PREFIX + name: value for name, value in params["frozen_bytes_upcast"].items()})
    alternatives[ACTIVATIONS_PLAIN] = saved_plain + head_saved
    alternatives[ACTIVATIONS_CHECKPOINTED] = saved_ckpt + head_saved + layer_bytes
    return {"architecture": arch["model_type"], "modelled": arch["modelled"], "note": arch["note"],
            "seq_len": seq_len, "micro_batch": b, "checkpointing": ckpt, "attention": attention, "optimizer": optim, "device": kind,
            "loss_fraction": loss_fraction, "alternatives": alternatives,
            "dtype": dtype, "shape": asdict(shape), "trainable": params["trainable"], "adapted": params["adapted"],
            "activation_units_per_token_layer": per_layer, "activations_per_layer_bytes": layer_bytes,
            "breakdown": breakdown, "phases": phases, "phase_terms": parts, "weights_bytes": weights, "step_bytes": step,
            "peak_bytes": weights + step,
            "trainer": card.train.trainer, "rows": rows, "unfused_logits_bytes": 3 * tokens * shape.vocab * 4,
            "experts": params["experts"]}


def estimate_generation(config: Any, card: Card, prompt_len: int, device: str = "cpu",
                        weights_bytes: float | None = None) -> dict[str, Any]:
    """Memory of the evaluation-time generation: weights, KV cache at the eval batch size, last-position logits.

    Args:
        config: the base model's config.
        card: the card (eval.batch_size, eval.max_new_tokens).
        prompt_len: the longest prompt in tokens.
        device: target device.
        weights_bytes: loaded weights (from `estimate_step`), when known.
    Returns:
        {"kv_cache_bytes", "logits_bytes", "prefill_bytes", "peak_bytes", ...}.
    """
    shape = shape_of(config)
    b = card.eval.batch_size
    nbytes = _BYTES[weight_dtype(card, device)]
    total = prompt_len + card.eval.max_new_tokens
    kv_cache = 2 * shape.layers * shape.kv * total * b * nbytes
    logits = b * shape.vocab * 4 * 2  # last-position logits and their fp32 processing copy
    prefill = b * prompt_len * (2 * shape.hidden + 2 * shape.intermediate) * nbytes  # one layer's transient at a time
    return {"eval_batch": b, "tokens": total, "kv_cache_bytes": kv_cache, "logits_bytes": logits,
            "prefill_bytes": prefill, "peak_bytes": (weights_bytes or 0) + kv_cache + logits + prefill}
