"""The activation terms of the memory estimate against what autograd really keeps: the tensors one decoder layer saves
for the backward (torch's saved-tensor hooks, each storage counted once, parameters left out), per token, for a tiny
Llama, a Llama whose head_dim × heads is not its hidden size (Mistral NeMo's shape), a Qwen3 (a norm on each head's
query and key), a Gemma (GeGLU), a Gemma 2 (four norms a layer, softcapped eager attention), a Gemma 3 (four norms,
query and key norms, a sliding window shorter or longer than the sequence), an OLMo 2 (norms after each sublayer, on
the whole query and key), an OLMo 3 (OLMo 2's block, sliding-window layers), an EXAONE 4 (OLMo 2's norms, but on each
head's query and key; global layers without rotary), a Cohere (attention and the MLP in parallel on one LayerNorm;
Command R+'s query and key LayerNorms; Cohere 2's windowed and rotary-free layers), a GLM-4 (Phi-3's fused MLP input
and concatenated rotary; GLM-4-0414's four norms) and models that drop in training (a Llama with attention dropout,
Phi-2's and Phi-3's residual dropout, a Seed-OSS with both), a Ministral 3, a HunYuan dense, a Helium, a StableLM
(LayerNorms, a concatenating partial rotary; StableLM 2 12B's parallel block and per-head query and key LayerNorms;
its MLP-output dropout), a Starcoder2 (LayerNorms, an ungated GELU MLP, residual and attention dropout), an Arcee
(an ungated ReLU² MLP) and an ERNIE 4.5, with LoRA on every linear layer, in float32, with and without padding, with
sdpa and eager attention; and with full fine-tuning, where each trainable norm also keeps the values its weight
multiplies; both also in bfloat16 under the CPU's autocast."""

from __future__ import annotations

import pytest
import torch
import transformers
from conftest import REPO

from labkit.card.load import load_card
from labkit.card.schema import Card
from labkit.card.update import updated
from labkit.model.method import apply_method
from labkit.preflight.activations import LAYER_NORM, activation_units, architecture
from labkit.preflight.memory import meta_model, parameter_bytes, shape_of

SIZES = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 600, "max_position_embeddings": 2048}
IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}  # in the vocabulary (Phi-3's defaults are not)
CONFIGS = {"llama": lambda: transformers.LlamaConfig(**SIZES),
           "llama, head_dim 32": lambda: transformers.LlamaConfig(**SIZES, head_dim=32),
           "qwen3, head_dim 32": lambda: transformers.Qwen3Config(**SIZES, head_dim=32),
           "qwen3, head_dim 16": lambda: transformers.Qwen3Config(**SIZES, head_dim=16),
           "phi": lambda: transformers.PhiConfig(**{**SIZES, "intermediate_size": 256}, partial_rotary_factor=0.5),
           "gemma, head_dim 32": lambda: transformers.GemmaConfig(**SIZES, head_dim=32),
           "gemma2, head_dim 32": lambda: transformers.Gemma2Config(**SIZES, head_dim=32, sliding_window=32),
           "gemma3, window 32": lambda: transformers.Gemma3TextConfig(**SIZES, head_dim=32, sliding_window=32),
           "gemma3, window 128": lambda: transformers.Gemma3TextConfig(**SIZES, head_dim=32, sliding_window=128),
           "phi3": lambda: transformers.Phi3Config(**SIZES, **IDS),
           "phi3, partial rotary 0.75": lambda: transformers.Phi3Config(**SIZES, **IDS, partial_rotary_factor=0.75),
           "olmo2": lambda: transformers.Olmo2Config(**SIZES, **IDS),
           # OLMo 3: OLMo 2's block, three of every four layers with a window (the measured layer 1 has one)
           "olmo3, window 32": lambda: transformers.Olmo3Config(**SIZES, **IDS, sliding_window=32),
           "olmo3, window 128": lambda: transformers.Olmo3Config(**SIZES, **IDS, sliding_window=128),
           # EXAONE 4: norms after each sublayer, on each head's query and key; 3 of every 4 layers windowed, the
           # others without rotary (NoPE)
           "exaone4, window 32": lambda: transformers.Exaone4Config(**SIZES, **IDS, sliding_window=32),
           "exaone4, window 128": lambda: transformers.Exaone4Config(**SIZES, **IDS, sliding_window=128),
           "exaone4, no rotary in layer 1": lambda: transformers.Exaone4Config(**SIZES, **IDS, sliding_window=32,
                                                                               sliding_window_pattern=2),
           # Cohere: attention and the MLP in parallel on one LayerNorm (written out in float32); Command R+ also
           # LayerNorms each head's query and key; Cohere 2: three of every four layers windowed, the others without
           # rotary
           "cohere": lambda: transformers.CohereConfig(**SIZES, **IDS),
           "cohere, query and key norms": lambda: transformers.CohereConfig(**SIZES, **IDS, use_qk_norm=True),
           "cohere2, window 32": lambda: transformers.Cohere2Config(**SIZES, **IDS, sliding_window=32),
           "cohere2, no rotary in layer 1": lambda: transformers.Cohere2Config(
               **SIZES, **IDS, sliding_window=32, layer_types=["sliding_attention", "full_attention"]),
           # GLM-4: Phi-3's fused gate_up_proj and concatenated partial rotary with separate q/k/v (and biases);
           # GLM-4-0414: the same with Gemma 2's four norms
           "glm": lambda: transformers.GlmConfig(**SIZES, **IDS, head_dim=16),
           "glm4": lambda: transformers.Glm4Config(**SIZES, **IDS, head_dim=16),
           "glm4, head_dim 32": lambda: transformers.Glm4Config(**SIZES, **IDS, head_dim=32),
           "smollm3, no rotary in layer 1": lambda: transformers.SmolLM3Config(**SIZES, **IDS, no_rope_layer_interval=2),
           "smollm3, rotary in layer 1": lambda: transformers.SmolLM3Config(**SIZES, **IDS, no_rope_layer_interval=4),
           # dropout in the model's own config: the attention probabilities' (the CPU's SDPA then runs its math path)
           # and each sublayer's output before its residual (Phi-2 ships resid_pdrop 0.1; Seed-OSS both at 0.1, its
           # defaults)
           "llama, attention dropout": lambda: transformers.LlamaConfig(**SIZES, attention_dropout=0.1),
           "phi, residual dropout": lambda: transformers.PhiConfig(**{**SIZES, "intermediate_size": 256},
                                                                   partial_rotary_factor=0.5, resid_pdrop=0.1),
           "phi3, residual dropout": lambda: transformers.Phi3Config(**SIZES, **IDS, resid_pdrop=0.1),
           "seed_oss": lambda: transformers.SeedOssConfig(**SIZES, **IDS, head_dim=32),
           # Ministral 3 (Llama's block, the query scaled by position past the rotary's original length), HunYuan
           # dense (Qwen3's norms on each head's query and key, applied after the rotary), Helium (Llama's block, its
           # RMSNorms multiplying their weight in float32 as Gemma's do)
           "ministral3, head_dim 32": lambda: transformers.Ministral3Config(**SIZES, **IDS, head_dim=32),
           "hunyuan_v1_dense, head_dim 32": lambda: transformers.HunYuanDenseV1Config(**SIZES, **IDS, head_dim=32),
           "helium": lambda: transformers.HeliumConfig(**SIZES, **IDS, head_dim=16),  # its o_proj reads hidden_size
           # StableLM 2: LayerNorms, a quarter of each head rotated and concatenated with the rest; StableLM 2 12B:
           # attention and the MLP in parallel, a LayerNorm on each head's query and key; Starcoder2: LayerNorms with
           # biases, an ungated tanh-GELU MLP (c_fc, c_proj), its config's residual dropout
           "stablelm": lambda: transformers.StableLmConfig(**SIZES, **IDS),
           "stablelm, parallel, query and key norms": lambda: transformers.StableLmConfig(
               **SIZES, **IDS, use_parallel_residual=True, qk_layernorm=True),
           "stablelm, query and key norms": lambda: transformers.StableLmConfig(**SIZES, **IDS, qk_layernorm=True),
           "stablelm, parallel, MLP output dropout": lambda: transformers.StableLmConfig(
               **SIZES, **IDS, use_parallel_residual=True, hidden_dropout=0.1),
           "starcoder2": lambda: transformers.Starcoder2Config(**SIZES, **IDS),
           "starcoder2, residual and attention dropout": lambda: transformers.Starcoder2Config(
               **SIZES, **IDS, residual_dropout=0.1, attention_dropout=0.1),
           # Arcee (AFM-4.5B): Llama's attention, an ungated MLP (up_proj, ReLU squared, down_proj); ERNIE 4.5: Llama's
           # block, its rotary in float32 with each layer's own cos / sin
           "arcee": lambda: transformers.ArceeConfig(**SIZES, **IDS),
           "ernie4_5, head_dim 16": lambda: transformers.Ernie4_5Config(**SIZES, **IDS, head_dim=16),
           "granite": lambda: transformers.GraniteConfig(**SIZES, **IDS, embedding_multiplier=12.0, logits_scaling=8.0,
                                                         residual_multiplier=0.22, attention_multiplier=0.015625)}
TORCH_LN = {"phi", *LAYER_NORM}  # blocks normed by PyTorch's LayerNorm
ROWS, SEQ = 2, 64
LAYER = 1  # the decoder layer measured
EAGER_ONLY = {"gemma2, head_dim 32"}  # no sdpa kernel in transformers (softcapping)
CASES = [(name, attention if name not in EAGER_ONLY else "eager", dropout) for name in sorted(CONFIGS)
         for attention, dropout in [("sdpa", 0.0), ("eager", 0.0), ("sdpa", 0.1)]
         if not (name in EAGER_ONLY and (attention, dropout) == ("eager", 0.0))]


def layer_masked(config, padded: bool) -> float:
    """Whether SDPA gets a mask in the measured layer: padding, or a sliding window the sequence reaches there."""
    types = getattr(config, "layer_types", None)
    return float(padded or bool(types and types[LAYER] == "sliding_attention" and SEQ >= config.sliding_window))


def saved_per_token(model, padded: bool) -> float:
    """Bytes the second decoder layer saves for the backward, per token, in one forward pass."""
    ids = torch.randint(5, 600, (ROWS, SEQ), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(ROWS, SEQ, dtype=torch.long)
    if padded:
        mask[0, -8:] = 0
    layer = (model.get_base_model() if hasattr(model, "get_base_model") else model).model.layers[LAYER]
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    inside = [False]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if inside[0] and t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    layer.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True))
    layer.register_forward_hook(lambda *_: inside.__setitem__(0, False))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, attention_mask=mask)
    return sum(seen.values()) / (ROWS * SEQ)


def full_card() -> Card:
    """The smoke card with full fine-tuning: every weight trains, the norms' among them."""
    return updated(load_card(REPO / "params" / "smoke.yaml").card, {"method": {"kind": "full"}})


def saved_and_estimated(name: str, card: Card, attention: str, padded: bool = False,
                        bf16: bool = False) -> tuple[float, float, dict]:
    """Bytes per token the measured layer saves and its estimate, in float32 or in bfloat16 under the CPU's autocast."""
    config = CONFIGS[name]()
    torch.manual_seed(0)
    model = apply_method(transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=attention, dtype=torch.bfloat16 if bf16 else torch.float32), card)
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        measured = saved_per_token(model, padded)
    act_bytes = 2 if bf16 else 4
    units = activation_units(shape_of(config), card, parameter_bytes(meta_model(config, card), card, act_bytes), SEQ,
                             padded, architecture(config)["block"], attention, act_bytes, not bf16, autocast=bf16,
                             masked=layer_masked(config, padded))
    return measured, sum(units.values()) * act_bytes, units


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize(("name", "attention", "dropout"), CASES)
def test_the_estimated_layer_keeps_what_autograd_saves(name: str, padded: bool, attention: str, dropout: float) -> None:
    # LoRA r 4 on all linear layers, float32 (with dropout: the CPU keeps each adapter's dropped input and its noise)
    card = updated(load_card(REPO / "params" / "smoke.yaml").card, {"method.dropout": dropout})
    measured, estimated, _ = saved_and_estimated(name, card, attention, padded)
    # what the units leave out: the rotary cos / sin (2 × head_dim values per position, shared by the rows)
    assert 0 <= measured - estimated <= 0.03 * measured, (name, padded, attention, dropout, measured, estimated)


@pytest.mark.parametrize(("name", "attention"), [(name, attention) for name, attention, dropout in CASES if not dropout])
def test_full_fine_tuning_keeps_each_trainable_norms_normalised_values(name: str, attention: str) -> None:
    """Full fine-tuning, float32: each norm whose weight trains keeps the normalised values it multiplies — the
    layer's two norms, a sandwich's four, the query and key norms (per head or whole) — except PyTorch's LayerNorm
    (Phi's, StableLM's, Starcoder2's), which derives its weights' gradients from what it keeps anyway."""
    measured, estimated, units = saved_and_estimated(name, full_card(), attention)
    assert ("normalised, before the norm weight" in units) == (architecture(CONFIGS[name]())["block"] not in TORCH_LN)
    assert 0 <= measured - estimated <= 0.03 * measured, (name, attention, measured, estimated, units)


@pytest.mark.parametrize("method", ["lora", "full"])
@pytest.mark.parametrize("name", sorted(n for n in CONFIGS if architecture(CONFIGS[n]())["block"] not in TORCH_LN))
def test_under_bf16_autocast(name: str, method: str) -> None:
    """A GPU's bf16 training: bfloat16 weights, the step under autocast (as accelerate runs it; the CPU's autocast
    casts the linear products the same way). Each RMSNorm keeps a float32 copy of its input. With LoRA (PEFT's float32
    adapters) each adapter keeps a bfloat16 copy of its own input, not the shared normed input of float32 training;
    in full fine-tuning Gemma's and OLMo 2's norms multiply their weight in float32 (the normalised values they keep
    are float32), the others in bfloat16. A model's own dropout is counted as the CPU keeps it: the noise in
    bfloat16, and SDPA's math path in float32 (CUDA keeps a 1-byte mask and its SDPA drops inside the kernel). Left
    out: LoRA dropout (the CPU's keeps float32 noise) and PyTorch's LayerNorm (Phi, StableLM, Starcoder2: CUDA's
    autocast runs it in float32, the CPU's in bfloat16: the CPU cannot stand in for it)."""
    card = load_card(REPO / "params" / "smoke.yaml").card if method == "lora" else full_card()
    attention = "eager" if name in EAGER_ONLY else "sdpa"
    measured, estimated, units = saved_and_estimated(name, card, attention, bf16=True)
    # left out: the rotary cos / sin and autocast's bfloat16 copies of the adapters' weights (per layer, not per token)
    assert 0 <= measured - estimated <= 0.06 * measured, (name, measured, estimated, units)


def test_a_multimodal_models_vision_tower_adds_no_text_activations() -> None:
    """A Gemma 3 with a vision tower (as 4B and up ship): `all-linear` adapts the text decoder alone (text rows never
    run the tower); module names the tower shares (q_proj, v_proj) adapt it too, whose adapters cost their weights and
    states while the activations per token stay the text decoder's."""
    card = load_card(REPO / "params" / "smoke.yaml").card
    text = transformers.Gemma3TextConfig(**SIZES, head_dim=32, sliding_window=128)
    both = transformers.Gemma3Config(text_config=text.to_dict(), vision_config={
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28,
        "patch_size": 14})
    for targets in ("all-linear", ["q_proj", "v_proj"]):
        chosen = updated(card, {"method.target_modules": targets})
        alone, with_tower = (parameter_bytes(meta_model(c, chosen), chosen, 4) for c in (text, both))
        assert (with_tower["trainable"] > alone["trainable"]) == (targets != "all-linear")
        assert with_tower["adapted"] == alone["adapted"]
        units = [activation_units(shape_of(c), chosen, p, SEQ, False, architecture(c)["block"], "sdpa", 4, True)
                 for c, p in ((text, alone), (both, with_tower))]
        assert units[0] == units[1]
