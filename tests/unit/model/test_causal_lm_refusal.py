"""`causal_lm_refusal`: which configs transformers cannot build as a causal LM, and the fix each message gives — a
vision-language checkpoint whose text decoder is one (Mistral Small 3.1 and Ministral 3 ship as `mistral3`) is told
to use a text-only copy of it; an encoder-decoder is told to use a decoder-only model."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers
from conftest import MISTRAL3_REFUSAL, mistral3_card

from labkit.card.load import load_card
from labkit.errors import ModelSourceError
from labkit.model.loading import causal_lm_refusal, load_model
from labkit.model.sources import resolve

TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 600}


def test_causal_lms_and_multimodal_models_transformers_loads_as_one_pass() -> None:
    for config in (transformers.LlamaConfig(**TEXT), transformers.Ministral3Config(**TEXT, head_dim=16),
                   transformers.Gemma3Config(text_config=TEXT)):  # Gemma 3 4B and up: a causal LM with a vision tower
        assert causal_lm_refusal(config) is None, type(config).__name__


def test_a_vision_language_checkpoint_is_pointed_at_its_text_decoder() -> None:
    config = transformers.Mistral3Config(text_config={"model_type": "ministral3", **TEXT, "head_dim": 16})
    why = causal_lm_refusal(config)
    assert why == ("its config is mistral3 (Mistral3Config), which transformers does not load as a causal LM "
                   "(AutoModelForCausalLM); its text decoder (ministral3) is one: point model.source at a text-only "
                   "copy of it")


def test_an_encoder_decoder_is_pointed_at_a_decoder_only_model() -> None:
    why = causal_lm_refusal(transformers.T5Config(d_model=64, num_layers=1, num_heads=2, vocab_size=600))
    assert why is not None and why.startswith("its config is t5 (T5Config)")
    assert why.endswith(": point model.source at a decoder-only language model")


def test_a_repositorys_own_causal_lm_class_is_left_to_trust_remote_code() -> None:
    config = transformers.T5Config(d_model=64, num_layers=1, num_heads=2, vocab_size=600)
    config.auto_map = {"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    assert causal_lm_refusal(config) is None  # from_config(trust_remote_code=…) decides, as the card says


def test_loading_a_vision_language_checkpoint_says_what_to_load_instead(tmp_path: Path) -> None:
    """The stage-01 path of a hub checkpoint whose config no check could read offline: the loader reads the config and
    refuses with the fix before it reads (or downloads) a weight."""
    card = load_card(str(mistral3_card(tmp_path))).card
    for name in tmp_path.joinpath("mistral3").glob("*.safetensors"):
        name.unlink()  # never read: the refusal comes first
    with pytest.raises(ModelSourceError) as refused:
        load_model(resolve(card.model.source), card, "cpu")
    assert str(refused.value) == f"model.source {card.model.source}: {MISTRAL3_REFUSAL}"
