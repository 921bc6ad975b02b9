"""Methods on the tiny model: what is trainable, seeded adapter init, target names/regex, a target list that matches
nothing, and a multimodal model's vision tower left out of all-linear and of full fine-tuning."""

from __future__ import annotations

import pytest
import torch
from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.errors import MethodError
from labkit.model.loading import load_model
from labkit.model.method import apply_method, matched_modules, parameter_table


@pytest.fixture
def card():
    return load_card(REPO / "params" / "smoke.yaml").card


def test_lora_all_linear_and_seeded_init(card, tiny_model) -> None:
    a = apply_method(load_model(tiny_model, card, "cpu"), card)
    b = apply_method(load_model(tiny_model, card, "cpu"), card)
    lora_a = {n: p for n, p in a.named_parameters() if "lora_A" in n}
    assert lora_a and all(torch.equal(p, dict(b.named_parameters())[n]) for n, p in lora_a.items())
    table = {r["kind"]: r for r in parameter_table(a)}
    assert table["total"]["trainable"] == sum(p.numel() for p in a.parameters() if p.requires_grad)
    assert all(r["trainable"] == 0 for k, r in table.items() if "lora_" not in k and k != "total")
    adapted = {r["module"]: r for r in matched_modules(a)}
    assert adapted["self_attn.q_proj"]["adapted"] == adapted["self_attn.q_proj"]["layers"] == 2
    assert adapted["lm_head"]["adapted"] == 0


def test_target_modules_that_match_nothing(card, tiny_model) -> None:
    card = updated(card, {"method.target_modules": ["qkv_proj"]})
    with pytest.raises(MethodError, match=r"method.target_modules .*q_proj"):
        apply_method(load_model(tiny_model, card, "cpu"), card)


def test_full_method_trains_everything(card, tiny_model) -> None:
    from labkit.card.schema import Full

    card = updated(card, {"method": Full(kind="full")})
    model = apply_method(load_model(tiny_model, card, "cpu"), card)
    assert all(p.requires_grad for p in model.parameters())


def test_target_modules_regex(card, tiny_model) -> None:
    card = updated(card, {"method.target_modules": r".*\.(q|v)_proj"})
    model = apply_method(load_model(tiny_model, card, "cpu"), card)
    adapted = {r["module"]: r["adapted"] for r in matched_modules(model)}
    assert adapted["self_attn.q_proj"] == adapted["self_attn.v_proj"] == 2
    assert adapted["self_attn.k_proj"] == adapted["mlp.up_proj"] == 0


def test_target_modules_bad_regex_is_a_card_error(repo, tmp_path) -> None:
    from labkit.errors import CardError

    text = (repo / "params" / "smoke.yaml").read_text().replace("target_modules: all-linear", "target_modules: '.*(q_proj'")
    assert "(q_proj" in text
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(CardError, match=r"bad.yaml:\d+: method\.target_modules: not a valid regular expression"):
        load_card(path)


def _gradients(model, batch) -> dict:
    model.train()
    model.zero_grad()
    model(**batch, labels=batch["input_ids"]).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_qlora_trains_the_same_after_an_evaluation_pass_on_the_cpu(card, tiny_model) -> None:
    """An evaluation forward (eval mode, no grad) must not change the next training step's gradients: bitsandbytes
    would otherwise switch a CPU with AVX512-BF16 to its inference layout, whose matmul has no backward."""
    card = updated(card, {"method.kind": "qlora"})
    model = apply_method(load_model(tiny_model, card, "cpu"), card)
    batch = {"input_ids": torch.randint(3, 60, (2, 12), generator=torch.Generator().manual_seed(0))}
    before = _gradients(model, batch)
    model.eval()
    with torch.no_grad():
        model(**batch)
    after = _gradients(model, batch)
    assert before.keys() == after.keys() and any(".lora_B." in n for n in before)
    assert all(torch.equal(before[n], after[n]) for n in before), \
        [n for n in before if not torch.equal(before[n], after[n])][:3]


def test_qlora_already_in_the_cpu_inference_layout_is_refused(card, tiny_model) -> None:
    """A 4-bit model that took bitsandbytes' CPU inference layout before the method was applied cannot train
    through its 4-bit layers: applying the method says so instead of training on it."""
    card = updated(card, {"method.kind": "qlora"})
    model = load_model(tiny_model, card, "cpu")
    if not any(getattr(m, "support_avx512bf16_for_cpu", False) for m in model.modules()):
        pytest.skip("this CPU has no AVX512-BF16: bitsandbytes never takes its CPU inference layout")
    model.eval()
    with torch.no_grad():
        model(input_ids=torch.tensor([[3, 4, 5, 6]]))
    with pytest.raises(MethodError, match="inference layout"):
        apply_method(model, card)


def test_a_vision_tower_is_left_out_of_all_linear_and_of_full_training(card) -> None:
    """tiny:gemma3 is Gemma3ForConditionalGeneration (a vision tower beside the text decoder, as Gemma 3 4B and up):
    text rows never run the tower, so all-linear adapts the text decoder's linears alone and full fine-tuning leaves
    the tower frozen; module names the tower shares still reach it (the card says so)."""
    from labkit.model.sources import resolve

    tiny = resolve("tiny:gemma3")
    lora = apply_method(load_model(tiny, card, "cpu"), card)
    adapted = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert len(adapted) == 2 * 2 * 7 and all(".language_model.layers." in n for n in adapted)  # A, B × 2 layers × 7
    assert lora.peft_config["default"].target_modules == (
        r"model\.language_model\..*\.(?:down_proj|gate_proj|k_proj|o_proj|q_proj|up_proj|v_proj)")
    named = apply_method(load_model(tiny, card, "cpu"), updated(card, {"method.target_modules": ["q_proj"]}))
    assert any("vision_tower" in n for n, p in named.named_parameters() if p.requires_grad)
    full = apply_method(load_model(tiny, card, "cpu"), updated(card, {"method": {"kind": "full"}}))
    trains = {n: p.requires_grad for n, p in full.named_parameters()}
    assert not any(v for n, v in trains.items() if "vision_tower" in n or "multi_modal_projector" in n)
    assert all(v for n, v in trains.items() if "language_model" in n)
