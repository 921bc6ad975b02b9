"""Eager attention keeps a float32 softmax (and, below float32, the probabilities) of heads × length values per token:
the estimate counts them for the attention the model really trains with — Phi-2 in float16 on a T4 gets labkit's eager
attention with float32 scores — and a real CPU step with eager attention matches the estimate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from transformers import AutoConfig, PhiConfig

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.core.device import load_profile
from labkit.model.attention import FP32_SCORES
from labkit.preflight.memory import estimate_step

REPO = Path(__file__).resolve().parents[3]
T4 = load_profile(REPO / "tests" / "unit" / "core" / "profiles" / "t4.json")
A100 = load_profile(REPO / "tests" / "unit" / "core" / "profiles" / "a100.json")
PHI2 = PhiConfig(hidden_size=2560, intermediate_size=10240, num_hidden_layers=32, num_attention_heads=32,
                 partial_rotary_factor=0.4, vocab_size=51200)


def test_phi2_in_float16_on_a_t4_counts_the_float32_scores() -> None:
    card = load_card(REPO / "params" / "examples" / "dialogsum-phi2-qlora-sft.yaml").card
    plain = updated(card, {"train.gradient_checkpointing": False, "train.micro_batch": 1})
    est = estimate_step(PHI2, plain, 1024, device=T4)
    assert est["attention"] == FP32_SCORES
    units = est["activation_units_per_token_layer"]
    act = 4 if card.method.kind == "qlora" else 2
    assert units["attention softmax (float32)"] == 32 * 1024 * 4 / act
    assert "attention log-sum-exp" not in units
    # on an A100 (bf16: no overflow) Phi-2 trains with SDPA; the T4's float32 softmax of 32 layers × 32 heads × 1024²
    # scores is 4 GiB more at one row
    sdpa = estimate_step(PHI2, plain, 1024, device=A100)
    assert sdpa["attention"] == "sdpa"
    assert est["breakdown"]["activations"] - sdpa["breakdown"]["activations"] >= 32 * 32 * 1024 * 1024 * 4
    assert est["step_bytes"] - sdpa["step_bytes"] >= 32 * 32 * 1024 * 1024 * 4


MEASURE = """
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1] + "/tests")
from conftest import smoke_rows
from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.model.sources import resolve
from labkit.preflight.timing import measure_step
card = updated(load_card(Path(sys.argv[1]) / "params" / "smoke.yaml").card, json.loads(sys.argv[2]))
tiny = resolve("tiny:llama")
model = apply_method(load_model(tiny, card, "cpu"), card)
out = measure_step(card, model, load_tokenizer(tiny, card), smoke_rows(), 1024, Path(tempfile.mkdtemp()))
print(json.dumps(out["memory"]["delta_bytes"]))
"""


def test_a_cpu_step_with_eager_attention_matches_the_estimate(tiny_model) -> None:
    """Measured in a fresh process (as bench/memory.py does): a long-lived test process's heap distorts peak RSS."""
    changes = {"model.attn_implementation": "eager", "data.max_length": 1024, "train.micro_batch": 2,
               "train.gradient_checkpointing": False}
    card = updated(load_card(REPO / "params" / "smoke.yaml").card, changes)
    estimate = estimate_step(AutoConfig.from_pretrained(tiny_model.location), card, 1024, device="cpu")
    assert estimate["attention"] == "eager" and "attention probabilities" not in estimate[
        "activation_units_per_token_layer"]  # float32: the probabilities are the softmax's output
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(REPO), json.dumps(changes)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    scores = 2 * 2 * 4 * 1024 * 1024 * 4  # rows × layers × heads × 1024² float32
    assert measured > scores  # the scores are really kept
    assert abs(estimate["step_bytes"] - measured) <= 0.15 * measured, (estimate["step_bytes"], measured)
