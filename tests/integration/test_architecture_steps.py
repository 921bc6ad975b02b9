"""Tiny Llama 3, Mistral, Qwen2, Phi, Phi-3, OLMo 2, OLMo 3, EXAONE 4, Cohere, GLM-4, Seed-OSS, StableLM, Starcoder2,
Arcee, ERNIE 4.5, Gemma 2, Gemma 3 (with a vision tower) and Qwen3 models in one process: encoding and stage 02's
checks, LoRA, the update check on two real trainer steps, the memory estimate and greedy generation from the card's
prompt format. The real-size configs (Llama 3 8B, Mistral 7B, Phi-2, OLMo 3 7B, EXAONE 4.0 32B, Command R, GLM-4-9B,
StableLM 2 12B, …) are estimated on the meta device; an architecture the estimate does not model says so."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from labkit.card.schema import Card
from labkit.card.update import updated
from labkit.data import sources as D
from labkit.data.checks import run_checks
from labkit.evaluate.generation import generate_answers
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.model.sources import resolve
from labkit.preflight.activations import architecture
from labkit.preflight.memory import estimate_step
from labkit.preflight.stepchecks import update_check
from labkit.preflight.memory_check import compare
from labkit.preflight.sizing import gpu_profile
from labkit.show.memory import breakdown_rows
from labkit.stages.preprocessing import model_checks
from labkit.train.trainer import build_trainer

SMOKE = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
# Gemma 2's template has no system role: the card's system text opens the user message; Qwen3's empty think block
# goes at the end of the prompt
CASES = {"llama3": {}, "qwen2": {}, "mistral": {"chat_template": "chatml"}, "phi": {"format": "plain"},
         "gemma2": {"system_in": "user"}, "gemma3": {}, "qwen3": {"chat_template_kwargs": {"enable_thinking": False}},
         "phi3": {}, "olmo2": {}, "olmo3": {}, "exaone4": {}, "cohere": {}, "glm4": {}, "seed-oss": {}, "stablelm": {},
         "starcoder2": {}, "arcee": {}, "ernie": {}}
# LoRA'd linears per layer (Phi: q k v dense fc1 fc2; Phi-3: qkv_proj o_proj gate_up_proj down_proj; GLM-4: q k v o
# gate_up_proj down_proj; Starcoder2: q k v o c_fc c_proj; Arcee: q k v o up down)
LAYER_TENSORS = {"llama3": 7, "qwen2": 7, "mistral": 7, "phi": 6, "gemma2": 7, "gemma3": 7, "qwen3": 7, "phi3": 4,
                 "olmo2": 7, "olmo3": 7, "exaone4": 7, "cohere": 7, "glm4": 6, "seed-oss": 7, "stablelm": 7,
                 "starcoder2": 6, "arcee": 6, "ernie": 7}
# the linears the update moves where some are fused (Phi-3's q/k/v, Phi-3's and GLM-4's gate and up)
FUSED = {"phi3": {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"},
         "glm4": {"q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"}}


def card_for(name: str) -> Card:
    raw = copy.deepcopy(SMOKE)
    raw["model"]["source"] = f"tiny:{name}"
    keep = {k: v for k, v in raw["data"]["prompt"].items() if k != "chat_template"}
    raw["data"]["prompt"] = {**keep, **CASES[name]}
    return Card.model_validate(raw)


@pytest.fixture(scope="module")
def rows():
    card = card_for("llama3")
    return [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()][:12]


@pytest.mark.parametrize("name", sorted(CASES))
def test_architecture_checks_train_and_generate(name, rows) -> None:
    card = card_for(name)
    resolved = resolve(card.model.source)
    tok = load_tokenizer(resolved, card)
    _, checks = run_checks(tok, card, {"train": rows[:8]})
    checks += model_checks(resolved, tok, card)
    assert all(c["ok"] for c in checks), [c for c in checks if not c["ok"]]
    model = apply_method(load_model(resolved, card, "cpu"), card)
    trainer = build_trainer(card, model, tok, rows[:8], Path(tempfile.mkdtemp()), device="cpu", max_steps=2,
                            lr_scheduler_type="constant", warmup_steps=0, disable_tqdm=True)
    update = update_check(trainer, card, steps=2)
    assert update["ok"], update["problems"]
    tokens = [t for t in update["tensors"] if "trainable_tokens_delta" in t["name"]]
    lora = 2 * 2 * LAYER_TENSORS[name]  # A and B, 2 layers
    assert update["expected"] == update["changed"] == lora + len(tokens)
    assert len(tokens) == (2 if name == "mistral" else 0)  # untied head: embedding rows and LM-head rows
    if name in FUSED:  # the fused linears are what LoRA adapts and what the update moves
        moved = {t["name"].split(".")[-4] for t in update["tensors"] if t["changed"]}  # …qkv_proj.lora_A.default.weight
        assert moved == FUSED[name]
    from transformers import AutoConfig

    est = estimate_step(AutoConfig.from_pretrained(resolved.location), card, 64)
    assert est["architecture"] == model.get_base_model().config.get_text_config().model_type
    assert est["modelled"] and est["note"] is None
    eager = name == "gemma2"  # no sdpa kernel for Gemma 2: the model and its estimate both use eager attention
    assert (model.get_base_model().config._attn_implementation == "eager") == eager == (est["attention"] == "eager")
    # all-linear on Gemma 3's text decoder alone, in the model and in the estimate: the vision tower's adapters would
    # never move on text rows
    assert est["trainable"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    model.eval()
    answers = generate_answers(model, tok, card, rows[:2])
    assert len(answers) == 2 and all(isinstance(a, str) for a in answers)


def test_real_size_configs_on_meta() -> None:
    """Llama 3 8B (GQA 32/8, 128k vocabulary, untied), Mistral 7B, Qwen2 7B, Phi-2 (parallel block, partial rotary,
    dense biases), Qwen3-0.6B (queries wider than the hidden size), Gemma 3 1B (sliding-window layers), a Phi-4-mini
    (fused linears), OLMo 2 7B (norms after each sublayer), OLMo 3 7B (OLMo 2's block, three of every four layers
    with a 4096-token window) and EXAONE 4.0 32B (OLMo 2's norms, per-head query and key norms) are all modelled;
    the LM head's 128k vocabulary shows in the loss-head term."""
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Olmo2Config, Phi3Config, PhiConfig, Qwen2Config
    from transformers import Exaone4Config, Olmo3Config, Qwen3Config

    card = card_for("llama3")
    llama3 = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0)
    est = estimate_step(llama3, card, 512, micro_batch=2)
    assert est["modelled"] and est["shape"]["kv_heads"] == 8 and est["shape"]["vocab"] == 128256
    assert 7.9e9 < sum(est["breakdown"][k] for k in ("weights_frozen",)) / 4 < 8.1e9  # 8.03B float32 weights
    unpadded = estimate_step(llama3, card, 512, micro_batch=2, padded=False)
    assert unpadded["activation_units_per_token_layer"]["keys, values"] == 2 * 8 * 128  # GQA: K/V at 8 heads
    phi2 = PhiConfig(hidden_size=2560, intermediate_size=10240, num_hidden_layers=32, num_attention_heads=32,
                     partial_rotary_factor=0.4, vocab_size=51200)
    phi_card = card_for("phi")
    phi_est = estimate_step(phi2, phi_card, 512, micro_batch=2)
    assert phi_est["modelled"] and phi_est["architecture"] == "phi"
    units = phi_est["activation_units_per_token_layer"]
    assert "fc1 output, GELU" in units and "gate, SiLU, up" not in units and "normed input (q/k/v, fc1)" in units
    assert set(phi_est["adapted"]) == {"q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"}
    for config in (MistralConfig(num_hidden_layers=2), Qwen2Config(num_hidden_layers=2)):
        assert estimate_step(config, card, 128)["modelled"]
    # Qwen3-0.6B: 16 heads of 128 (queries 2048 wide on a hidden size of 1024), 8 KV heads, a norm on each
    qwen3 = Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                        num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True)
    units = estimate_step(qwen3, card, 512, micro_batch=2, padded=False)["activation_units_per_token_layer"]
    assert units["query after rotary"] == units["attention output"] == 2048 and units["keys, values"] == 2 * 1024
    assert units["query, key before their norms"] == 2048 + 1024 and units["query, key norm scales"] == 16 + 8
    # Gemma 3 1B: 4 heads of 256, one KV head, 5 of every 6 layers with a 512-token window: at 512 tokens those
    # layers give SDPA a mask (and the KV head repeated), at 511 none does
    gemma3 = Gemma3TextConfig(hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
                              num_key_value_heads=1, head_dim=256, vocab_size=262144, sliding_window=512)
    at = {n: estimate_step(gemma3, card, n, micro_batch=2, padded=False)["activation_units_per_token_layer"]
          for n in (511, 512)}
    assert "sliding-window mask" not in at[511] and at[511]["keys, values"] == 2 * 256
    assert at[512]["sliding-window mask"] == pytest.approx(512 * 22 / 26)
    assert at[512]["keys, values"] == pytest.approx(2 * 256 + 2 * 768 * 22 / 26)
    assert at[512]["attention output (its norm)"] == 1152 and at[512]["query, key before their norms"] == 1024 + 256
    # a Phi-3 block of Phi-4-mini's width (24 query heads of 128, 8 KV heads, partial rotary): the fused qkv_proj and
    # gate_up_proj read the normed inputs, o_proj a copy of SDPA's output (the rotary's concatenation)
    phi4_mini = Phi3Config(hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=24,
                           num_key_value_heads=8, partial_rotary_factor=0.75, vocab_size=200064, pad_token_id=199999)
    est = estimate_step(phi4_mini, card, 512, micro_batch=2, padded=False)
    units = est["activation_units_per_token_layer"]
    assert est["modelled"] and set(est["adapted"]) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
    assert units["normed input (q/k/v)"] == units["normed input (gate/up)"] == 3072
    assert units["attention output, contiguous (o_proj)"] == units["attention output"] == 3072
    assert units["gate, SiLU, up"] == 3 * 8192 and units["keys, values"] == 2 * 8 * 128
    # OLMo 2 7B's shape: the norms sit after each sublayer and on the whole query and key projections
    units = estimate_step(Olmo2Config(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                      num_attention_heads=32, vocab_size=100352), card, 512, micro_batch=2,
                          padded=False)["activation_units_per_token_layer"]
    assert "layer input (norm)" not in units and units["layer input (q/k/v)"] == units["MLP input (gate/up)"] == 4096
    assert units["query, key before their norms"] == 2 * 4096 and units["query, key norm scales"] == 2
    # OLMo 3 7B: the same block; its 24 windowed layers of 32 give SDPA a mask once a row reaches 4096 tokens
    olmo3 = Olmo3Config(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                        vocab_size=100278, sliding_window=4096)
    at = {n: estimate_step(olmo3, card, n, padded=False)["activation_units_per_token_layer"] for n in (4095, 4096)}
    assert at[4095]["query, key before their norms"] == 2 * 4096 and "sliding-window mask" not in at[4095]
    assert at[4096]["sliding-window mask"] == pytest.approx(4096 * 24 / 32)
    # EXAONE 4.0 32B's shape: OLMo 2's norms after each sublayer, but on each of the 40 query and 8 key heads; 48 of
    # its 64 layers with a 4096-token window
    exaone4 = Exaone4Config(hidden_size=5120, intermediate_size=27392, num_hidden_layers=64, num_attention_heads=40,
                            num_key_value_heads=8, head_dim=128, vocab_size=102400, sliding_window=4096)
    at = {n: estimate_step(exaone4, card, n, padded=False)["activation_units_per_token_layer"] for n in (4095, 4096)}
    assert "layer input (norm)" not in at[4095] and at[4095]["layer input (q/k/v)"] == 5120
    assert at[4095]["query, key before their norms"] == 40 * 128 + 8 * 128
    assert at[4095]["query, key norm scales"] == 40 + 8 and "sliding-window mask" not in at[4095]
    assert at[4096]["sliding-window mask"] == pytest.approx(4096 * 48 / 64)


def test_cohere_shapes_on_meta() -> None:
    """Command R 35B (64 heads, as many KV heads), Command R+ 104B (a LayerNorm on each head's query and key) and
    Command R7B (Cohere 2: three of every four layers with a 4096-token window) are modelled: one LayerNorm's centred
    input kept twice, its one output shared by attention and the MLP; the 256k vocabulary read from the config."""
    from transformers import Cohere2Config, CohereConfig

    card = card_for("cohere")
    command_r = CohereConfig(hidden_size=8192, intermediate_size=22528, num_hidden_layers=40, num_attention_heads=64,
                             num_key_value_heads=64, vocab_size=256000)
    est = estimate_step(command_r, card, 512, padded=False)
    units = est["activation_units_per_token_layer"]
    assert est["modelled"] and est["architecture"] == "cohere" and est["shape"]["vocab"] == 256000
    assert units["layer input, centred twice (LayerNorm)"] == 2 * 8192 and units["norm scales"] == 1
    assert units["normed input (q/k/v, gate/up)"] == 8192 and "layer input (norm)" not in units
    assert units["keys, values"] == 2 * 8192 and "query, key before their norms" not in units
    plus = CohereConfig(hidden_size=12288, intermediate_size=33792, num_hidden_layers=64, num_attention_heads=96,
                        num_key_value_heads=8, vocab_size=256000, use_qk_norm=True)
    assert architecture(plus)["block"] == "cohere_qk"
    units = estimate_step(plus, card, 512, padded=False)["activation_units_per_token_layer"]
    assert units["query, key before their norms"] == 2 * (96 + 8) * 128 and units["query, key norm scales"] == 96 + 8
    r7b = Cohere2Config(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=256000, sliding_window=4096)
    at = {n: estimate_step(r7b, card, n, padded=False)["activation_units_per_token_layer"] for n in (4095, 4096)}
    assert architecture(r7b)["block"] == "cohere" and "sliding-window mask" not in at[4095]
    assert at[4096]["sliding-window mask"] == pytest.approx(4096 * 24 / 32)


def test_model_dropout_on_meta() -> None:
    """Seed-OSS-36B (`seed_oss`: Llama's block, its config dropping the attention probabilities and each sublayer's
    output at 0.1 in training) and Phi-2 (`resid_pdrop` 0.1) are estimated with their dropout: on a GPU, bf16, each
    sublayer's output keeps a 1-byte mask and SDPA drops inside its kernel (nothing more kept); on the CPU, float32,
    the mask is the noise in the activations' dtype and SDPA runs its math path, which keeps the probabilities, their
    dropped copy and the noise (heads × sequence length a token each) as eager attention does."""
    from transformers import PhiConfig, SeedOssConfig

    gpu = gpu_profile(80, "9.0")
    bf16 = updated(card_for("llama3"), {"model.dtype": "bfloat16", "train.precision": "bf16"})
    seed = SeedOssConfig(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=80,
                         num_key_value_heads=8, head_dim=128, vocab_size=155136)
    est = estimate_step(seed, bf16, 1024, device=gpu, padded=False)
    units = est["activation_units_per_token_layer"]
    assert est["modelled"] and architecture(seed)["block"] == "llama"
    assert units["residual dropout masks"] == 5120 and units["attention log-sum-exp"] == 80  # 2 × 5120 bytes
    assert not {"attention dropout mask", "attention probabilities, dropped"} & set(units)
    units = estimate_step(seed, card_for("llama3"), 1024, padded=False)["activation_units_per_token_layer"]
    assert units["residual dropout masks"] == 2 * 5120 and "attention log-sum-exp" not in units
    assert units["attention dropout mask"] == units["attention probabilities, dropped"] == 80 * 1024
    phi2 = PhiConfig(hidden_size=2560, intermediate_size=10240, num_hidden_layers=32, num_attention_heads=32,
                     vocab_size=51200, partial_rotary_factor=0.4, resid_pdrop=0.1)
    units = estimate_step(phi2, bf16, 1024, device=gpu, padded=False)["activation_units_per_token_layer"]
    assert units["residual dropout masks"] == 2560 and "attention dropout mask" not in units


def test_glm_shapes_on_meta() -> None:
    """GLM-4-9B-chat (`glm`: Phi-3's block, separate q/k/v with biases, the MLP's gate and up fused, half the head
    rotated) and GLM-4-9B-0414 (`glm4`: the same with a norm after attention and after the MLP, as Gemma 2) are
    modelled: the fused gate_up_proj reads the normed input, o_proj a copy of the attention's output (the partial
    rotary concatenates), and GLM-4-0414 keeps four norms' inputs a layer."""
    from transformers import Glm4Config, GlmConfig

    card = card_for("glm4")
    sizes = {"hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40, "num_attention_heads": 32,
             "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 151552, "attention_bias": True}
    for config, norms in ((GlmConfig(**sizes), 2), (Glm4Config(**sizes), 4)):
        est = estimate_step(config, card, 512, padded=False)
        units = est["activation_units_per_token_layer"]
        assert est["modelled"] and set(est["adapted"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj",
                                                           "down_proj"}
        assert units["normed input (q/k/v)"] == units["normed input (gate/up)"] == 4096
        assert units["attention output, contiguous (o_proj)"] == units["attention output"] == 4096
        assert units["gate, SiLU, up"] == 3 * 13696 and units["keys, values"] == 2 * 2 * 128
        assert units["norm scales"] == norms and ("MLP output (its norm)" in units) == (norms == 4)


def test_ministral3_hunyuan_and_helium_shapes_on_meta() -> None:
    """Ministral 3 8B's text decoder (`ministral3`: Llama's block), a HunYuan dense of 7B's width
    (`hunyuan_v1_dense`: Qwen3's norm on each head's query and key) and Helium 1 2B (`helium`: Llama's block whose
    RMSNorms multiply their weight in float32, as Gemma's) are modelled with their blocks' terms."""
    from transformers import HeliumConfig, HunYuanDenseV1Config, LlamaConfig, Ministral3Config

    card = card_for("llama3")
    wide = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128}
    ministral3 = Ministral3Config(**wide, num_hidden_layers=34, vocab_size=131072)
    hunyuan = HunYuanDenseV1Config(**wide, num_hidden_layers=32, vocab_size=128167)
    assert (architecture(ministral3)["block"], architecture(hunyuan)["block"]) == ("llama", "qwen3")
    units = estimate_step(ministral3, card, 512, padded=False)["activation_units_per_token_layer"]
    assert units["keys, values"] == 2 * 8 * 128 and "query, key before their norms" not in units
    est = estimate_step(hunyuan, card, 512, padded=False)
    units = est["activation_units_per_token_layer"]
    assert est["modelled"] and est["shape"]["vocab"] == 128167
    assert units["query, key before their norms"] == (32 + 8) * 128 and units["query, key norm scales"] == 32 + 8
    # full fine-tuning in bf16 on a GPU: Helium's norms keep their normalised values in float32, Llama's in bf16
    full = updated(card, {"model.dtype": "bfloat16", "train.precision": "bf16", "method": {"kind": "full"}})
    helium = HeliumConfig()  # transformers' defaults: Helium 1 preview, 2B (2560 wide, 24 layers of 20 heads)
    sizes = {k: getattr(helium, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                             "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")}
    assert architecture(helium)["block"] == "gemma"
    helium, llama = (estimate_step(c, full, 1024, device=gpu_profile(80, "9.0"), padded=False)
                     for c in (helium, LlamaConfig(**sizes)))
    assert helium["modelled"]
    key = "normalised, before the norm weight"
    assert helium["activation_units_per_token_layer"][key] == 2 * llama["activation_units_per_token_layer"][key]


def test_stablelm_and_starcoder2_shapes_on_meta() -> None:
    """StableLM 2 1.6B (`stablelm`: Llama's block with LayerNorms, a quarter of each head rotated and concatenated, so
    o_proj reads a copy), StableLM 2 12B (`stablelm_parallel_qk`: one LayerNorm feeding attention and the MLP, a
    LayerNorm on each head's query and key) and StarCoder2 3B (`starcoder2`: LayerNorms, an ungated GELU MLP) with its
    config's dropout set: each sublayer's output and the embeddings keep a mask (1 byte a value on a GPU, the noise in
    the activations' dtype on the CPU). A LayerNorm's weight needs nothing more kept when it trains."""
    from transformers import StableLmConfig, Starcoder2Config

    card = card_for("stablelm")
    small = StableLmConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=32,
                           num_key_value_heads=32, vocab_size=100352, use_qkv_bias=True)
    large = StableLmConfig(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=32,
                           num_key_value_heads=8, vocab_size=100352, use_parallel_residual=True, qk_layernorm=True)
    assert [architecture(c)["block"] for c in (small, large)] == ["stablelm", "stablelm_parallel_qk"]
    units = estimate_step(small, card, 512, padded=False)["activation_units_per_token_layer"]
    assert units["norm statistics"] == 4 and units["post-attention residual (LayerNorm)"] == 2048
    assert units["attention output, contiguous (o_proj)"] == units["attention output"] == 2048
    assert units["normed input (q/k/v)"] == units["normed input (MLP)"] == 2048
    units = estimate_step(large, card, 512, padded=False)["activation_units_per_token_layer"]
    assert units["norm statistics"] == 2 and "post-attention residual (LayerNorm)" not in units
    assert units["normed input (q/k/v, gate/up)"] == 5120 and units["query, key norm statistics"] == 2 * (32 + 8)
    coder = {"hidden_size": 3072, "intermediate_size": 12288, "num_hidden_layers": 30, "num_attention_heads": 24,
             "num_key_value_heads": 2, "vocab_size": 49152, "sliding_window": 4096}
    dropped = Starcoder2Config(**coder, residual_dropout=0.1, embedding_dropout=0.1)
    full = updated(card, {"method": {"kind": "full"}})
    est = estimate_step(dropped, full, 512, padded=False)
    units = est["activation_units_per_token_layer"]
    assert est["modelled"] and architecture(dropped)["block"] == "starcoder2"
    assert units["c_fc output (GELU input)"] == 12288 and "gate, SiLU, up" not in units
    assert units["residual dropout masks"] == 2 * 3072 and "normalised, before the norm weight" not in units
    tokens = 512 * est["rows"]
    for device, byte in (("cpu", 4), (gpu_profile(80, "9.0"), 1)):  # the embeddings' mask, once per token
        bf16 = {"model.dtype": "bfloat16", "train.precision": "bf16"} if device != "cpu" else {}
        chosen = updated(full, bf16)
        with_mask, without = (estimate_step(c, chosen, 512, device=device, padded=False)["breakdown"]["activations"]
                              for c in (Starcoder2Config(**coder, embedding_dropout=0.1), Starcoder2Config(**coder)))
        assert with_mask - without == tokens * 3072 * byte
    # Phi's embd_pdrop is the same mask; Phi-3's config carries one that transformers never applies
    from transformers import Phi3Config, PhiConfig

    for config, dropped in ((PhiConfig, True), (Phi3Config, False)):
        with_mask, without = (estimate_step(config(**coder, **extra), full, 512, padded=False)["breakdown"]["activations"]
                              for extra in ({"embd_pdrop": 0.1}, {}))
        assert with_mask - without == (tokens * 3072 * 4 if dropped else 0)


def test_arcee_and_ernie_shapes_on_meta() -> None:
    """AFM-4.5B (`arcee`: Llama's attention, an ungated ReLU² MLP: one intermediate-wide tensor kept where Llama's
    gated MLP keeps three) and ERNIE 4.5 0.3B (`ernie4_5`: Llama's block) at transformers' defaults for them."""
    from transformers import ArceeConfig, Ernie4_5Config, LlamaConfig

    card = card_for("arcee")
    arcee = ArceeConfig()  # AFM-4.5B: 2560 wide, MLP 18432, 32 layers of 32 heads of 80
    est = estimate_step(arcee, card, 512, padded=False)
    units = est["activation_units_per_token_layer"]
    assert est["modelled"] and architecture(arcee)["block"] == "arcee" and set(est["adapted"]) == {
        "q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"}
    assert units["ReLU output (its square's input)"] == units["ReLU² output (down)"] == 18432
    assert "gate, SiLU, up" not in units
    ernie = Ernie4_5Config()  # 0.3B: 1024 wide, 18 layers, 16 heads of 128 over 2 KV heads, a 103,424-token vocabulary
    sizes = {k: getattr(ernie, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                            "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")}
    est, llama = (estimate_step(c, card, 512, padded=False) for c in (ernie, LlamaConfig(**sizes)))
    assert est["modelled"] and est["activation_units_per_token_layer"] == llama["activation_units_per_token_layer"]
    assert est["activation_units_per_token_layer"]["keys, values"] == 2 * 2 * 128


def test_unmodelled_architecture_is_named_and_the_measurement_shown_alone() -> None:
    from transformers import GPT2Config

    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=600)
    assert architecture(config) == {"model_type": "gpt2", "block": None, "modelled": False, "note": architecture(config)["note"]}
    card = updated(card_for("llama3"), {"method.target_modules": ["c_attn"]})
    est = estimate_step(config, card, 64)
    assert not est["modelled"] and "does not model the gpt2 architecture" in est["note"]
    measured = {"memory": {"delta_bytes": 2**20, "method": "rss"}, "weights_bytes": 2**20, "peak_bytes": 2**21,
                "seconds_per_step": 0.1}
    (row,) = compare([est], [measured])
    assert row["step_error"] is None and row["step_gib_measured"] > 0 and "step_gib_estimated" not in row
    assert breakdown_rows([est]) == [{"term": est["note"]}]


@pytest.mark.parametrize("name,trainer,prompt", [("phi", "orpo", CASES["phi"]), ("mistral", "dpo", CASES["mistral"]),
                                                 ("qwen2", "dpo", {"chat_template": "chatml"})])
def test_preference_trainers_in_each_format(name, trainer, prompt) -> None:
    """DPO and ORPO read the same prompt format: pairs pass stage 02's checks and the update check passes on TRL's
    preference trainers, whose fused LM head reads the head's weight and bias (ChatML rows of an untied head, Mistral,
    and of a tied one, Qwen2)."""
    raw = copy.deepcopy(SMOKE)
    raw["model"]["source"] = f"tiny:{name}"
    keep = {k: v for k, v in raw["data"]["prompt"].items() if k != "chat_template"}
    raw["data"]["prompt"] = {**keep, **prompt}
    raw["data"]["fields"]["rejected"] = "rejected"
    raw["train"].update(trainer=trainer, beta=0.1)
    card = Card.model_validate(raw)
    resolved = resolve(card.model.source)
    tok = load_tokenizer(resolved, card)
    pairs = [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()][:8]
    encoded, checks = run_checks(tok, card, {"train": pairs})
    assert all(c["ok"] for c in checks), [c for c in checks if not c["ok"]]
    first = encoded["train"][0]
    if name == "phi":
        assert tok.decode(first.prompt_ids).endswith("### Response:\n")
    else:
        assert tok.decode(first.prompt_ids).endswith("<|im_start|>assistant\n")
    model = apply_method(load_model(resolved, card, "cpu"), card)
    trainer_ = build_trainer(card, model, tok, pairs, Path(tempfile.mkdtemp()), device="cpu", max_steps=2,
                             lr_scheduler_type="constant", warmup_steps=0, disable_tqdm=True)
    update = update_check(trainer_, card, steps=2)
    assert update["ok"], update["problems"]
    tokens = [t for t in update["tensors"] if "trainable_tokens_delta" in t["name"]]
    assert len(tokens) == {"phi": 0, "mistral": 2, "qwen2": 1}[name] and all(t["changed"] for t in tokens)
