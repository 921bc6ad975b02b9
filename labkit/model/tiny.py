"""A tiny Llama and a tokenizer trained on built-in text, made offline in seconds.

Used by `tiny:<name>` model sources (tests, smoke cards): the whole pipeline runs for real on a
model of a few hundred thousand parameters, with a ChatML chat template like SmolLM2's.
"""

from __future__ import annotations

from pathlib import Path

from labkit.data.tickets import generate_tickets
from labkit.errors import ModelSourceError
from labkit.model.saving import save_folder

# tokenizers, torch, transformers take seconds to import: imported inside the functions that use them, so `labkit`
# commands and card checks start fast

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SIZES = {
    "llama": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab": 600},
    "llama-wide": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "vocab": 1000},
}


def _corpus() -> list[str]:
    """Fixture text: built-in tickets and their answers, plus the chat scaffolding words."""
    records, _ = generate_tickets(rows=300, seed=0)
    lines = [r["text"] for r in records] + [r["answer"] for r in records]
    lines += ["system user assistant Reply with one JSON object and nothing else. Ticket:"] * 20
    return lines


def build_tiny(name: str, out: Path) -> None:
    """Build tiny:<name> (a random-init Llama and a BPE tokenizer) into `out`, atomically.

    Args:
        name: a key of SIZES.
        out: target folder (replaced).
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if name not in SIZES:
        raise ModelSourceError(f"tiny:{name}: unknown tiny model (expected one of {', '.join(SIZES)})")
    size = dict(SIZES[name])
    vocab = size.pop("vocab")
    bpe = Tokenizer(models.BPE(unk_token="<|endoftext|>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>",
        unk_token="<|endoftext|>")
    tokenizer.chat_template = CHATML
    config = LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **size)
    torch.manual_seed(0)
    save_folder(LlamaForCausalLM(config), tokenizer, out)
