"""`labkit.card.locate`: a check's line gets the card's place in front, once, and only a real card key is read as one."""

from __future__ import annotations

from pathlib import Path

from conftest import REPO

from labkit.card.load import load_card
from labkit.card.locate import is_card_key, locate


def test_card_keys_are_told_from_file_names_and_models() -> None:
    for key in ("data", "data.prompt.system", "data.leakage", "experiment.guardrails.1.metric", "method.target_modules",
                "data.source.revision", "train.max_steps"):
        assert is_card_key(key), key
    for text in ("data.jsonl", "data.csv", "tiny:mistral", '"the', "model.weights", "trian.max_steps", "params.yaml"):
        assert not is_card_key(text), text


def test_locate(tmp_path: Path) -> None:
    card = tmp_path / "card.yaml"
    card.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\nexperiment: {{variant: v2}}\ntrain:\n  max_steps: 3\n")
    loaded = load_card(card)
    assert locate("train.max_steps: too few", loaded) == f"{card}:4: train.max_steps: too few"
    inherited = locate("data.max_length: too short", loaded)
    assert inherited.startswith(f"{REPO / 'params' / 'smoke.yaml'}:") and inherited.endswith(": data.max_length: too short")
    assert locate("tiny:mistral: no template", loaded) == f"{card}: tiny:mistral: no template"
    for named in ("data.jsonl:3: not JSON", f"{card}:2: experiment.variant: bad", "shared/rows.csv: empty"):
        assert locate(named, loaded) == named  # already names a file: left as it is
