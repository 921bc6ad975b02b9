"""A mixture of experts (tiny:qwen3moe, Qwen3-30B-A3B's layout: experts fused in 3-D tensors, a top-k router) through
what differs from a dense model: PEFT adapts the experts (and the router's weight) as parameters, which stage 03's
table must show; TRL adds the router's load-balancing loss, a per-micro-batch statistic that the accumulation check
leaves out; the experts are saved one tensor per expert, which the merged-weights check must name as saved. And what
`labkit estimate` says of such a model: QLoRA leaves the experts unquantised, LoRA on them keeps merged copies."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from labkit.card.update import updated
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method, matched_modules
from labkit.model.sources import resolve
from labkit.preflight.comparisons import accumulation_check
from labkit.preflight.shared import SharedModel
from labkit.export.reload_check import merged_tensors


@pytest.fixture(scope="module")
def moe():
    return resolve("tiny:qwen3moe")


@pytest.fixture
def moe_card(card):
    return updated(card, {"model.source": "tiny:qwen3moe",
                          "data.prompt.chat_template_kwargs": {"enable_thinking": False}})


def _rows(table: list[dict]) -> dict[str, tuple[int, int]]:
    return {r["module"]: (r["layers"], r["adapted"]) for r in table}


def test_the_table_shows_the_experts_and_the_router_adapted_as_parameters(moe, moe_card) -> None:
    table = _rows(matched_modules(apply_method(load_model(moe, moe_card, "cpu"), moe_card)))
    # peft's all-linear keeps transformers 4's meaning: every expert projection and the router's weight
    assert table["mlp.experts.gate_up_proj"] == table["mlp.experts.down_proj"] == table["mlp.gate.weight"] == (2, 2)
    assert table["self_attn.q_proj"] == (2, 2) and table["lm_head"] == (1, 0)
    card = updated(moe_card, {"method.target_modules": ["q_proj", "v_proj"]})
    table = _rows(matched_modules(apply_method(load_model(moe, card, "cpu"), card)))
    assert table["mlp.experts.gate_up_proj"] == (2, 0) and table["self_attn.q_proj"] == (2, 2)  # shown, not adapted


def test_accumulation_is_checked_without_the_load_balancing_loss(moe, moe_card, rows) -> None:
    shared = SharedModel(apply_method(load_model(moe, moe_card, "cpu"), moe_card))
    text = shared.model.config.get_text_config()
    before = (text.output_router_logits, text.router_aux_loss_coef)
    result = accumulation_check(moe_card, shared, load_tokenizer(moe, moe_card), rows, micro_batch=4, accum=2)
    assert result["ok"] and result["relative_difference"] < 1e-5, result
    assert "load-balancing (router aux) loss is off in both arms" in result["load_balancing"]
    assert "at coefficient 0.001" in result["load_balancing"]  # Qwen3-MoE's own, which training keeps
    assert (text.output_router_logits, text.router_aux_loss_coef) == before  # the shared model's config as it was


def test_the_merged_experts_are_named_as_saved(moe, moe_card, tmp_path: Path) -> None:
    model = apply_method(load_model(moe, moe_card, "cpu"), moe_card)
    model.merge_adapter()
    names = set(merged_tensors(model))
    model.unmerge_adapter()
    model.merge_and_unload().save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as handle:
        saved = set(handle.keys())
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in saved  # one tensor per expert on disk
    assert saved <= names, sorted(saved - names)[:5]


def test_lora_on_the_experts_saves_a_merged_copy_of_them_for_the_backward(moe, moe_card) -> None:
    """What `labkit estimate` says of LoRA on fused experts: the expert weights autograd keeps for the backward are new
    tensors (W + BA), not the parameters, whereas frozen experts are kept as the parameters themselves (no copy)."""
    def kept(card) -> list[bool]:
        """For each expert-sized tensor the MoE block saves for the backward: is it a parameter (else a new tensor)?"""
        model = apply_method(load_model(moe, card, "cpu"), card)
        params = {p.data_ptr() for n, p in model.named_parameters() if ".lora_" not in n}
        sizes = {p.numel() for n, p in model.named_parameters() if ".experts." in n and p.dim() == 3 and ".lora_" not in n}
        lora = {p.data_ptr() for n, p in model.named_parameters() if ".lora_" in n}
        saved: list = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            model.get_base_model().model.layers[0].mlp(torch.randn(2, 8, model.config.hidden_size, requires_grad=True))
        return [t.data_ptr() in params for t in saved if t.numel() in sizes and t.data_ptr() not in lora]

    assert kept(updated(moe_card, {"method.target_modules": ["q_proj"]})) == [True, True]  # the parameters themselves
    assert kept(moe_card) == [False, False]  # all-linear: gate_up_proj's and down_proj's merged copies
    assert estimate_experts(moe, moe_card)["adapted"] and not estimate_experts(
        moe, updated(moe_card, {"method.target_modules": ["q_proj"]}))["adapted"]


def estimate_experts(moe, card) -> dict:
    from transformers import AutoConfig

    from labkit.preflight.memory import estimate_step

    return estimate_step(AutoConfig.from_pretrained(moe.location), card, 32)["experts"]


def test_qlora_leaves_the_fused_experts_unquantised(moe, moe_card) -> None:
    """What `labkit estimate` says of QLoRA on an MoE: bitsandbytes makes the Linear layers 4-bit, not the experts'
    3-D parameters, and the estimate counts them so."""
    from labkit.card.schema import Qlora

    card = updated(moe_card, {"method": Qlora(kind="qlora", r=4, alpha=8, dropout=0.0)})
    dtypes = {n: p.dtype for n, p in load_model(moe, card, "cpu").named_parameters()}
    assert dtypes["model.layers.0.self_attn.q_proj.weight"] == torch.uint8  # 4-bit codes
    assert dtypes["model.layers.0.mlp.experts.gate_up_proj"] == dtypes["model.layers.0.mlp.experts.down_proj"] \
        == torch.float32  # the card's dtype, untouched
    experts = estimate_experts(moe, card)
    assert experts["parameters"] == sum(p.numel() for n, p in load_model(moe, moe_card, "cpu").named_parameters()
                                        if n.endswith(("experts.gate_up_proj", "experts.down_proj")))
    assert experts["bytes"] == 4 * experts["parameters"]  # float32 (k-bit preparation's upcast of what is not 4-bit)
