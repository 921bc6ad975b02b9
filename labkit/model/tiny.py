"""Tiny random models of the common architectures and a tokenizer trained on built-in text, made offline in seconds.

Used by `tiny:<name>` model sources (tests, smoke cards): the whole pipeline runs for real on a
model of a few hundred thousand parameters. `tiny:llama` has a ChatML chat template like SmolLM2's; the others
mimic their architecture's base models:

| name | architecture | what it mimics |
|---|---|---|
| `llama`, `llama-wide` | LlamaForCausalLM | SmolLM2: GQA, tied embeddings, ChatML template |
| `llama3` | LlamaForCausalLM | Llama 3: GQA, untied LM head, rope θ 500,000, a vocabulary padded past the tokenizer, a template |
| `mistral` | MistralForCausalLM | a base Mistral: GQA, sliding window, no chat template and no ChatML tokens |
| `qwen2` | Qwen2ForCausalLM | Qwen2: q/k/v biases, tied embeddings, ChatML template |
| `phi` | PhiForCausalLM | Phi-2: parallel attention + MLP, partial rotary, dense biases, LayerNorm, BOS = EOS = pad, no template |
| `phi3` | Phi3ForCausalLM | Phi-4-mini: fused `qkv_proj` and `gate_up_proj`, partial rotary (0.75), GQA, a template in its style (each turn closed by `<|end|>`, a stop token of the model; the EOS after the last turn), BOS = EOS = pad |
| `olmo2` | Olmo2ForCausalLM | OLMo 2: no norm before a sublayer (each output normed before its residual), q/k RMSNorm over the whole projection, untied LM head, ChatML template |
| `olmo3` | Olmo3ForCausalLM | OLMo 3: OLMo 2's block with sliding-window layers (a 64-token window in the first layer, full attention in the second), untied LM head, ChatML template |
| `exaone4` | Exaone4ForCausalLM | EXAONE 4.0 1.2B: OLMo 2's norms after each sublayer with q/k RMSNorm on each head, a 64-token window in the first layer and a global layer without rotary (NoPE) second, tied embeddings, a template in its style (`[|endofturn|]`, the EOS, closes each turn but the user's, a newline after it) |
| `cohere` | CohereForCausalLM | Aya Expanse 8B / Command R: attention and the MLP in parallel on one LayerNorm (no bias), interleaved rotary, tied embeddings, logits scaled by 0.125, a tokenizer that adds `<BOS_TOKEN>`, a template in its style that writes it too (each turn between `<|START_OF_TURN_TOKEN|>` and `<|END_OF_TURN_TOKEN|>`, the EOS, no newline) |
| `glm4` | Glm4ForCausalLM | GLM-4-0414: four norms a layer (as Gemma 2), fused `gate_up_proj`, q/k/v biases, partial rotary (0.5) interleaved and concatenated, GQA, untied LM head, ChatML template |
| `seed-oss` | SeedOssForCausalLM | Seed-OSS 36B: Llama's block with q/k/v biases, head_dim ≠ hidden / heads, untied LM head, its config's dropout on in training (attention probabilities and each sublayer's output, 0.1, applied in the forward rather than by dropout modules), ChatML template |
| `stablelm` | StableLmForCausalLM | StableLM 2 1.6B: LayerNorms, a quarter of each head rotated (partial rotary, concatenated), q/k/v biases, untied LM head, ChatML template |
| `starcoder2` | Starcoder2ForCausalLM | StarCoder2: LayerNorms and linears with biases, an ungated tanh-GELU MLP (`c_fc`, `c_proj`), a sliding window, dropout in training on the embeddings, the attention probabilities and each sublayer's output (0.1), tied embeddings, ChatML template |
| `arcee` | ArceeForCausalLM | AFM-4.5B: Llama's attention, an ungated MLP (`up_proj`, ReLU squared, `down_proj`), untied LM head, ChatML template |
| `ernie` | Ernie4_5ForCausalLM | ERNIE 4.5 0.3B: Llama's block, an interleaved rotary computed in float32, GQA, tied embeddings, ChatML template |
| `qwen3` | Qwen3ForCausalLM | Qwen3: q/k RMSNorm, head_dim ≠ hidden / heads, its template (an empty think block opens the last answer unless `enable_thinking=False`), `<think>` as ordinary added tokens |
| `gemma2` | Gemma2ForCausalLM | Gemma 2: no sdpa kernel (softcapping), head_dim ≠ hidden / heads, tied embeddings, a tokenizer that adds `<bos>`, a template that writes it too, refuses a system message and closes the turn with `<end_of_turn>` (a stop token of the model, not the tokenizer's EOS) |
| `gemma3` | Gemma3ForConditionalGeneration | Gemma 3 4B and up: the text decoder (four norms a layer, q/k norms, sliding-window layers) beside a vision tower that text rows never run, its template (the system text opens the first user turn), `<end_of_turn>` as a stop token |
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from labkit.data.tickets import generate_tickets
from labkit.errors import ModelSourceError
from labkit.model.saving import save_folder


CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Gemma 2's instruction template, as google/gemma-2-*-it ship it (the system role refused, the BOS written)
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)
# Gemma 3's instruction template, as google/gemma-3-*-it ship it (the system text opens the first user turn, the BOS
# written, image parts as <start_of_image>)
GEMMA3 = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = \"\" -%}"
    "{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}{%- set role = 'model' -%}{%- else -%}"
    "{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}{%- elif item['type'] == 'text' -%}"
    "{{ item['text'] | trim }}{%- endif -%}{%- endfor -%}{%- else -%}{{ raise_exception('Invalid content type') }}"
    "{%- endif -%}{{ '<end_of_turn>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}"
    "{{'<start_of_turn>model\n'}}{%- endif -%}"
)
# Qwen3's chat template as Qwen/Qwen3-* ship it, without its tools branch: the last assistant turn opens with an
# empty think block unless `enable_thinking=False` puts that block at the end of the generation prompt
QWEN3 = (
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>"
    "\\n' }}{%- endif %}{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1)"
    ' %}{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}{%- if '
    'ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.'
    "startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}{%- set ns.multi_s"
    'tep_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}{%- for message in'
    ' messages %}{%- if message.content is string %}{%- set content = message.content %}{%- else %}{%- se'
    't content = \'\' %}{%- endif %}{%- if (message.role == "user") or (message.role == "system" and not lo'
    "op.first) %}{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}{%- elif mess"
    'age.role == "assistant" %}{%- set reasoning_content = \'\' %}{%- if message.reasoning_content is strin'
    "g %}{%- set reasoning_content = message.reasoning_content %}{%- else %}{%- if '</think>' in content "
    "%}{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip("
    "'\\n') %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}{%- endif %}{%- i"
    'f loop.index0 > ns.last_query_index %}{%- if loop.last or (not loop.last and reasoning_content) %}{{'
    "- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' +"
    " content.lstrip('\\n') }}{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}{{- '<|im_end|>\\n' }}{%-"
    " endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_t"
    "hinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- en"
    'dif %}'
)
# A template in the Phi-3 / Phi-4-mini instruction style (written here, not copied from a hub file): each turn closes
# with <|end|> (a stop token of the model, not the tokenizer's EOS), a training text with the EOS after the last turn
PHI4 = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}"
)
# A template in the EXAONE 3.5 / 4 style (written here, not copied from a hub file): an empty system turn when the
# conversation has none, a user turn closed by a newline, every other turn by [|endofturn|] (the tokenizer's EOS) and
# a newline after it
EXAONE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "{{ '[|system|][|endofturn|]\n' }}{% endif %}{{ '[|' + message['role'] + '|]' + message['content'] }}"
    "{% if message['role'] == 'user' %}{{ '\n' }}{% else %}{{ '[|endofturn|]\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '[|assistant|]' }}{% endif %}"
)
# A template in the Command R / Aya Expanse style (written here, not copied from a hub file): the BOS written, each turn
# between <|START_OF_TURN_TOKEN|> and <|END_OF_TURN_TOKEN|> (the tokenizer's EOS) with a role token, no newlines
COHERE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}{% set role = 'CHATBOT' %}"
    "{% else %}{% set role = message['role'] | upper %}{% endif %}"
    "{{ '<|START_OF_TURN_TOKEN|><|' + role + '_TOKEN|>' + message['content'] + '<|END_OF_TURN_TOKEN|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_LLAMA = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2}
# per name: the transformers config class, its sizes, the tokenizer's vocabulary, special tokens (bos, eos, pad),
# whether the tokenizer has the ChatML template, extra embedding rows past the tokenizer, extra config keys
SIZES = {
    "llama": {"arch": "Llama", **_LLAMA, "vocab": 600},
    "llama-wide": {"arch": "Llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "vocab": 1000},
    "llama3": {"arch": "Llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
               "num_attention_heads": 8, "num_key_value_heads": 2, "vocab": 600, "pad_rows": 40,
               "tie_word_embeddings": False, "rope_theta": 500000.0},
    "mistral": {"arch": "Mistral", **_LLAMA, "vocab": 600, "sliding_window": 64, "tie_word_embeddings": False,
                "template": False, "special": ["<|endoftext|>"], "tokens": ("<|endoftext|>", "<|endoftext|>", None)},
    "qwen2": {"arch": "Qwen2", **_LLAMA, "vocab": 600, "pad_rows": 24},
    "phi": {"arch": "Phi", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
            "partial_rotary_factor": 0.5, "vocab": 600, "template": False, "special": ["<|endoftext|>"],
            "tokens": ("<|endoftext|>", "<|endoftext|>", "<|endoftext|>"), "tie_word_embeddings": False},
    "phi3": {"arch": "Phi3", **_LLAMA, "vocab": 600, "partial_rotary_factor": 0.75, "template": PHI4,
             "special": ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"], "stops": ["<|end|>"],
             "tokens": ("<|endoftext|>", "<|endoftext|>", "<|endoftext|>")},
    "olmo2": {"arch": "Olmo2", **_LLAMA, "vocab": 600, "tie_word_embeddings": False},
    "olmo3": {"arch": "Olmo3", **_LLAMA, "vocab": 600, "tie_word_embeddings": False, "sliding_window": 64,
              "layer_types": ["sliding_attention", "full_attention"]},
    "exaone4": {"arch": "Exaone4", **_LLAMA, "vocab": 600, "sliding_window": 64, "sliding_window_pattern": 2,
                "template": EXAONE, "special": ["<|endoftext|>", "[PAD]", "[BOS]", "[|system|]", "[|user|]",
                                                "[|assistant|]", "[|endofturn|]"],
                "tokens": ("[BOS]", "[|endofturn|]", "[PAD]")},
    "cohere": {"arch": "Cohere", **_LLAMA, "vocab": 600, "logit_scale": 0.125, "template": COHERE, "add_bos": True,
               "special": ["<|endoftext|>", "<PAD>", "<BOS_TOKEN>", "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>",
                           "<|SYSTEM_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>"],
               "tokens": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "<PAD>")},
    "glm4": {"arch": "Glm4", **_LLAMA, "head_dim": 16, "vocab": 600, "tie_word_embeddings": False},
    # Seed-OSS 36B: its config's dropout (attention probabilities and each sublayer's output, 0.1) is on in training
    "seed-oss": {"arch": "SeedOss", **_LLAMA, "head_dim": 32, "vocab": 600, "tie_word_embeddings": False,
                 "attention_dropout": 0.1, "residual_dropout": 0.1},
    "stablelm": {"arch": "StableLm", **_LLAMA, "vocab": 600, "use_qkv_bias": True, "tie_word_embeddings": False},
    "starcoder2": {"arch": "Starcoder2", **_LLAMA, "vocab": 600, "sliding_window": 64, "embedding_dropout": 0.1,
                   "attention_dropout": 0.1, "residual_dropout": 0.1},
    "arcee": {"arch": "Arcee", **_LLAMA, "vocab": 600, "tie_word_embeddings": False},
    "ernie": {"arch": "Ernie4_5", **_LLAMA, "head_dim": 32, "vocab": 600},
    "qwen3": {"arch": "Qwen3", **_LLAMA, "head_dim": 32, "vocab": 600, "template": QWEN3, "added": ["<think>", "</think>"]},
    # a mixture of experts (Qwen3-30B-A3B's shape): 4 experts of which 2 run per token, fused in 3-D expert tensors
    "qwen3moe": {"arch": "Qwen3Moe", **_LLAMA, "head_dim": 32, "moe_intermediate_size": 32, "num_experts": 4,
                 "num_experts_per_tok": 2, "vocab": 600, "template": QWEN3, "added": ["<think>", "</think>"]},
    "gemma2": {"arch": "Gemma2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "query_pre_attn_scalar": 32,
               "sliding_window": 64, "vocab": 600, "template": GEMMA, "add_bos": True, "stops": ["<end_of_turn>"],
               "special": ["<|endoftext|>", "<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
               "tokens": ("<bos>", "<eos>", "<pad>")},
    # Gemma 3 4B and up: the text decoder inside Gemma3ForConditionalGeneration, beside a SigLIP vision tower
    "gemma3": {"arch": "Gemma3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "query_pre_attn_scalar": 32,
               "sliding_window": 64, "vocab": 600, "template": GEMMA3, "add_bos": True, "stops": ["<end_of_turn>"],
               "special": ["<|endoftext|>", "<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>",
                           "<start_of_image>"],
               "tokens": ("<bos>", "<eos>", "<pad>"),
               "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                          "image_size": 28, "patch_size": 14}},
}


def _corpus() -> list[str]:
    """Fixture text: built-in tickets and their answers, plus the chat scaffolding words."""
    records, _ = generate_tickets(rows=300, seed=0)
    lines = [r["text"] for r in records] + [r["answer"] for r in records]
    lines += ["system user assistant Reply with one JSON object and nothing else. Ticket:"] * 20
    return lines


def build_tiny(name: str, out: Path) -> None:
    """Build tiny:<name> (a random-init model of SIZES[name]'s architecture and a BPE tokenizer) into `out`, atomically.

    Args:
        name: a key of SIZES.
        out: target folder (replaced).
    """
    if name not in SIZES:
        raise ModelSourceError(f"tiny:{name}: unknown tiny model (expected one of {', '.join(SIZES)})")
    size = dict(SIZES[name])
    arch, vocab, pad_rows = size.pop("arch"), size.pop("vocab"), size.pop("pad_rows", 0)
    special = size.pop("special", SPECIAL)
    bos, eos, pad = size.pop("tokens", ("<|im_start|>", "<|im_end|>", "<|im_end|>"))
    template, add_bos, stops = size.pop("template", True), size.pop("add_bos", False), size.pop("stops", [])
    added = size.pop("added", [])
    bpe = Tokenizer(models.BPE(unk_token="<|endoftext|>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    if add_bos:  # the tokenizer itself starts every text with the BOS (Gemma's, Llama's)
        bpe.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                          special_tokens=[(bos, bpe.token_to_id(bos))])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=bos, eos_token=eos, pad_token=pad,
                                        unk_token="<|endoftext|>")
    tokenizer.add_tokens(added)  # ordinary added tokens (Qwen3's <think>, </think>): decoding keeps them
    if template:
        tokenizer.chat_template = template if isinstance(template, str) else CHATML
    config_class = getattr(transformers, f"{arch}Config")
    size.setdefault("tie_word_embeddings", True)
    vision = size.pop("vision", None)
    ids = {"bos_token_id": tokenizer.bos_token_id, "pad_token_id": tokenizer.pad_token_id,
           "eos_token_id": [tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(stops)] if stops
           else tokenizer.eos_token_id}
    text = {"vocab_size": len(tokenizer) + pad_rows, "max_position_embeddings": 2048, **ids, **size}
    if vision:  # a multimodal model: its text decoder's config inside, a vision tower beside it
        config, model_class = config_class(text_config=text, vision_config=vision, mm_tokens_per_image=4, **ids), \
            f"{arch}ForConditionalGeneration"
    else:
        config, model_class = config_class(**text), f"{arch}ForCausalLM"
    torch.manual_seed(0)
    save_folder(getattr(transformers, model_class)(config), tokenizer, out)
