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


def _write_tickets(path: Path, edit: bool) -> None:
    """The built-in tickets as a data file (row 5 edited: one changed row)."""
    from labkit.data.tickets import generate_tickets

    rows, _ = generate_tickets(rows=60, seed=3)
    if edit:
        rows[5]["text"] += " (edited)"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _reference_run(tmp_path: Path, tok, tiny_model, edit: bool = True) -> tuple[Path, R.Run, dict]:
    """A completed run with results (the experiment's reference) on a tickets file, then the file with one row edited
    (`edit`): (the file, the run, its manifest)."""
    data = tmp_path / "tickets.jsonl"
    _write_tickets(data, edit=False)
    first, manifest = _prepare(tmp_path / "a", tok, tiny_model, source={"path": str(data)})
    R.record(first, "completed", status="completed")
    (first.dir / "comparison").mkdir()
    (first.dir / "comparison" / "verdict.json").write_text("{}")
    if edit:
        _write_tickets(data, edit=True)
    return data, first, manifest


def test_a_variant_on_changed_data_stops_at_preparation_with_both_versions(tmp_path: Path, tok, tiny_model) -> None:
    """The card check sees only the card: the same card over a data file with one training row changed is stopped when
    stage 01 prepares the data, before any file is written, naming both data versions."""
    from labkit.core.protocol import check_data_version
    from labkit.errors import DataError

    data, first, manifest = _reference_run(tmp_path, tok, tiny_model)
    loaded = _loaded(tmp_path / "b", source={"path": str(data)})
    second = R.new_run(loaded, first.root)
    with pytest.raises(DataError) as err:
        prepare(loaded.card, second, tok, tiny_model.revision)
    assert manifest["data_version"] in str(err.value) and first.run_id in str(err.value)
    assert "protocol_change" in str(err.value) and not (second.dir / "data_manifest.json").exists()
    assert not (second.dir / "data").exists()
    check_data_version(second, manifest["data_version"], None)  # the same data: no error
    check_data_version(second, "other", "the data was cleaned on purpose")  # a stated reason: goes on


def test_a_variant_of_another_base_model_is_held_to_the_same_rows_not_the_same_tokens(tmp_path: Path, tok,
                                                                                     tiny_model) -> None:
    """Two base models tokenise the same rows their own way: a variant of another model than the reference run's
    prepares the same data with another data version, and is comparable (its rows version is the reference's); the
    same tokens under the reference's own model would be a change; a changed row stops it before anything is written,
    naming both rows versions."""
    from transformers import AutoTokenizer

    from labkit.core.protocol import check_data_version, protocol_changes, rows_version, run_protocol
    from labkit.errors import DataError
    from labkit.model.sources import resolve

    data, first, manifest = _reference_run(tmp_path, tok, tiny_model, edit=False)
    phi3 = resolve("tiny:phi3")
    phi3_tok = AutoTokenizer.from_pretrained(phi3.location)

    def variant(folder: str):
        raw = yaml.safe_load((first.dir / "card.yaml").read_text())
        raw["model"]["source"], raw["experiment"]["variant"] = "tiny:phi3", "phi3"
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "card.yaml").write_text(yaml.safe_dump(raw))
        loaded = load_card(tmp_path / folder / "card.yaml")
        return loaded, R.new_run(loaded, first.root)

    loaded, second = variant("b")
    other = prepare(loaded.card, second, phi3_tok, phi3.revision)
    assert other["data_version"] != manifest["data_version"] and other["split"] == manifest["split"]
    ours, theirs = run_protocol(first.dir), run_protocol(second.dir)
    assert theirs["rows_version"] == ours["rows_version"] == rows_version(manifest["split"]["sha256"])
    assert protocol_changes(ours, theirs) == {}  # another model: the same rows are the same data
    same_model = {**theirs, "model_revision": ours["model_revision"]}  # other tokens under the reference's own model
    assert set(protocol_changes(ours, same_model)) == {"data_version"}
    _write_tickets(data, edit=True)
    loaded, third = variant("c")
    with pytest.raises(DataError) as err:
        prepare(loaded.card, third, phi3_tok, phi3.revision)
    assert f"differ from {ours['rows_version']}" in str(err.value) and first.run_id in str(err.value)
    assert "protocol_change" in str(err.value) and not (third.dir / "data_manifest.json").exists()
    with pytest.raises(DataError, match="data version"):  # the same model's data version is still compared
        check_data_version(third, "other", None, other["split"]["sha256"], tiny_model.revision)
