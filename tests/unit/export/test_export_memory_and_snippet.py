"""The export's memory (stated, refused with the number) and the snippet's prompt (the training prompt, token for token)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.data.prompting import prompt_ids
from labkit.errors import ExportRefused
from labkit.export.merge import ensure_fits
from labkit.export.snippet import prompt_lines
from labkit.model.sources import resolve
from labkit.preflight.export_memory import GIB, export_dtype, export_estimate, refusal, smaller_dtype
from labkit.preflight.sizing import estimate_config, gpu_profile

EXAMPLES = REPO / "params" / "examples"


def _sized(name: str, gib: float, capability: str):
    path = EXAMPLES / f"{name}.yaml"
    card = load_card(path).card
    return card, export_estimate(estimate_config(card, path), card, card.data.max_length, gpu_profile(gib, capability))


def test_qlora_export_merges_and_saves_in_the_4bit_compute_dtype() -> None:
    card, t4 = _sized("dialogsum-phi2-qlora-sft", 16, "7.5")
    _, a10 = _sized("dialogsum-phi2-qlora-sft", 24, "8.6")
    assert t4["dtype"] == "float16" and a10["dtype"] == "bfloat16"  # never the float32 base
    assert export_dtype(card, gpu_profile(16, "7.5")) == "float16"


def test_8b_export_fits_the_24_gib_card_training_fits() -> None:
    """Llama 3 8B: the 16-bit weights (~15 GiB) and one row's logits, not a float32 base (~30 GiB)."""
    _, need = _sized("dialogsum-llama3-8b-qlora-sft", 24, "8.9")
    weights = need["breakdown"]["weights_export_dtype"]
    assert 14 * GIB < weights < 16 * GIB  # 8.0e9 parameters × 2 bytes
    assert need["peak_bytes"] < 20 * GIB and need["peak_bytes"] >= weights + need["breakdown"]["generation"]
    assert need["phase"] == "merge" and need["reload_bytes"] < need["merge_bytes"]


def test_refusal_names_both_numbers_in_one_line() -> None:
    line = refusal(20 * GIB, 7.5 * GIB, "cuda:0")
    assert line is not None and "\n" not in line
    assert "needs 20.00 GiB on cuda:0" in line and "7.50 GiB are free" in line
    assert refusal(7 * GIB, 7.5 * GIB, "cuda:0") is None


def test_ensure_fits_refuses_before_loading_when_memory_is_short(tiny_model) -> None:
    card = load_card(REPO / "params" / "smoke.yaml").card
    need = ensure_fits(tiny_model, card, 120, "cpu", available=10 * GIB)
    assert need["dtype"] == "float32" and 0 < need["peak_bytes"] < need["available_bytes"]
    with pytest.raises(ExportRefused, match=r"^the export needs \d+\.\d\d GiB on cpu .* but 0\.00 GiB are free"):
        ensure_fits(tiny_model, card, 120, "cpu", available=1024)


def _run_lines(lines: list[str], tokenizer, text: str) -> list[int]:
    scope = {"tokenizer": tokenizer, "text": text}
    exec("\n".join(lines), scope)  # noqa: S102 - the snippet's own lines, as a user runs them
    return scope["ids"]


@pytest.mark.parametrize("fmt", ["chat", "chat, system in the user message", "chat, template variables", "plain"])
def test_snippet_renders_the_training_prompt_token_for_token(fmt: str, tiny_model) -> None:
    from labkit.model.loading import load_tokenizer

    card = load_card(REPO / "params" / "smoke.yaml").card
    if fmt == "plain":
        card = updated(card, {"data.prompt.format": "plain"})
    if fmt.endswith("user message"):
        card = updated(card, {"data.prompt.system_in": "user"})
    if fmt.endswith("variables"):  # Qwen3's thinking switch: the snippet renders the prompt with it, as training did
        card = updated(card, {"model.source": "tiny:qwen3", "data.prompt.chat_template_kwargs": {"enable_thinking": False}})
        tiny_model = resolve("tiny:qwen3")
    tokenizer = load_tokenizer(tiny_model, card)
    text = "The printer {input} on floor 3 is jammed.\nPlease help."
    lines = prompt_lines(card)
    assert any("apply_chat_template" in line for line in lines) == fmt.startswith("chat")
    assert _run_lines(lines, tokenizer, text) == prompt_ids(tokenizer, card, text)
    assert ("enable_thinking=False" in lines[-1]) == fmt.endswith("variables")


@pytest.mark.parametrize("system", ["the card's, as a system message", "the card's, in the user turn",
                                    "the conversation's, in the user turn", "none"])
def test_a_conversation_snippet_renders_the_training_prompt_token_for_token(system: str, tiny_model) -> None:
    import json

    from labkit.model.loading import load_tokenizer

    card = updated(load_card(REPO / "params" / "smoke.yaml").card, {
        "data.prompt.conversation": True,
        "data.prompt.instruction": "{input}" if system == "none" else "Reply as support.\n{input}",
        "data.prompt.system": None if system.startswith(("the conversation", "none")) else "Be brief.",
        "data.prompt.system_in": "user" if system.endswith("user turn") else "system"})
    turns = [{"role": "user", "content": "My lamp, order 12."}, {"role": "assistant", "content": "Found it."},
             {"role": "user", "content": "When does it come?"}]
    if system.startswith("the conversation"):
        turns.insert(0, {"role": "system", "content": "You are the desk."})
    tokenizer = load_tokenizer(tiny_model, card)
    scope = {"tokenizer": tokenizer, "turns": turns}
    exec("\n".join(prompt_lines(card)), scope)  # noqa: S102 - the snippet's own lines, as a user runs them
    assert scope["ids"] == prompt_ids(tokenizer, card, json.dumps(turns))
    assert turns[-1]["content"] == "When does it come?"  # the user's turns are left as they were


def test_plain_snippet_keeps_a_single_bos(tiny_model) -> None:
    from labkit.model.loading import load_tokenizer

    card = load_card(REPO / "params" / "smoke.yaml").card
    card = updated(card, {"data.prompt.format": "plain", "data.prompt.template": "<s>{system}\n\n{instruction}\n\nA: "})
    tokenizer = load_tokenizer(tiny_model, card)
    assert _run_lines(prompt_lines(card), tokenizer, "x") == prompt_ids(tokenizer, card, "x")


def test_export_line_prints_the_export_peak_beside_trainings(capsys) -> None:
    from labkit.cli.main import main

    code = main(["estimate", str(EXAMPLES / "dialogsum-llama3-8b-qlora-sft.yaml"), "--gpu-memory", "24", "--capability", "8.9"])
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("export (")]
    assert code == 0 and "bfloat16 merge and reload check" in line and "beside training's" in line and "fits" in line


def _gemma3_qlora_fp32(tmp_path: Path) -> Path:
    """Gemma 3 4B QLoRA with float32 compute: what a T4 trains it in, since float16 overflows it."""
    path = tmp_path / "gemma3-qlora-fp32.yaml"
    path.write_text(yaml.safe_dump({
        "parent": str(EXAMPLES / "gemma3-4b-lora.yaml"), "experiment": {"variant": "gemma3-4b-qlora-fp32"},
        "model": {"dtype": "float32"}, "train": {"precision": "fp32"},
        "method": {"kind": "qlora", "r": 16, "alpha": 32, "target_modules": "all-linear",
                   "quantisation": {"compute_dtype": "float32"}}}))
    return path


def test_a_float32_merge_that_does_not_fit_names_the_16_bit_one(tmp_path: Path, capsys) -> None:
    """Gemma 3 4B QLoRA in float32 on a T4: training fits (~6 GiB), a float32 merge (~18.5 GiB) does not, a bfloat16
    merge (emulated on a T4, since float16 overflows Gemma 3) does."""
    from labkit.cli.main import main

    path = _gemma3_qlora_fp32(tmp_path)
    card, t4 = load_card(path).card, gpu_profile(14.7, "7.5")
    config = estimate_config(card, path, str(EXAMPLES / "configs" / "google--gemma-3-4b-it.json"))
    wide, narrow = (export_estimate(config, card, 384, t4, dtype) for dtype in (None, "bfloat16"))
    assert wide["dtype"] == "float32" and wide["peak_bytes"] > 15 * GIB and narrow["peak_bytes"] < 11 * GIB
    assert narrow["breakdown"]["weights_export_dtype"] * 2 == wide["breakdown"]["weights_export_dtype"]
    assert smaller_dtype("float32", config.model_type) == "bfloat16"  # float16 overflows Gemma 3
    assert smaller_dtype("float32", "llama") == "float16"  # in range for Llama: 3 more significant bits than bfloat16
    assert smaller_dtype("bfloat16", "gemma3") is None and smaller_dtype("float16", "llama") is None
    assert main(["estimate", str(path), "--gpu", "T4", "--config", str(EXAMPLES / "configs" / "google--gemma-3-4b-it.json")]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("export (")]
    assert re.search(r"float32 merge .*: does not fit; in bfloat16 \(labkit export RUN --dtype bfloat16\) "
                     r"\d+\.\d\d GiB: fits$", line), line


def test_refusal_names_the_16_bit_merge_that_fits_and_float16_is_refused_where_it_overflows(tiny_model) -> None:
    from labkit.model.sources import resolve

    card = updated(load_card(REPO / "params" / "smoke.yaml").card, {
        "method.kind": "qlora", "method.quantisation": {"compute_dtype": "float32"}})
    wide = ensure_fits(tiny_model, card, 120, "cpu", available=10 * GIB)
    narrow = ensure_fits(tiny_model, card, 120, "cpu", available=10 * GIB, dtype="float16")
    assert wide["dtype"] == "float32" and narrow["dtype"] == "float16" and narrow["peak_bytes"] < wide["peak_bytes"]
    between = (wide["peak_bytes"] + narrow["peak_bytes"]) / 2
    with pytest.raises(ExportRefused, match=r"^the export needs \d+\.\d\d GiB on cpu \(merge and reload check\) but "
                       r"\d+\.\d\d GiB are free — merge in float16 \(labkit export smoke-run-1 --dtype float16: "
                       r"\d+\.\d\d GiB\), free memory on cpu, or export on a device with more$"):
        ensure_fits(tiny_model, card, 120, "cpu", available=between, run_id="smoke-run-1")
    with pytest.raises(ExportRefused) as short:  # nothing fits: no 16-bit merge named
        ensure_fits(tiny_model, card, 120, "cpu", available=1024)
    assert "--dtype" not in str(short.value)
    gemma3 = resolve("tiny:gemma3")
    with pytest.raises(ExportRefused, match=r"^--dtype float16: gemma3 overflows float16 .*; use --dtype bfloat16 or float32$"):
        ensure_fits(gemma3, card, 120, "cpu", available=10 * GIB, dtype="float16")
    assert ensure_fits(tiny_model, card, 120, "cpu", available=10 * GIB, dtype="bfloat16")["dtype"] == "bfloat16"


def test_a_qlora_base_merges_in_the_dtype_asked_for_from_its_dequantised_weights(tiny_model) -> None:
    """A float32-compute QLoRA base in bfloat16: every tensor bfloat16, each 4-bit layer its float32 dequantisation
    rounded once (not re-quantised, not the original weights)."""
    import torch

    from labkit.export.merge import base_for_merge
    from labkit.model.loading import load_model

    card = updated(load_card(REPO / "params" / "smoke.yaml").card, {
        "method.kind": "qlora", "method.quantisation": {"compute_dtype": "float32"}})
    merged = base_for_merge(tiny_model, card, "cpu", "bfloat16").state_dict()
    assert {t.dtype for t in merged.values() if t.is_floating_point()} == {torch.bfloat16}
    exact = load_model(tiny_model, card, "cpu").dequantize(dtype=torch.float32).state_dict()
    name = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(merged[name], exact[name].to(torch.bfloat16))
    assert torch.equal(merged["model.embed_tokens.weight"], exact["model.embed_tokens.weight"].to(torch.bfloat16))


def test_a_multimodal_qlora_base_merges_with_its_own_vision_tower() -> None:
    """Gemma 3's vision tower was quantised with the rest (bitsandbytes takes every Linear layer) though text rows
    never run it: the merge's base gives it the checkpoint's weights back, and the text decoder stays dequantised."""
    import torch
    from safetensors.torch import load_file

    from labkit.export.merge import base_for_merge
    from labkit.model.loading import load_model
    from labkit.model.sources import resolve

    gemma3 = resolve("tiny:gemma3")
    card = updated(load_card(REPO / "params" / "smoke.yaml").card, {
        "model.source": "tiny:gemma3", "data.prompt.chat_template": "model", "method.kind": "qlora",
        "method.quantisation": {"compute_dtype": "float32"}})
    on_disk = load_file(str(Path(gemma3.location) / "model.safetensors"))
    merged = base_for_merge(gemma3, card, "cpu", "bfloat16").state_dict()
    dequantised = load_model(gemma3, card, "cpu").dequantize(dtype=torch.float32).state_dict()
    tower, text = ("model.vision_tower.encoder.layers.0.self_attn.q_proj.weight",
                   "model.language_model.layers.0.self_attn.q_proj.weight")
    original = on_disk["vision_tower.encoder.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(dequantised[tower], original)  # the 4-bit round trip moved the tower
    assert torch.equal(merged[tower], original.to(torch.bfloat16))
    assert torch.equal(merged[text], dequantised[text].to(torch.bfloat16))  # what the adapter learned against
    assert not torch.equal(merged[text], on_disk["language_model.model.layers.0.self_attn.q_proj.weight"].to(torch.bfloat16))
