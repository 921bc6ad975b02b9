"""Hub pins: a branch or tag refused with the fix, `revision: resolve` looked up once per experiment and recorded,
the recorded commit protocol-fixed for later variants, and the hub token never archived."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from labkit.card.load import load_card
from labkit.core import hub
from labkit.core import runs as R
from labkit.core.environment import capture
from labkit.core.io import write_json
from labkit.core.protocol import check_protocol, pin_card, pinned, read_pins, run_protocol
from labkit.errors import CardError, ModelSourceError
from labkit.model.card_check import check_card
from labkit.model.source_spec import check_source
from labkit.model.sources import resolve

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


def _card(folder: Path, variant: str = "v1", revision: str | None = "resolve", source: str = "hf:acme/tiny-model",
          **train) -> Path:
    raw = yaml.safe_load((REPO / "params" / "quickstart.yaml").read_text())
    raw["experiment"].update(id="pinned", variant=variant)
    raw["model"] = {"source": source, **({"revision": revision} if revision else {})}
    raw["train"].update(train)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{variant}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_branch_or_a_missing_commit_is_one_line_naming_model_revision(tmp_path: Path) -> None:
    for revision, message in [("main", "model.revision: 'main' is a branch or tag name, not a pin: use the 40-hex "
                                       "commit hash"),
                              (None, "model.revision: hf:acme/tiny-model names no commit: set model.revision"),
                              ("v1.0", "or resolve to look it up once")]:
        loaded = load_card(_card(tmp_path, revision=revision))
        with pytest.raises(ModelSourceError) as info:
            check_card(loaded, tmp_path / "runs")
        assert message in str(info.value) and "\n" not in str(info.value)
        assert str(info.value).startswith(str(loaded.path))
    check_source("hf:acme/tiny-model", "resolve")  # accepted: looked up when a run starts
    with pytest.raises(ModelSourceError, match="@resolve"):  # a source string carries a commit, never resolve
        check_source("hf:acme/tiny-model@resolve", None)
    with pytest.raises(ModelSourceError, match="has no commit yet"):  # resolve() itself never asks the hub
        resolve("hf:acme/tiny-model", "resolve")


def test_resolve_against_an_unreachable_hub_fails_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(ModelSourceError) as info:
        hub.resolve_commit("model", "acme/tiny-model", ModelSourceError, "model.revision")
    text = str(info.value)
    assert text.startswith("model.revision: the hub (http://127.0.0.1:9) cannot be reached for hf:acme/tiny-model")
    assert text.endswith("check the network, or write the 40-hex commit hash in the card") and "\n" not in text
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSourceError, match="HF_HUB_OFFLINE=1; write the 40-hex commit hash"):
        hub.resolve_commit("model", "acme/tiny-model", ModelSourceError, "model.revision")


def _complete(run: R.Run) -> None:
    """Mark a run completed with results, as stage 05 leaves it (the protocol counts such runs only)."""
    write_json(run.dir / "comparison" / "verdict.json", {"decision": "confirmed"})
    R.record(run, "completed", status="completed")


def test_resolve_is_looked_up_once_recorded_and_protocol_fixed(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    asked: list[tuple[str, str]] = []

    def resolver(kind: str, repo: str, error: type, key: str) -> str:  # the seam: what the hub would answer
        asked.append((kind, repo))
        return COMMIT_A

    first = load_card(_card(tmp_path))
    run = R.new_run(first, root)
    pins = pin_card(first.card, root, "pinned", run.dir, resolver)
    assert pins == {"model.revision": {"repo": "acme/tiny-model", "commit": COMMIT_A, "resolved": True}}
    assert pinned(first.card, pins).model.revision == COMMIT_A and asked == [("model", "acme/tiny-model")]
    assert first.card.model.revision == "resolve"  # the loaded card is frozen: the commit is in the pinned copy
    assert read_pins(run.dir) == pins and run_protocol(run.dir)["pins"] == pins
    assert yaml.safe_load(run.card_path.read_text())["model"]["revision"] == "resolve"  # the card as written
    pin_card(load_card(_card(tmp_path)).card, root, "pinned", run.dir, resolver)  # a later stage of the same run
    assert len(asked) == 1
    _complete(run)

    # a later variant with resolve takes the recorded commit: the hub is not asked again
    later = load_card(_card(tmp_path, variant="v2", lr=1e-4))
    assert check_protocol(later.resolved, root, str(later.path)) == {}
    run2 = R.new_run(later, root)
    later_pins = pin_card(later.card, root, "pinned", run2.dir, resolver)
    assert pinned(later.card, later_pins).model.revision == COMMIT_A and len(asked) == 1

    # naming the same commit is fine; another commit of the same repository changes the protocol
    same = load_card(_card(tmp_path, variant="v3", revision=COMMIT_A))
    assert check_protocol(same.resolved, root, str(same.path)) == {}
    other = load_card(_card(tmp_path, variant="v4", revision=COMMIT_B))
    with pytest.raises(CardError, match=f"model.revision: {COMMIT_A} → {COMMIT_B}"):
        check_protocol(other.resolved, root, str(other.path))
    elsewhere = load_card(_card(tmp_path, variant="v5", source="hf:acme/other-model", revision=COMMIT_B))
    assert check_protocol(elsewhere.resolved, root, str(elsewhere.path)) == {}  # another model: not this pin


def test_the_hub_token_lands_in_no_file_of_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = "hf_labkitPINStoken0123456789abcdef"
    monkeypatch.setenv("HF_TOKEN", token)
    loaded = load_card(_card(tmp_path))
    run = R.new_run(loaded, tmp_path / "runs")
    pin_card(loaded.card, tmp_path / "runs", "pinned", run.dir, lambda *a: COMMIT_A)
    write_json(run.dir / "env.json", capture())
    files = [p for p in run.dir.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"pins.json", "env.json", "card.yaml", "status.json"}
    assert not [p for p in files if token.encode() in p.read_bytes()]
    assert token not in json.dumps([json.loads(line) for line in run.registry.read_text().splitlines()])


def test_a_key_added_since_the_reference_was_archived_is_no_protocol_change(tmp_path: Path) -> None:
    """A run archived by an older labkit lacks the keys added since (here data.prompt.system_in and
    chat_template_kwargs): at their defaults they change nothing, so a variant run later keeps the protocol; set to
    something else they do change it."""
    root = tmp_path / "runs"
    first = load_card(_card(tmp_path, revision=COMMIT_A))
    run = R.new_run(first, root)
    archived = yaml.safe_load(run.card_path.read_text())
    for key in ("system_in", "chat_template_kwargs"):
        archived["data"]["prompt"].pop(key, None)
    run.card_path.write_text(yaml.safe_dump(archived))  # as the older labkit wrote it
    _complete(run)
    later = load_card(_card(tmp_path, variant="v2", revision=COMMIT_A, lr=1e-4))
    assert check_protocol(later.resolved, root, str(later.path)) == {}
    thinking = yaml.safe_load(_card(tmp_path, variant="v3", revision=COMMIT_A).read_text())
    thinking["data"]["prompt"]["system_in"] = "user"
    (tmp_path / "v3.yaml").write_text(yaml.safe_dump(thinking))
    with pytest.raises(CardError, match=r"data.prompt.system_in: system → user"):
        check_protocol(load_card(tmp_path / "v3.yaml").resolved, root, str(tmp_path / "v3.yaml"))
