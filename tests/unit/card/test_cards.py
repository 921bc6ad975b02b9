"""Experiment cards: every card in params/ loads; bad cards give one line naming file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import REPO

from labkit.card.load import card_hash, load_card
from labkit.errors import CardError

CARDS = sorted((REPO / "params").rglob("*.yaml"))


def test_there_are_cards() -> None:
    names = {p.name for p in CARDS}
    assert {"quickstart.yaml", "smoke.yaml"} <= names


@pytest.mark.parametrize("path", CARDS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_card_loads(path: Path) -> None:
    loaded = load_card(path)
    assert loaded.card.experiment.hypothesis
    assert loaded.card.experiment.target.primary_metric
    assert len(loaded.hash) == 8


def _write(tmp_path: Path, text: str, name: str = "card.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _quickstart() -> dict:
    return yaml.safe_load((REPO / "params" / "quickstart.yaml").read_text())


def _bad(tmp_path: Path, mutate) -> str:
    data = _quickstart()
    mutate(data)
    path = _write(tmp_path, yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(CardError) as info:
        load_card(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    return message


def test_unknown_key(tmp_path: Path) -> None:
    msg = _bad(tmp_path, lambda d: d["train"].update(learning_rate=0.1))
    assert "train.learning_rate" in msg and "unknown key" in msg


def test_unknown_nested_key_has_line_number(tmp_path: Path) -> None:
    msg = _bad(tmp_path, lambda d: d["method"].update(rank=4))
    assert "method.rank" in msg
    line = int(msg.split(":")[1])
    text = (tmp_path / "card.yaml").read_text().splitlines()
    assert "rank" in text[line - 1]


def test_missing_hypothesis(tmp_path: Path) -> None:
    msg = _bad(tmp_path, lambda d: d["experiment"].pop("hypothesis"))
    assert "experiment.hypothesis" in msg and "missing" in msg


def test_missing_primary_metric(tmp_path: Path) -> None:
    msg = _bad(tmp_path, lambda d: d["experiment"]["target"].pop("primary_metric"))
    assert "experiment.target.primary_metric" in msg


def test_missing_guardrails(tmp_path: Path) -> None:
    msg = _bad(tmp_path, lambda d: d["experiment"].pop("guardrails"))
    assert "experiment.guardrails" in msg


def test_wrong_type(tmp_path: Path) -> None:
    msg = _bad(tmp_path, lambda d: d["train"].update(micro_batch="eight"))
    assert "train.micro_batch" in msg and "integer" in msg and "'eight'" in msg


def test_unknown_method_kind(tmp_path: Path) -> None:
    msg = _bad(tmp_path, lambda d: d["method"].update(kind="lorax"))
    assert "method" in msg and "lorax" in msg


def test_unknown_metric(tmp_path: Path) -> None:
    msg = _bad(tmp_path, lambda d: d["experiment"]["target"].update(primary_metric="accuracyy"))
    assert "experiment.target.primary_metric" in msg and "unknown metric" in msg


def test_json_metric_needs_json_target(tmp_path: Path) -> None:
    def mutate(d):
        d["data"]["target_format"] = {"kind": "text"}
        d["experiment"]["guardrails"] = []
    msg = _bad(tmp_path, mutate)
    assert "needs data.target_format.kind: json" in msg


def test_invalid_yaml(tmp_path: Path) -> None:
    path = _write(tmp_path, "experiment: [\n  id: x\n")
    with pytest.raises(CardError, match=r"card.yaml:\d+: not valid YAML"):
        load_card(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CardError, match="card file not found"):
        load_card(tmp_path / "nope.yaml")


def test_parent_inheritance_and_diff(tmp_path: Path) -> None:
    parent = _write(tmp_path, yaml.safe_dump(_quickstart()), "parent.yaml")
    child = _write(tmp_path, "parent: parent.yaml\nexperiment: {variant: r4}\nmethod: {kind: lora, r: 4}\n", "child.yaml")
    loaded = load_card(child)
    assert loaded.card.method.r == 4
    assert loaded.card.experiment.id == "ticket-triage"  # inherited
    assert loaded.card.data.max_length == 384  # inherited
    assert loaded.chain == [child.resolve(), parent.resolve()]
    assert set(loaded.diff) == {"experiment.variant", "method.r"}
    assert loaded.diff["method.r"] == {"parent": 16, "card": 4}
    assert "parent" not in loaded.resolved


def test_parent_error_names_the_parent_file(tmp_path: Path) -> None:
    data = _quickstart()
    data["train"]["epochz"] = 1
    _write(tmp_path, yaml.safe_dump(data), "parent.yaml")
    child = _write(tmp_path, "parent: parent.yaml\nexperiment: {variant: r4}\n", "child.yaml")
    with pytest.raises(CardError, match=r"parent\.yaml:\d+: train\.epochz"):
        load_card(child)


def test_parent_cycle(tmp_path: Path) -> None:
    _write(tmp_path, "parent: b.yaml\n", "a.yaml")
    _write(tmp_path, "parent: a.yaml\n", "b.yaml")
    with pytest.raises(CardError, match="cycle"):
        load_card(tmp_path / "a.yaml")


def test_hash_is_stable_and_sensitive(tmp_path: Path) -> None:
    a = load_card(REPO / "params" / "quickstart.yaml")
    b = load_card(REPO / "params" / "quickstart.yaml")
    assert a.hash == b.hash
    parent = str(REPO / "params" / "quickstart.yaml")
    (tmp_path / "seed.yaml").write_text(f"parent: {parent}\ntrain: {{seed: 1}}\n")
    assert load_card(tmp_path / "seed.yaml").hash != a.hash
    # a key written at its default value (as a newer labkit adds optional keys) leaves the hash alone, so an
    # archived card.yaml still matches its run after an upgrade
    (tmp_path / "explicit.yaml").write_text(f"parent: {parent}\nnotes: null\nexperiment: {{protocol_change: null}}\n")
    assert load_card(tmp_path / "explicit.yaml").hash == a.hash
    assert card_hash(a.card.model_dump(mode="json", exclude_defaults=True)) == a.hash


def test_trust_remote_code_is_off_by_default() -> None:
    for path in CARDS:
        card = load_card(path).card
        assert card.model.trust_remote_code is False


def test_distributed_launcher_and_strategy_go_together(tmp_path: Path) -> None:
    msg = _bad(tmp_path, lambda d: d.update(distributed={"launcher": "accelerate"}))
    assert "distributed" in msg and "launcher accelerate goes with strategy ddp or fsdp" in msg
