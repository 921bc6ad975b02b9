"""Variants of other base models in one experiment: the card check, stage 01's data check and `labkit compare`'s
protocol agree. The prompt keys that fit a template (Gemma 2's `system_in: user`, Qwen3's `enable_thinking`) and the
hub commit of another repository belong to the model, not to the protocol; for the same model they stay fixed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from transformers import AutoTokenizer

from labkit.card.load import load_card
from labkit.core import runs as R
from labkit.core.io import write_json
from labkit.core.protocol import check_protocol, pin_card, protocol_changes, run_protocol
from labkit.data.prepare import prepare
from labkit.data.tickets import generate_tickets
from labkit.errors import CardError
from labkit.model.sources import resolve

COMMIT_A, COMMIT_B, COMMIT_C = "a" * 40, "b" * 40, "c" * 40


def _card(folder: Path, variant: str, source: str, revision: str | None = None, **prompt) -> Path:
    """The quickstart's experiment on the tickets file in `folder`, with another model and prompt keys."""
    raw = yaml.safe_load((REPO / "params" / "quickstart.yaml").read_text())
    raw["experiment"].update(id="models", variant=variant)
    raw["data"]["source"] = {"path": "tickets.jsonl"}
    raw["data"]["prompt"].update(prompt)
    raw["model"] = {"source": source, "dtype": "float32", **({"revision": revision} if revision else {})}
    path = folder / f"{variant}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _complete(run: R.Run) -> None:
    """Mark a run completed with results, as stage 05 leaves it (the protocol counts such runs only)."""
    write_json(run.dir / "comparison" / "verdict.json", {"decision": "confirmed"})
    R.record(run, "completed", status="completed")


def _started(path: Path, root: Path) -> tuple[R.Run, dict]:
    """The card checked against the experiment, its run created and its data prepared with its own model's
    tokenizer (stage 01's data check included): the run and its manifest."""
    loaded = load_card(path)
    assert check_protocol(loaded.resolved, root, str(path)) == {}
    source = resolve(loaded.card.model.source)
    run = R.new_run(loaded, root)
    return run, prepare(loaded.card, run, AutoTokenizer.from_pretrained(source.location), source.revision)


def test_a_template_fitting_key_is_the_models_own_and_fixed_for_one_model(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    rows, _ = generate_tickets(rows=60, seed=3)
    (tmp_path / "tickets.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    reference, manifest = _started(_card(tmp_path, "llama", "tiny:llama"), root)
    _complete(reference)

    # Gemma 2's template refuses a system message; Qwen3's needs enable_thinking off: each is the card's only change
    gemma, gemma_manifest = _started(_card(tmp_path, "gemma2", "tiny:gemma2", system_in="user"), root)
    qwen3, _ = _started(_card(tmp_path, "qwen3", "tiny:qwen3", chat_template_kwargs={"enable_thinking": False}), root)
    assert gemma_manifest["data_version"] != manifest["data_version"]  # other tokens of the same rows
    ours = run_protocol(reference.dir)
    assert protocol_changes(ours, run_protocol(gemma.dir)) == {}  # what `labkit compare` reads
    assert protocol_changes(ours, run_protocol(qwen3.dir)) == {}
    _complete(gemma)  # two models completed: a later variant of either is held to the same protocol
    assert check_protocol(load_card(_card(tmp_path, "gemma2-r4", "tiny:gemma2", system_in="user")).resolved, root,
                          "gemma2-r4.yaml") == {}

    # the same key changed for the same model changes how that model is prompted: refused, named
    same = load_card(_card(tmp_path, "llama-user", "tiny:llama", system_in="user"))
    with pytest.raises(CardError, match=r"data\.prompt\.system_in: system → user"):
        check_protocol(same.resolved, root, str(same.path))
    as_reference = {**run_protocol(gemma.dir), "model_revision": ours["model_revision"]}
    assert set(protocol_changes(ours, as_reference)) == {"data.prompt.system_in", "data_version"}
    other_prompt = load_card(_card(tmp_path, "gemma2-other", "tiny:gemma2", system_in="user", system="Be brief."))
    with pytest.raises(CardError, match=r"data\.prompt\.system: "):  # the prompt itself stays fixed across models
        check_protocol(other_prompt.resolved, root, str(other_prompt.path))


def test_compare_holds_hub_commits_as_the_card_check_does(tmp_path: Path) -> None:
    """`labkit compare` reads the hub commits from each run's pins.json: a later variant that names the commit an
    earlier one resolved, or another repository's commit (another base model), keeps the protocol, as the card check
    says; another commit of the same repository changes it there too."""
    root = tmp_path / "runs"
    (tmp_path / "tickets.jsonl").write_text("")

    def pinned_run(variant: str, source: str, revision: str, commit: str) -> R.Run:
        loaded = load_card(_card(tmp_path, variant, source, revision))
        run = R.new_run(loaded, root)
        pin_card(loaded.card, root, "models", run.dir, lambda *a: commit)
        return run

    first = pinned_run("v1", "hf:acme/tiny-model", "resolve", COMMIT_A)
    _complete(first)
    named = pinned_run("v2", "hf:acme/tiny-model", COMMIT_A, COMMIT_A)
    other_model = pinned_run("v3", "hf:acme/other-model", COMMIT_B, COMMIT_B)
    other_commit = pinned_run("v4", "hf:acme/tiny-model", COMMIT_C, COMMIT_C)
    ours = run_protocol(first.dir)
    assert protocol_changes(ours, run_protocol(named.dir)) == {}
    assert protocol_changes(ours, run_protocol(other_model.dir)) == {}
    assert protocol_changes(ours, run_protocol(other_commit.dir)) == {
        "pins.model.revision": {"reference": COMMIT_A, "run": COMMIT_C}}


def test_every_shipped_variant_of_the_quickstart_keeps_its_protocol(tmp_path: Path) -> None:
    """The cards in params/ that belong to the quickstart's experiment (other methods, other base models: Gemma 2
    with `system_in: user`, Qwen3 with `enable_thinking: false`) pass the card check after a completed quickstart
    run, so each joins its experiment comparably."""
    root = tmp_path / "runs"
    quickstart = load_card(REPO / "params" / "quickstart.yaml")
    _complete(R.new_run(quickstart, root))
    variants = [load_card(p) for p in sorted((REPO / "params").rglob("*.yaml")) if "configs" not in p.parts]
    variants = [v for v in variants if v.card.experiment.id == quickstart.card.experiment.id]
    assert {v.path.stem for v in variants} >= {"gemma2-9b-qlora", "qwen3-8b-lora", "ticket-qlora"}
    for variant in variants:
        assert not variant.card.experiment.protocol_change, variant.path
        assert check_protocol(variant.resolved, root, str(variant.path)) == {}, variant.path
