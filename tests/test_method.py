"""Methods on the tiny model: what is trainable, seeded adapter init, and a target list that matches nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from labkit.cards import load_card
from labkit.loading import load_model
from labkit.method import MethodError, apply_method, matched_modules, parameter_table

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def card():
    return load_card(REPO / "params" / "smoke.yaml").card.model_copy(deep=True)


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
    card.method.target_modules = ["qkv_proj"]
    with pytest.raises(MethodError, match=r"method.target_modules .*q_proj"):
        apply_method(load_model(tiny_model, card, "cpu"), card)


def test_full_method_trains_everything(card, tiny_model) -> None:
    from labkit.config import Full

    card.method = Full(kind="full")
    model = apply_method(load_model(tiny_model, card, "cpu"), card)
    assert all(p.requires_grad for p in model.parameters())


def _check(card, tiny_model, steps: int = 2) -> dict:
    import tempfile

    from labkit import data as D
    from labkit.loading import load_tokenizer
    from labkit.training import build_trainer, update_check

    rows = [r for r in D.map_fields(card, D.load_source(card)[0]) if r["input"].strip()][:8]
    model = apply_method(load_model(tiny_model, card, "cpu"), card)
    trainer = build_trainer(card, model, load_tokenizer(tiny_model, card), rows, Path(tempfile.mkdtemp()),
                            device="cpu", max_steps=steps, lr_scheduler_type="constant", warmup_steps=0,
                            disable_tqdm=True)
    return update_check(trainer, steps=steps)


def test_update_check_lora_needs_two_steps(card, tiny_model) -> None:
    one = _check(card, tiny_model, steps=1)
    # B starts at zero, so A gets no gradient on the first step: reported, not passed
    assert not one["ok"] and one["unchanged_trainable"] and all("lora_A" in n for n in one["unchanged_trainable"])
    two = _check(card, tiny_model, steps=2)
    assert two["ok"] and two["changed"] == two["trainable"] and not two["changed_frozen"]


def test_update_check_qlora_on_cpu(card, tiny_model) -> None:
    from labkit.config import Qlora

    card.method = Qlora(kind="qlora", r=4, alpha=8, dropout=0.0)
    result = _check(card, tiny_model)
    assert result["ok"], result["unchanged_trainable"] + result["changed_frozen"]
    quantised = [t for t in result["tensors"] if t["dtype"] == "uint8"]
    assert quantised and not any(t["changed"] for t in quantised)  # 4-bit weights bit-for-bit unchanged
