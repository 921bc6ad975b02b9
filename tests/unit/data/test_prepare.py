"""Versioned preparation: rules, split sources, leakage policies, the manifest's hashes, model/tokenizer checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from labkit.card.load import load_card
from labkit.core import runs as R
from labkit.data import sources as D
from labkit.data.prepare import prepare
from labkit.data.prompting import IGNORE, check_encoded, encode_example
from labkit.errors import CardError, LeakageError
from labkit.stages.preprocessing import model_checks, planted_vs_found


def _loaded(tmp_path: Path, name: str = "card.yaml", **data_overrides):
    raw = yaml.safe_load((REPO / "params" / "quickstart.yaml").read_text())
    raw["model"] = {"source": "tiny:llama", "dtype": "float32"}
    raw["data"].update(data_overrides)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return load_card(path)


@pytest.fixture
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model.location)


def _prepare(tmp_path: Path, tok, tiny_model, **overrides) -> tuple[R.Run, dict]:
    loaded = _loaded(tmp_path, **overrides)
    run = R.new_run(loaded, tmp_path / "runs")
    return run, prepare(loaded.card, run, tok, tiny_model.revision)


def _rows(n: int = 4) -> list[dict]:
    return [{"id": f"r{i}", "input": f"text {i}", "category": "c",
             "target": json.dumps({"category": "c", "priority": "low", "product": "P"})} for i in range(n)]


def test_regex_rules(tmp_path: Path) -> None:
    card = _loaded(tmp_path, cleaning=[{"drop_matching": {"field": "input", "pattern": r"\b[13]$"}},
                                       {"keep_matching": {"pattern": "text"}}]).card
    rows = _rows() + [{**_rows(1)[0], "id": "x", "input": "nothing"}]
    kept, report = D.apply_cleaning(card.data, rows)
    assert [r["id"] for r in kept] == ["r0", "r2"]
    assert [s["removed_ids"] for s in report] == [["r1", "r3"], ["x"]]
    assert report[0]["rule"] == {"drop_matching": {"field": "input", "pattern": r"\b[13]$"}}


def test_json_schema_rule(tmp_path: Path) -> None:
    schema = {"type": "object", "required": ["category", "priority", "product"],
              "properties": {"priority": {"enum": ["low", "medium", "high", "urgent"]}}}
    card = _loaded(tmp_path, cleaning=[{"drop_target_failing_schema": schema}]).card
    rows = _rows(2)
    rows[1]["target"] = json.dumps({"category": "c", "priority": "someday", "product": "P"})
    rows.append({**_rows(1)[0], "id": "bad", "target": "not json"})
    kept, report = D.apply_cleaning(card.data, rows)
    assert [r["id"] for r in kept] == ["r0"] and report[0]["removed_ids"] == ["r1", "bad"]


@pytest.mark.parametrize("rule, message", [
    ({"drop_matching": {"pattern": "(unclosed"}}, "not a valid regular expression"),
    ({"drop_target_failing_schema": {"type": "no-such-type"}}, "not a valid JSON Schema"),
    ({"drop_matching": {"field": "answer", "pattern": "x"}}, "data.cleaning.0.drop_matching.field"),
])
def test_bad_rules_are_card_errors(tmp_path: Path, rule, message) -> None:
    with pytest.raises(CardError, match=message.replace(".", r"\.")):
        _loaded(tmp_path, cleaning=[rule])


def test_whitespace_row_without_drop_empty_is_named(tmp_path: Path) -> None:
    card = _loaded(tmp_path, cleaning=["strip"]).card
    rows = _rows(2)
    rows[1]["input"] = " \n\t "
    with pytest.raises(D.DataError, match=r"row id 'r1': the input is empty or whitespace only .*drop_empty"):
        D.apply_cleaning(card.data, rows)


def test_split_from_a_data_field(tmp_path: Path) -> None:
    rows = [{"id": f"r{i}", "text": f"t {i}", "category": "c", "answer": "{}", "part": s}
            for i, s in enumerate(["train", "train", "validation", "TEST"])]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    card = _loaded(tmp_path, source={"path": str(path)}, split={"field": "part"}).card
    splits = D.split_rows(card.data, D.map_fields(card.data, D.load_source(card.data)[0]))
    assert {k: [r["id"] for r in v] for k, v in splits.items()} == {"train": ["r0", "r1"], "validation": ["r2"], "test": ["r3"]}
    assert "split" not in splits["train"][0]
    rows[0]["part"] = "holdout"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(D.DataError, match=r"d\.jsonl:1: field 'part' \(data\.split\.field\) is 'holdout'"):
        D.map_fields(card.data, D.load_source(card.data)[0])


def test_manifest_is_stable_and_versioned(tmp_path: Path, tok, tiny_model) -> None:
    run_a, a = _prepare(tmp_path / "a", tok, tiny_model)
    run_b, b = _prepare(tmp_path / "b", tok, tiny_model)
    assert a["data_version"] == b["data_version"]
    assert a["split"]["sha256"] == b["split"]["sha256"] and a["tokenised_sha256"] == b["tokenised_sha256"]
    assert (run_a.dir / "data" / "train.jsonl").read_bytes() == (run_b.dir / "data" / "train.jsonl").read_bytes()
    assert a["tokenizer"]["chat_template_sha256"] and a["source"]["kind"] == "builtin"
    assert [s["removed"] for s in a["cleaning"]] == [0, 1, 1]  # the planted empty and overlong rows
    cleaning = ["normalise_whitespace", "drop_empty", {"drop_longer_than_tokens": 384}, {"drop_longer_than_chars": 200}]
    _, c = _prepare(tmp_path / "c", tok, tiny_model, cleaning=cleaning)
    assert c["data_version"] != a["data_version"]


def test_quickstart_data_finds_exactly_the_planted_problems(tmp_path: Path, tok, tiny_model) -> None:
    run, manifest = _prepare(tmp_path, tok, tiny_model)
    stage = run.dir / "preprocessing"
    report = json.loads((stage / "leakage.json").read_text())
    check = planted_vs_found(json.loads((stage / "planted.json").read_text()), report,
                             json.loads((stage / "cleaning.json").read_text()))
    assert check["ok"], check
    assert check["duplicates"]["found"] == check["duplicates"]["planted"] == 6
    assert set(manifest["leakage"]["dropped_from_train"]) <= {p["a_id"] for p in report["pairs"]} | {p["b_id"] for p in report["pairs"]}


def test_within_split_drop_and_fail_policy(tmp_path: Path, tok, tiny_model) -> None:
    _, manifest = _prepare(tmp_path / "w", tok, tiny_model,
                           leakage={"near_duplicate_threshold": 0.85, "policy": "drop_from_train", "within_split": "drop"})
    assert manifest["leakage"]["dropped_within_split"]
    loaded = _loaded(tmp_path, leakage={"near_duplicate_threshold": 0.85, "policy": "fail"})
    run = R.new_run(loaded, tmp_path / "runs-fail")
    with pytest.raises(LeakageError, match=r"policy is fail"):
        prepare(loaded.card, run, tok, tiny_model.revision)
    assert not (run.dir / "data_manifest.json").exists() and not (run.dir / "data").exists()  # nothing half-written


def test_eos_without_loss_is_caught(tok, tiny_model) -> None:
    card = load_card(REPO / "params" / "smoke.yaml").card
    enc = encode_example(tok, card, "hello", '{"a": 1}')
    enc.labels[-1] = IGNORE  # a collator that masks pad == eos would do this
    checks = {c["check"]: c for c in check_encoded(tok, [{"id": "x"}], [enc])}
    assert not checks["completion ends with EOS and the EOS carries loss"]["ok"]


def test_model_checks_catch_a_foreign_eos_and_template(tok, tiny_model) -> None:
    card = load_card(REPO / "params" / "smoke.yaml").card
    assert all(c["ok"] for c in model_checks(tiny_model, tok, card))
    tok.eos_token = "<|endoftext|>"  # not the model's: generation still stops on the <|im_end|> the template writes
    failed = {c["check"] for c in model_checks(tiny_model, tok, card) if not c["ok"]}
    assert failed == {"the tokenizer's EOS is an end token the model declares"}
    tok.chat_template = tok.chat_template.replace("<|im_end|>", "")  # a template that closes the turn with nothing
    closing = {c["check"]: c for c in model_checks(tiny_model, tok, card)}[
        "the chat template closes the answer with a token generation stops on"]
    assert not closing["ok"] and closing["explanation"] == (
        "after the answer the prompt format writes '\\n', none of the tokens generation stops on (<|endoftext|>, "
        "<|im_end|>): the model learns to stop with a token that generation does not stop on")


def test_a_variant_on_changed_data_stops_at_preparation_with_both_versions(tmp_path: Path, tok, tiny_model) -> None:
    """The card check sees only the card: the same card over a data file with one training row changed is stopped when
    stage 01 prepares the data, before any file is written, naming both data versions."""
    from labkit.core.protocol import check_data_version
    from labkit.data.tickets import generate_tickets
    from labkit.errors import DataError

    data = tmp_path / "tickets.jsonl"
    rows, _ = generate_tickets(rows=60, seed=3)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first, manifest = _prepare(tmp_path / "a", tok, tiny_model, source={"path": str(data)})
    R.record(first, "completed", status="completed")
    (first.dir / "comparison").mkdir()
    (first.dir / "comparison" / "verdict.json").write_text("{}")  # a completed run with results: the reference
    rows[5]["text"] += " (edited)"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = _loaded(tmp_path / "b", source={"path": str(data)})
    second = R.new_run(loaded, first.root)
    with pytest.raises(DataError) as err:
        prepare(loaded.card, second, tok, tiny_model.revision)
    assert manifest["data_version"] in str(err.value) and first.run_id in str(err.value)
    assert "protocol_change" in str(err.value) and not (second.dir / "data_manifest.json").exists()
    assert not (second.dir / "data").exists()
    check_data_version(second, manifest["data_version"], None)  # the same data: no error
    check_data_version(second, "other", "the data was cleaned on purpose")  # a stated reason: goes on
