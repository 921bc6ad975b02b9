"""Architectures whose activations or gradients overflow float16 (`labkit.model.placement.FP16_RANGE`: Gemma 3, gpt-oss,
Qwen3-MoE, …) are refused any float16 — fp16 precision, float16 weights, a float16 4-bit compute dtype — on recorded
device profiles, in `labkit estimate` and before `labkit run` creates a run folder; bf16 and fp32 pass, and other
architectures keep float16."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from test_placement import NONE, card, profile

from labkit.cli.main import main
from labkit.core.device import cpu_profile
from labkit.errors import CardError
from labkit.model.placement import FP16_RANGE, decide, for_architecture

GEMMA3 = REPO / "params" / "examples" / "gemma3-4b-lora.yaml"
GEMMA3_CONFIG = REPO / "params" / "examples" / "configs" / "google--gemma-3-4b-it.json"
TAIL = (r": {arch} overflows float16 \(activations or gradients past 65504: NaN losses and gradients, and a baseline "
        r"scored on NaN logits\); set {fix} \(float32: slower, more activation memory\), or train in bf16 on a GPU of "
        r"compute capability ≥ 8\.0 \(L4, A10G, A100, H100\)$")


@pytest.mark.parametrize("kind, keys, named, fix", [
    ("lora", {}, "train.precision: auto (fp16 here), model.dtype: auto (float16 here)",
     "train.precision: fp32, model.dtype: float32"),
    ("qlora", {}, "train.precision: auto (fp16 here), model.dtype: auto (float16 here), "
     "method.quantisation.compute_dtype: auto (float16 here)",
     "train.precision: fp32, model.dtype: float32, method.quantisation.compute_dtype: float32"),
    ("full", {}, "train.precision: auto (fp16 here)", "train.precision: fp32"),  # full keeps float32 weights on a T4
    ("lora", {"model__dtype": "float32"}, "train.precision: auto (fp16 here)", "train.precision: fp32"),
])
def test_float16_on_a_t4_is_refused_naming_each_key_and_its_float32_value(kind, keys, named, fix) -> None:
    c = card(kind, **keys)
    made = decide(c, profile("t4"), world_size=1, kernels=NONE)
    for arch in ("gemma3_text", "gemma3", "gpt_oss", "qwen3_moe"):
        with pytest.raises(CardError, match="^" + re.escape(named) + TAIL.format(arch=arch, fix=re.escape(fix))):
            for_architecture(made, c, arch)
    assert for_architecture(made, c, "llama") is made and for_architecture(made, c, "gemma2").precision == "fp16"


def test_bf16_fp32_and_the_cpu_pass_and_float16_named_on_any_device_is_refused() -> None:
    fp32 = card("qlora", train__precision="fp32", model__dtype="float32")
    fp32 = type(fp32).model_validate({**fp32.model_dump(), "method": {**fp32.method.model_dump(),
                                                                     "quantisation": {"compute_dtype": "float32"}}})
    for c, p in ((card("qlora"), profile("a100")), (card("lora"), cpu_profile()), (fp32, profile("t4"))):
        made = decide(c, p, world_size=1, kernels=NONE)
        assert for_architecture(made, c, "gemma3_text") is made, p.name
    named = card("lora", train__precision="fp16")  # fp16 asked for on a GPU with bf16
    with pytest.raises(CardError, match=r"^train.precision: fp16: gemma3 overflows float16 .*set train.precision: fp32"):
        for_architecture(decide(named, profile("h100"), world_size=1, kernels=NONE), named, "gemma3")
    assert {"gemma3", "gemma3_text", "gpt_oss", "qwen3_moe"} <= set(FP16_RANGE) and "gemma2" not in FP16_RANGE


def test_labkit_estimate_refuses_gemma3_on_a_t4_and_sizes_it_in_float32(tmp_path: Path, capsys) -> None:
    assert main(["estimate", str(GEMMA3), "--gpu", "T4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.match(rf"labkit: error: {re.escape(str(GEMMA3))}:\d+: train\.precision: auto \(fp16 "
                                      r"here\), model\.dtype: auto \(float16 here\): gemma3_text overflows float16",
                                      err[0]), err  # at the card's line, as `labkit run` and `check --data` say it
    variant = tmp_path / "gemma3-qlora-fp32.yaml"
    variant.write_text(yaml.safe_dump({
        "parent": str(GEMMA3), "experiment": {"variant": "gemma3-4b-qlora-fp32"},
        "model": {"dtype": "float32"}, "train": {"precision": "fp32"},
        "method": {"kind": "qlora", "r": 16, "alpha": 32, "target_modules": "all-linear",
                   "quantisation": {"compute_dtype": "float32"}}}))
    assert main(["estimate", str(variant), "--gpu", "T4", "--config", str(GEMMA3_CONFIG)]) == 0
    out = capsys.readouterr().out
    assert "weights float32, precision fp32, 4-bit compute float32" in out and "verdict: fits" in out, out


def test_labkit_run_refuses_float16_gemma3_before_any_run_folder(tmp_path: Path, capsys) -> None:
    raw = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    raw["model"].update(source="tiny:gemma3", dtype="float16")
    raw["data"]["prompt"]["chat_template"] = "model"
    path = tmp_path / "gemma3-float16.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "dtype: float16" in text)
    root = tmp_path / "runs"
    assert main(["--runs", str(root), "run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (after the tiny model's first build, when it is built)
    assert err.startswith(f"labkit: error: {path}:{line}: model.dtype: float16: gemma3 overflows float16 ") and \
        "set model.dtype: float32 " in err, err
    assert not root.exists()  # nothing spent: no run folder, no registry
