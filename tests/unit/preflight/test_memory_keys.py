"""The memory estimate keys its terms by identifiers (logic reads them back); the labels are only in
labkit.show.memory_labels, and stage 03's table and `labkit estimate` show those labels."""

from __future__ import annotations

import re

from conftest import REPO

from labkit.card.load import load_card
from labkit.core.device import load_profile
from labkit.preflight.memory import estimate_step
from labkit.preflight.records import ACTIVATIONS_CHECKPOINTED, ACTIVATIONS_PLAIN, BREAKDOWN, OVERHEADS, PHASES
from labkit.preflight.records import PHASE_TERMS
from labkit.preflight.sizing import estimate_config, overheads
from labkit.card.update import updated
from labkit.show.memory import breakdown_rows
from labkit.show.memory_labels import LABELS, label

IDENTIFIER = re.compile(r"^[a-z0-9_]+$")


def test_estimate_terms_are_identifiers_with_labels_in_show() -> None:
    loaded = load_card(REPO / "params" / "examples" / "llama3-8b-qlora.yaml")
    card, config = loaded.card, estimate_config(loaded.card, loaded.path)
    card = updated(card, {"train.trainer": "dpo", "train.gradient_checkpointing": True,  # every phase: reference
                          "data.rejected": {"from": "base_model"}})  # forward, recomputation
    t4 = load_profile(REPO / "tests" / "unit" / "core" / "profiles" / "t4.json")
    est = estimate_step(config, card, 256, device=t4)
    assert tuple(est["breakdown"]) == BREAKDOWN and set(est["phases"]) == set(PHASES)
    assert {ACTIVATIONS_PLAIN, ACTIVATIONS_CHECKPOINTED, f"optimizer_states_{card.train.optimizer}",
            "weights_frozen_upcast_all", "weights_frozen_upcast_norms"} <= set(est["alternatives"])
    # each phase is the sum of its terms, and the largest with the weights and optimiser states is the peak
    assert set(est["phase_terms"]) == set(PHASES) and {t for p in est["phase_terms"].values() for t in p} <= set(PHASE_TERMS)
    assert all(est["phases"][k] == sum(terms.values()) for k, terms in est["phase_terms"].items())
    assert est["peak_bytes"] == est["weights_bytes"] + est["breakdown"]["optimizer_states"] + max(est["phases"].values())
    keys = [*est["breakdown"], *est["phases"], *est["alternatives"], *PHASE_TERMS]
    assert all(IDENTIFIER.match(k) for k in keys), keys
    assert all(k in LABELS or label(k) != k for k in keys)  # each shown by its label
    assert label("optimizer_states") == "optimiser states" and label("weights_4bit") == "weights (4-bit)"
    assert set(OVERHEADS) <= set(LABELS)
    card = updated(card, {"distributed.launcher": "accelerate", "distributed.strategy": "ddp", "distributed.num_processes": 2})
    assert set(overheads(card, est, t4, True)) == set(OVERHEADS)
    terms = [r["term"] for r in breakdown_rows([est])]
    assert "weights (4-bit)" in terms and "phase: reference forward (no grad) (above weights and optimiser states)" in terms
    assert "alternative: activations, checkpointing (+ one recomputed layer)" in terms
    assert "alternative: optimiser states, adamw_8bit" in terms
