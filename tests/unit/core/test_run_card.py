"""One resolved card per run: the loaded card with the run's recorded hub commits and generation length, read by
every stage and the export through `resolved_card`; a stage resolves it once, when the length is known."""

from __future__ import annotations

from pathlib import Path

import yaml
from conftest import REPO

from labkit.card.load import load_card
from labkit.core.io import write_json
from labkit.core.protocol import PINS
from labkit.core.run_card import GENERATION_LENGTH, complete, recorded_length, resolved_card

COMMIT = "c" * 40


def _hub_card(folder: Path) -> Path:
    """The quickstart with a hub model whose commit is looked up (revision: resolve) and no generation length."""
    raw = yaml.safe_load((REPO / "params" / "quickstart.yaml").read_text())
    raw["model"] = {"source": "hf:acme/tiny-model", "revision": "resolve"}
    raw["eval"].pop("max_new_tokens")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "hub.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_resolved_card_puts_the_recorded_commits_and_length_in(tmp_path: Path) -> None:
    card = load_card(_hub_card(tmp_path / "cards")).card
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert resolved_card(card, run_dir) is card and not complete(card)  # nothing recorded yet
    write_json(run_dir / PINS, {"model.revision": {"repo": "acme/tiny-model", "commit": COMMIT, "resolved": True}})
    pinned = resolved_card(card, run_dir)
    assert pinned.model.revision == COMMIT and pinned.eval.max_new_tokens is None and not complete(pinned)
    write_json(run_dir / GENERATION_LENGTH, {"max_new_tokens": 33, "from": "references"})
    final = resolved_card(card, run_dir)
    assert (final.model.revision, final.eval.max_new_tokens) == (COMMIT, 33) and complete(final)
    assert recorded_length(run_dir)["max_new_tokens"] == 33
    assert (card.model.revision, card.eval.max_new_tokens) == ("resolve", None)  # the loaded card is left as it was
    assert final == resolved_card(card, run_dir) and hash(final) == hash(resolved_card(card, run_dir))


def test_the_cards_own_length_wins(tmp_path: Path) -> None:
    card = load_card(REPO / "params" / "quickstart.yaml").card
    write_json(tmp_path / GENERATION_LENGTH, {"max_new_tokens": 99})
    assert resolved_card(card, tmp_path).eval.max_new_tokens == card.eval.max_new_tokens == 40


def test_a_stage_resolves_its_card_once_the_length_is_recorded(tmp_path: Path, monkeypatch) -> None:
    from labkit.stages.context import open_stage

    monkeypatch.setenv("LABKIT_RUNS", str(tmp_path / "runs"))
    child = tmp_path / "cards" / "unsized.yaml"
    child.parent.mkdir()
    child.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\nexperiment: {{variant: unsized}}\n"
                     "eval: {max_new_tokens: null}\n")
    stage = open_stage("baseline", str(child))
    before = stage.card
    assert before.eval.max_new_tokens is None and before == stage.loaded.card
    write_json(stage.run.dir / GENERATION_LENGTH, {"max_new_tokens": 17})  # what stage 01's prepare_data records
    after = stage.card
    assert after.eval.max_new_tokens == 17 and stage.card is after  # resolved once, then the same frozen card
    assert after == resolved_card(stage.loaded.card, stage.run.dir)
    write_json(stage.run.dir / GENERATION_LENGTH, {"max_new_tokens": 50})
    assert stage.card.eval.max_new_tokens == 17  # one card per run: never re-resolved
