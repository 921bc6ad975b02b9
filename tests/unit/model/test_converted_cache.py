"""The converted-model cache is verified, not trusted: a tampered or truncated tensor file is found and converted
again from the GGUF; a conversion that cannot be written fails naming the folder and the fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter
from safetensors.numpy import load_file, save_file

from labkit.core.integrity import verify_folder
from labkit.model.sources import META, resolve
from labkit.model.tiny import build_tiny

_PARTS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}


def tiny_gguf(path: Path) -> Path:
    """A real GGUF file (float32) of labkit's tiny Llama and its byte-level BPE tokenizer, as llama.cpp names them."""
    folder = path.parent / "tiny-llama-hf"
    build_tiny("llama", folder)
    cfg = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab = {**tok["model"]["vocab"], **{a["content"]: a["id"] for a in tok.get("added_tokens", [])}}
    writer = GGUFWriter(str(path), "llama")
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_dimension_count(cfg["hidden_size"] // cfg["num_attention_heads"])
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])])
    writer.add_token_types([1] * len(vocab))
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    writer.add_bos_token_id(cfg["bos_token_id"])
    writer.add_eos_token_id(cfg["eos_token_id"])
    for name, array in load_file(str(folder / "model.safetensors")).items():
        if name.startswith("model.layers."):
            _, _, layer, *rest = name.split(".")
            name = f"blk.{layer}.{_PARTS['.'.join(rest[:-1])]}.weight"
        writer.add_tensor(_NAMES.get(name, name), array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def gguf(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    return tiny_gguf(tmp_path / "tiny.gguf")


def test_a_zeroed_tensor_in_the_cache_is_found_and_converted_again(gguf: Path, capsys) -> None:
    first = resolve(str(gguf))
    weights = Path(first.location) / "model.safetensors"
    original = weights.read_bytes()
    tensors = load_file(str(weights))
    name = next(n for n in tensors if n.endswith("q_proj.weight"))
    tensors[name] = np.zeros_like(tensors[name])  # same size, other weights
    save_file(tensors, str(weights), metadata={"format": "pt"})
    assert weights.stat().st_size == len(original) and weights.read_bytes() != original
    assert "model.safetensors changed" in verify_folder(Path(first.location), json.loads(
        (Path(first.location) / META).read_text())["files"], skip=(META,))
    second = resolve(str(gguf))
    assert second.revision == first.revision and weights.read_bytes() == original, "converted again from the GGUF"
    assert f"the converted model in {first.location} is not what labkit wrote" in capsys.readouterr().err
    recorded = json.loads((Path(second.location) / META).read_text())["files"]
    assert verify_folder(Path(second.location), recorded, skip=(META,)) is None


def test_a_truncated_file_is_found_without_hashing_and_converted_again(gguf: Path) -> None:
    first = resolve(str(gguf))
    weights = Path(first.location) / "model.safetensors"
    original = weights.read_bytes()
    weights.write_bytes(original[: len(original) // 2])
    resolve(str(gguf))
    assert weights.read_bytes() == original


def test_an_unchanged_cache_is_used_as_it_is(gguf: Path, capsys) -> None:
    first = resolve(str(gguf))
    stamp = os.stat(Path(first.location) / "model.safetensors").st_mtime_ns
    resolve(str(gguf))
    assert os.stat(Path(first.location) / "model.safetensors").st_mtime_ns == stamp
    assert "converting it again" not in capsys.readouterr().err
