"""The export's memory (stated, refused with the number) and the snippet's prompt (the training prompt, token for token)."""

from __future__ import annotations


import pytest
from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.data.prompting import prompt_ids
from labkit.errors import ExportRefused
from labkit.export.merge import ensure_fits
from labkit.export.snippet import prompt_lines
from labkit.model.sources import resolve
from labkit.preflight.export_memory import GIB, export_dtype, export_estimate, refusal
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
