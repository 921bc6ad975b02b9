"""Phi in float16: labkit's eager attention with float32 scores (`labkit.model.attention`) stays finite where
transformers' own Phi eager attention overflows, equals it where nothing overflows, and is what `load_model` picks."""

from __future__ import annotations

import torch
from conftest import REPO
from transformers import AutoModelForCausalLM
from transformers.models.phi.modeling_phi import eager_attention_forward as phi_eager

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.model.attention import FP32_SCORES, eager_fp32_scores, register
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.sources import resolve


class _Module(torch.nn.Module):
    num_key_value_groups = 1


def test_float32_scores_stay_finite_where_phi_eager_attention_overflows_float16() -> None:
    torch.manual_seed(0)
    query = (300 * torch.ones(1, 2, 3, 64) + torch.randn(1, 2, 3, 64)).half()  # Phi-2's queries reach a few hundred
    key, value = query.clone(), torch.randn(1, 2, 3, 64).half()
    mask = torch.triu(torch.full((3, 3), torch.finfo(torch.float16).min), 1).half()[None, None]
    module = _Module().eval()
    theirs, _ = phi_eager(module, query, key, value, mask, scaling=64 ** -0.5)
    assert not torch.isfinite(theirs).all()  # 300·300·64 / 8 = 720000 > 65504: inf scores, NaN probabilities
    ours, probabilities = eager_fp32_scores(module, query, key, value, mask, scaling=64 ** -0.5)
    assert ours.dtype == torch.float16 and torch.isfinite(ours).all() and ours.shape == (1, 3, 2, 64)
    reference, _ = phi_eager(module, query.float(), key.float(), value.float(), mask.float(), scaling=64 ** -0.5)
    assert torch.allclose(ours.float(), reference, atol=1e-2)
    assert torch.allclose(probabilities.float().sum(-1), torch.ones(1, 2, 3), atol=1e-3)


def test_a_phi_model_computes_the_same_with_float32_scores_as_with_eager_attention() -> None:
    location = resolve("tiny:phi").location
    register()
    eager = AutoModelForCausalLM.from_pretrained(location, attn_implementation="eager").eval()
    ours = AutoModelForCausalLM.from_pretrained(location, attn_implementation=FP32_SCORES).eval()
    assert ours.config._attn_implementation == FP32_SCORES
    ids = torch.tensor([[0, 0, 5, 9, 14, 20], [3, 7, 5, 9, 14, 20]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])  # left padding, as evaluation batches
    with torch.no_grad():
        expected = eager(input_ids=ids, attention_mask=mask).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(got[:, 2:], expected[:, 2:], atol=1e-5)
    assert torch.allclose(got[1], expected[1], atol=1e-5)


def test_load_model_gives_phi_in_float16_float32_scores_and_other_models_their_kernel() -> None:
    base = load_card(REPO / "params" / "smoke.yaml").card
    phi = updated(base, {"model.source": "tiny:phi", "model.dtype": "float16", "data.prompt.format": "plain"})
    source = resolve("tiny:phi")
    model = load_model(source, phi, "cpu")
    assert model.config._attn_implementation == FP32_SCORES and model.dtype == torch.float16
    assert model.labkit_decisions["attention"] == FP32_SCORES
    tokenizer = load_tokenizer(source, phi)
    with torch.no_grad():
        logits = model(**tokenizer(["Ticket: the printer is broken"], return_tensors="pt")).logits
    assert torch.isfinite(logits).all()
    fp32 = load_model(source, updated(phi, {"model.dtype": "float32"}), "cpu")
    assert fp32.config._attn_implementation == "sdpa" and fp32.labkit_decisions["attention"] == "sdpa"
    llama = load_model(resolve("tiny:llama"), updated(base, {"model.dtype": "float16"}), "cpu")
    assert llama.config._attn_implementation == "sdpa"
