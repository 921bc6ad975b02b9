"""The values autograd keeps per decoder layer and per token for the backward pass, by tensor, for the blocks the
memory estimate models (`ARCHITECTURES`; `architecture` reads a config's) and the attention kernel it trains with.

SDPA (and the flash / flex kernels) keep the rotated queries, the keys and values, the output and one log-sum-exp per
head and position, plus the padding mask. Eager attention keeps the softmax's float32 output and the probabilities
it multiplies with the values: two (heads × sequence length) tensors per token, which at a few thousand tokens
outweigh the rest of the layer. labkit's eager attention with float32 scores (`labkit.model.attention`, Phi in
float16) also keeps float32 copies of the queries and keys. Counted with autograd's saved-tensor hooks on
transformers 5's attention functions, and checked per decoder layer in tests/unit/preflight/test_saved_activations.py
(float32, and bf16 under the CPU's autocast as a stand-in for a GPU's).

Gemma 2 and Gemma 3 norm each sublayer's output too (four RMSNorms a layer, each keeping its input); Gemma 2's eager
attention also keeps the softcapped scores' tanh (one more heads × sequence length tensor); a sliding-window layer
gives SDPA a mask, and with it the repeated keys and values, once the sequence reaches the window. Phi-3 fuses the
query, key and value projections (`qkv_proj`) and the gate and up projections (`gate_up_proj`): the same inputs kept,
fewer adapters; its rotary concatenates, so o_proj reads a copy of the attention's output. OLMo 2 has no norm before
a sublayer: it norms each sublayer's output and the whole query and key projections (one statistic a token each);
OLMo 3 is OLMo 2's block with sliding-window layers; EXAONE 4 norms after each sublayer as OLMo 2 does, but each
head's query and key (one statistic a head, as Qwen3). GLM-4 (`glm`: GLM-4-9B-chat) is Phi-3's block with separate
query, key and value projections; GLM-4-0414 (`glm4`) adds Gemma 2's norms after attention and after the MLP. Cohere
(Command R, Aya Expanse; Cohere 2: Command R7B and A) runs attention and the MLP in parallel on one LayerNorm's
output, as Phi does, but its LayerNorm is written out in float32: it keeps the centred input twice and one statistic
a token; Command R+ also LayerNorms each head's query and key (`use_qk_norm`). Seed-OSS is Llama's block.
StableLM (StableLM 2, StableLM 3B 4E1T) is Llama's block with PyTorch's LayerNorm (its input and two statistics a
token: mean and reciprocal deviation) and a partial rotary that concatenates (o_proj reads a copy); StableLM 2 12B
runs attention and the MLP in parallel on one LayerNorm (`use_parallel_residual`) and LayerNorms each head's query
and key (`qk_layernorm`). Starcoder2 is Llama's attention between LayerNorms with an ungated MLP: c_fc, the tanh
GELU (PyTorch's, which keeps only its input), c_proj. A LayerNorm's weight takes its gradient from what the norm
keeps anyway: full fine-tuning adds nothing there (as Phi's). Arcee (AFM-4.5B) is Llama's block with an ungated MLP:
up_proj, a ReLU (which keeps its output) squared, down_proj. ERNIE 4.5 is Llama's block (its float32 rotary keeps
only each layer's own cos / sin, per position).

Dropout in the model's own config is counted where transformers applies it in training: on each sublayer's output
before its residual (Phi-2's and Phi-3's `resid_pdrop`, Seed-OSS's `residual_dropout`: a mask each, 1 byte a value
on CUDA, the scaled noise in the activations' dtype on the CPU) and on the attention probabilities
(`attention_dropout`: eager attention keeps the dropped probabilities and the mask; CUDA's SDPA kernels drop inside
the kernel and keep nothing more, while the CPU's SDPA runs its math path, which keeps what eager attention keeps);
StableLM's `hidden_dropout` drops the MLP's output alone; Starcoder2's `embedding_dropout` and Phi's `embd_pdrop`
drop the embeddings, once per token (`labkit.preflight.memory`).
"""

from __future__ import annotations

from typing import Any

from labkit.card.schema import Card
from labkit.model.attention import FP32_SCORES

MATH = "math"  # the CPU's SDPA with attention dropout: its math path, which keeps what eager attention keeps
EAGER = ("eager", FP32_SCORES, MATH)  # attentions that keep the probabilities (heads × sequence length a token)
SANDWICH = {"gemma2", "gemma3", "glm4"}  # blocks with four norms a layer (GLM-4-0414's as Gemma 2's)
QK_NORMS = {"qwen3", "gemma3", "exaone4", "cohere_qk"}  # blocks with a norm on each head's query and key
POST_NORMS = {"olmo2", "exaone4"}  # blocks with no norm before a sublayer, each sublayer's output normed instead
PARALLEL = {"cohere", "cohere_qk"}  # blocks whose one LayerNorm (written out in float32) feeds attention and the MLP
# blocks whose norms multiply their weight in float32
FLOAT32_NORM_PRODUCT = {"gemma", "gemma2", "gemma3", "olmo2", *PARALLEL}
QKV = {"q_proj", "k_proj", "v_proj", "qkv_proj"}  # the linears reading the attention's input (Phi-3 fuses them)
# blocks whose rotary concatenates the rotated part with the rest (torch.cat, also at a full rotary): the queries lose
# the layout q_proj gave them, so SDPA's output is not in the layout o_proj reads and its input is a copy
STABLELM = {"stablelm", "stablelm_qk", "stablelm_parallel", "stablelm_parallel_qk"}  # (`architecture`)
CONCATENATED_ROTARY = {"phi3", "glm4", *STABLELM}
# blocks with PyTorch's LayerNorm before each sublayer (its input and two statistics a token); the parallel ones feed
# attention and the MLP from one; the _qk ones also LayerNorm each head's query and key
LAYER_NORM = {"starcoder2", *STABLELM}
LAYER_NORM_PARALLEL = {"stablelm_parallel", "stablelm_parallel_qk"}
LAYER_NORM_QK = {"stablelm_qk", "stablelm_parallel_qk"}
MLP_IN = {"gate_proj", "up_proj", "gate_up_proj", "c_fc"}  # the linears reading the MLP's input (Starcoder2: c_fc)
# blocks with an ungated MLP (one linear in, its activation, one linear out) → the one intermediate-wide tensor the
# activation keeps (Starcoder2's tanh GELU its input, Arcee's ReLU its output, the square's input) and the one the
# linear out reads
UNGATED = {"starcoder2": ("c_fc output (GELU input)", "GELU output (c_proj)"),
           "arcee": ("ReLU output (its square's input)", "ReLU² output (down)")}


def window_share(config: Any, seq_len: int) -> float:
    """The share of decoder layers whose sliding window makes SDPA take a mask at `seq_len` tokens without padding
    (transformers builds one once the sequence reaches the window).

    Args:
        config: the model's (text) config: `sliding_window` and `layer_types` (Gemma 2 and 3), or a window on every
            layer (Mistral's `sliding_window` without layer types).
        seq_len: tokens per row.
    Returns:
        0.0 to 1.0.
    """
    window = getattr(config, "sliding_window", None)
    if not window or seq_len < window:  # (Qwen2's config drops its window unless use_sliding_window)
        return 0.0
    types = getattr(config, "layer_types", None)
    if not types:
        return 1.0
    return sum(t == "sliding_attention" for t in types) / len(types)


def kept_attention(shape: Any, attention: str, cuda: bool) -> str:
    """The attention whose tensors a training step keeps: with attention dropout, the CPU's SDPA runs its math path,
    which keeps what eager attention keeps (the probabilities, their dropped copy and the mask; in float32 under
    autocast); CUDA's fused kernels drop inside the kernel, from a seed, and keep nothing more.

    Args:
        shape: the model widths (`attention_dropout`).
        attention: the attn_implementation the model trains with.
        cuda: the step runs on CUDA.
    Returns:
        MATH for the CPU's SDPA with attention dropout, else `attention`.
    """
    return MATH if attention == "sdpa" and shape.attention_dropout > 0 and not cuda else attention


def attention_units(shape: Any, attention: str, seq_len: int, padded: bool, act_bytes: int,
                    float32: bool = False, masked: float = 0.0, softcapped: bool = False,
                    cuda: bool = False, autocast: bool = False) -> dict[str, float]:
    """Values the attention of one layer keeps per token (in `act_bytes` units).

    Args:
        shape: the model widths (`labkit.preflight.memory.Shape`).
        attention: the attn_implementation ("sdpa", "eager", `FP32_SCORES`, "flash_attention_2", …).
        seq_len: tokens per row (eager keeps a score per key position).
        padded: whether batches carry padding (SDPA repeats the GQA heads and keeps the mask).
        act_bytes: bytes of one activation value.
        float32: the attention computes in float32 (then the probabilities are the softmax's output, not a copy).
        masked: without padding, the share of layers SDPA still gets a mask in (sliding-window layers at a sequence
            as long as the window: `window_share`).
        softcapped: eager attention caps its scores with a tanh (Gemma 2), which keeps its output.
        cuda: the step runs on CUDA (`kept_attention`; the attention dropout's mask is 1 byte a value there).
        autocast: 16-bit activations under autocast (the CPU's SDPA math path then computes in float32).
    Returns:
        {tensor: values per token per layer}.
    """
    q, a, kv = shape.q, shape.heads, shape.kv  # queries and the attention output are heads × head_dim wide
    attention = kept_attention(shape, attention, cuda)
    if attention not in EAGER:
        mask = 1.0 if padded else masked  # with a mask, SDPA gets the GQA heads repeated
        units = {"query after rotary": q, "attention output": q, "attention log-sum-exp": a,
                 "keys, values": 2 * kv + 2 * (q - kv) * mask}
        if mask:
            units["padding mask" if padded else "sliding-window mask"] = seq_len * mask
        return units
    fp32 = 4 / act_bytes
    upcast = fp32 if attention == MATH and autocast else 1  # the math path's queries, keys, values and probabilities
    units = {"attention softmax (float32)": a * seq_len * fp32, "values (heads repeated)": q * upcast}
    if softcapped:
        units["softcapped scores (tanh)"] = a * seq_len  # in the scores' dtype (labkit's float32 eager is Phi's)
    if shape.attention_dropout > 0:
        # the product with the values keeps the dropped probabilities (in place of the cast copy), the dropout its
        # mask: the scaled noise in the probabilities' dtype on the CPU, 1 byte a value on CUDA
        kept = fp32 if float32 else upcast
        units["attention probabilities, dropped"] = a * seq_len * kept
        units["attention dropout mask"] = a * seq_len * (1 / act_bytes if cuda else kept)
    elif not float32:  # cast to the values' dtype for the product with the values: a second copy
        units["attention probabilities"] = a * seq_len
    if attention == FP32_SCORES:
        units["queries, keys (float32 copies)"] = 2 * q * fp32
    else:
        units["queries, keys"] = 2 * q * upcast
    return units


def eager_transient_bytes(shape: Any, attention: str, rows: int, seq_len: int, cuda: bool = False) -> float:
    """The float32 score tensors eager attention builds and frees within one layer (the scores and, in the backward,
    their gradient): what the peak adds on top of the kept activations; 0 for fused kernels.

    Args:
        shape: the model widths.
        attention: the attn_implementation.
        rows: rows in the micro-batch.
        seq_len: tokens per row.
        cuda: the step runs on CUDA (`kept_attention`).
    Returns:
        bytes.
    """
    return 2 * 4 * rows * shape.heads * seq_len * seq_len if kept_attention(shape, attention, cuda) in EAGER else 0.0


def activation_units(shape: Shape, card: Card, params: dict[str, Any], seq_len: int, padded: bool = True,
                     block: str = "llama", attention: str = "sdpa", act_bytes: int = 2,
                     float32: bool = False, autocast: bool = False, cuda: bool = False,
                     masked: float = 0.0) -> dict[str, float]:
    """Values autograd keeps per decoder layer and per token, by tensor (in activation-dtype units).

    Args:
        shape: model widths.
        card: the card (method: rank, dropout).
        params: from `parameter_bytes` (which linears carry adapters or train fully).
        seq_len: sequence length (the padding mask costs one value per key position).
        padded: whether batches carry padding (dynamic padding almost always does).
        block: "llama" (Llama, Mistral, Qwen2), "gemma" (Llama's, its norms multiplying in float32: Gemma, Helium),
            "qwen3" (Llama's with a norm on each head's query and key: Qwen3, HunYuan dense), "gemma2" (Llama's with a
            norm after attention and after the MLP, softcapped eager scores), "gemma3" (Gemma 2's norms and Qwen3's
            query and key norms), "phi3" (Llama's with fused linears, o_proj reading a copy of the attention's output;
            GLM-4's), "glm4" (Phi-3's with Gemma 2's four norms: GLM-4-0414), "olmo2" (OLMo 2 and 3: norms after each
            sublayer and on the whole query and key), "exaone4" (OLMo 2's norms after each sublayer, Qwen3's on each
            head's query and key), "cohere" (one LayerNorm feeding attention and the MLP in parallel), "cohere_qk"
            (Cohere's with a LayerNorm on each head's query and key), "stablelm" (Llama's with LayerNorms and a
            concatenating partial rotary; "_parallel", "_qk": StableLM 2 12B's parallel sublayers, per-head query and
            key LayerNorms), "starcoder2" (LayerNorms, an ungated GELU MLP), "arcee" (Llama's with an ungated
            ReLU² MLP) or "phi" (`architecture`).
        attention: the attn_implementation the model trains with (`attention_units`).
        act_bytes: bytes of one activation value (the unit).
        float32: the attention computes in float32 (`attention_units`).
        autocast: 16-bit activations under autocast (a GPU's bf16 / fp16 training): each RMSNorm keeps a float32 copy
            of its input, and each LoRA adapter (float32, as PEFT keeps it) a 16-bit copy of its own input.
        cuda: the step runs on CUDA, whose fused dropout keeps a 1-byte mask (the CPU's keeps the scaled noise in the
            input's dtype).
        masked: the share of layers with a sliding-window mask at this length (`attention_units`).
    Returns:
        {tensor: values per token per layer}.
    """
    h, i = shape.hidden, shape.intermediate
    attention = kept_attention(shape, attention, cuda)
    adapted = set(params["adapted"])
    method = card.method
    lora = method.kind in {"lora", "qlora"}
    # with dropout, or a float32 adapter under autocast, each adapter keeps its own input (dropped, or cast back to 16
    # bits) and the normed input the adapters share is kept by nothing (the frozen base weights need no input)
    shared = not (lora and (method.dropout > 0 or (autocast and method.kind == "lora")))
    norm = 4 / act_bytes if autocast else 1  # a norm computes (and keeps its input) in float32 under autocast
    if block == "phi":
        # one LayerNorm (input, mean, rstd) feeds attention and the MLP in parallel; the tanh-GELU keeps fc1's output,
        # the tanh, ½x and 1 + tanh (counted with autograd's saved-tensor hooks on transformers 5's PhiDecoderLayer)
        units: dict[str, float] = {"layer input (LayerNorm)": h * norm, "norm statistics": 2 * norm,
                                   "fc1 output, GELU": 4 * i}
        if adapted & {"q_proj", "k_proj", "v_proj", "fc1"} and shared:
            units["normed input (q/k/v, fc1)"] = h
        if "dense" in adapted and shared:
            units["attention output, reshaped (dense)"] = h
        if "fc2" in adapted and shared:
            units["GELU output (fc2)"] = i
    else:
        if block in POST_NORMS:
            # no norm before a sublayer: each sublayer's output is normed before its residual, and the query and key
            # projections are normed whole (one statistic a token each; EXAONE 4: a head each, set below); the
            # adapters read the unnormed inputs
            units = {"attention output (its norm)": h * norm, "MLP output (its norm)": h * norm, "norm scales": 2 * norm,
                     "query, key before their norms": (shape.q + shape.kv) * norm, "query, key norm scales": 2 * norm}
            inputs = ("layer input (q/k/v)", "MLP input (gate/up)")
        elif block in LAYER_NORM:
            # PyTorch's LayerNorm keeps its input and two statistics a token (mean, reciprocal deviation)
            parallel = block in LAYER_NORM_PARALLEL
            units = {"layer input (LayerNorm)": h * norm, "norm statistics": (2 if parallel else 4) * norm}
            if not parallel:
                units["post-attention residual (LayerNorm)"] = h * norm
            inputs = (("normed input (q/k/v, gate/up)",) * 2 if parallel
                      else ("normed input (q/k/v)", "normed input (MLP)"))
            if block in LAYER_NORM_QK:  # a LayerNorm on each head: the projections whole, two statistics a head
                units["query, key before their norms"] = (shape.q + shape.kv) * norm
                units["query, key norm statistics"] = 2 * (shape.heads + shape.kv_heads) * norm
        elif block in PARALLEL:
            # Cohere's LayerNorm in float32: the centred input twice (for the variance and for the product with the
            # scale) and the scale; its one output feeds attention and the MLP in parallel
            units = {"layer input, centred twice (LayerNorm)": 2 * h * norm, "norm scales": norm}
            inputs = ("normed input (q/k/v, gate/up)",) * 2
        else:
            units = {"layer input (norm)": h * norm, "post-attention residual (norm)": h * norm, "norm scales": 2 * norm}
            inputs = ("normed input (q/k/v)", "normed input (gate/up)")
        if block in UNGATED:  # the activation's one kept tensor; the linear out reads its output (below)
            units[UNGATED[block][0]] = i
        else:  # Phi-3's fused gate_up output is the gate and the up: the same 2i and SiLU's i
            units["gate, SiLU, up"] = 3 * i
        if adapted & QKV and shared:
            units[inputs[0]] = h
        if adapted & MLP_IN and shared:
            units[inputs[1]] = h
        if adapted & {"down_proj", "c_proj"} and shared:
            units[UNGATED[block][1] if block in UNGATED else "gated product (down)"] = i
        if (attention in EAGER or block in CONCATENATED_ROTARY) and "o_proj" in adapted and shared:
            units["attention output, contiguous (o_proj)"] = shape.q  # (else o_proj reads the output SDPA keeps)
        if block in SANDWICH:  # Gemma 2 and 3 (GLM-4-0414) also norm the attention's and the MLP's outputs
            units["attention output (its norm)"] = units["MLP output (its norm)"] = h * norm
            units["norm scales"] = 4 * norm
        if block in QK_NORMS:  # a norm of each head's query and key before the rotary: their inputs and scales
            # (Cohere's LayerNorm keeps them centred, twice)
            units["query, key before their norms"] = (shape.q + shape.kv) * norm * (2 if block in PARALLEL else 1)
            units["query, key norm scales"] = (shape.heads + shape.kv_heads) * norm
    units.update(attention_units(shape, attention, seq_len, padded, act_bytes, float32, masked, block == "gemma2", cuda,
                                 autocast))
    if shape.residual_dropout > 0:  # each sublayer's output dropped before its residual: a mask each, as LoRA's
        units["residual dropout masks"] = 2 * h * (1 / act_bytes if cuda else 1)
    if shape.mlp_dropout > 0:  # StableLM's hidden_dropout: the MLP's output alone
        units["MLP output dropout mask"] = h * (1 / act_bytes if cuda else 1)
    if params["norms_trainable"] and block not in LAYER_NORM:
        # each trainable norm weight keeps the normalised values it multiplies, for its gradient: the layer's two norms
        # (four in a sandwich, Cohere's one) and the query and key norms; Phi's LayerNorm derives its weights' gradients
        # from what it keeps anyway. Gemma's, OLMo 2's and Cohere's norms multiply in float32, the others in the
        # activations' dtype
        if block != "phi":
            norms = 4 if block in SANDWICH else 1 if block in PARALLEL else 2
            normed = norms * h + (shape.q + shape.kv if block in QK_NORMS | POST_NORMS else 0)
            units["normalised, before the norm weight"] = normed * (norm if block in FLOAT32_NORM_PRODUCT else 1)
    if lora:
        units["LoRA A outputs"] = method.r * len(adapted)
        width = {"down_proj": i, "fc2": i, "c_proj": i, "o_proj": shape.q}  # each adapted linear's input
        inputs = sum(width.get(m, h) for m in adapted)
        if not shared:
            units["LoRA inputs (each adapter's own)"] = inputs
        if method.dropout > 0:
            # its mask: CUDA's fused dropout keeps 1 byte a value, the CPU's the scaled noise in the float32 adapter's
            # dtype
            units["LoRA dropout masks"] = inputs * (1 if cuda else 4) / act_bytes
    return units


def text_config(config: Any) -> Any:
    """The text decoder's config (a multimodal model's `text_config`, else the config itself)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


# model_type → the block whose activations `activation_units` counts
ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "qwen3", "phi": "phi",
                 "gemma": "gemma", "gemma2": "gemma2", "gemma3_text": "gemma3", "phi3": "phi3", "olmo2": "olmo2",
                 "olmo3": "olmo2", "exaone4": "exaone4", "smollm3": "llama", "granite": "llama", "cohere": "cohere",
                 "cohere2": "cohere", "glm": "phi3", "glm4": "glm4", "seed_oss": "llama", "ministral3": "llama",
                 "helium": "gemma", "hunyuan_v1_dense": "qwen3", "stablelm": "stablelm", "starcoder2": "starcoder2",
                 "arcee": "arcee", "ernie4_5": "llama"}


def architecture(config: Any) -> dict[str, Any]:
    """Whether the estimate models the config's architecture.

    Returns:
        {"model_type", "block": a value of ARCHITECTURES or None, "modelled", "note"}.
    """
    c = text_config(config)
    model_type = getattr(c, "model_type", "") or ""
    block = ARCHITECTURES.get(model_type)
    if block == "cohere" and getattr(c, "use_qk_norm", False):  # Command R+: a LayerNorm on each head's query and key
        block = "cohere_qk"
    if block == "stablelm":  # StableLM 2 12B: attention and the MLP in parallel, a LayerNorm on each head's q and k
        block += "_parallel" * bool(getattr(c, "use_parallel_residual", False)) + "_qk" * bool(
            getattr(c, "qk_layernorm", False))
    note = None if block else (
        f"the memory estimate does not model the {model_type or 'unknown'} architecture (modelled: "
        f"{', '.join(sorted(ARCHITECTURES))}): stage 03 shows the measured memory alone")
    return {"model_type": model_type, "block": block, "modelled": block is not None, "note": note}
