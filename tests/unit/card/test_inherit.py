"""A child card that picks another kind of method or data source keeps only the parent's keys that kind takes; every
other key merges as before, and a key the child writes itself is still checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

from labkit.card.load import load_card
from labkit.errors import CardError

SMOKE = REPO / "params" / "smoke.yaml"  # method: lora r 4 all-linear; data.source: builtin tickets, 60 rows, seed 3


def _child(tmp_path: Path, text: str, name: str = "child.yaml") -> Path:
    path = tmp_path / name
    path.write_text(f"parent: {SMOKE}\nexperiment: {{variant: child}}\n{text}")
    return path


def test_a_full_fine_tune_variant_of_a_lora_card(tmp_path: Path) -> None:
    loaded = load_card(_child(tmp_path, "method: {kind: full}\n"))
    assert loaded.card.method.model_dump() == {"kind": "full"}
    assert loaded.diff["method.kind"] == {"parent": "lora", "card": "full"}
    assert loaded.diff["method.r"] == {"parent": 4, "card": None}  # what the variant no longer has is in its diff


def test_qlora_keeps_the_lora_keys_and_lora_drops_the_quantisation(tmp_path: Path) -> None:
    qlora = load_card(_child(tmp_path, "method: {kind: qlora, quantisation: {type: fp4}}\n", "qlora.yaml")).card.method
    assert (qlora.kind, qlora.r, qlora.alpha, qlora.target_modules, qlora.quantisation.type) == (
        "qlora", 4, 8, "all-linear", "fp4")
    back = tmp_path / "back.yaml"
    back.write_text("parent: qlora.yaml\nexperiment: {variant: back}\nmethod: {kind: lora, r: 8}\n")
    lora = load_card(back).card.method
    assert (lora.kind, lora.r, lora.alpha) == ("lora", 8, 8) and not hasattr(lora, "quantisation")
    only_r = load_card(_child(tmp_path, "method: {r: 16}\n", "r16.yaml")).card.method  # no kind: merged as ever
    assert (only_r.kind, only_r.r, only_r.target_modules) == ("lora", 16, "all-linear")


def test_own_data_under_the_builtin_tickets(tmp_path: Path) -> None:
    (tmp_path / "mine.jsonl").write_text('{"id": "a", "text": "t", "answer": "{}", "category": "c"}\n')
    source = load_card(_child(tmp_path, "data: {source: {path: mine.jsonl}}\n")).card.data.source
    assert source.model_dump() == {"path": str(tmp_path / "mine.jsonl"), "format": "auto"}
    rows = load_card(_child(tmp_path, "data: {source: {rows: 100}}\n", "rows.yaml")).card.data.source
    assert (rows.builtin, rows.rows, rows.seed) == ("tickets", 100, 3)  # the same kind: merged


def test_a_key_the_childs_own_kind_does_not_take_is_still_refused_at_its_line(tmp_path: Path) -> None:
    path = _child(tmp_path, "method:\n  kind: full\n  r: 8\n")
    with pytest.raises(CardError, match=rf"^{re.escape(str(path))}:5: method\.r: unknown key"):
        load_card(path)
    path = _child(tmp_path, "data:\n  source:\n    path: mine.jsonl\n    rows: 10\n", "rows.yaml")
    with pytest.raises(CardError, match=r"rows\.yaml:6: data\.source\.rows: unknown key"):
        load_card(path)


def test_the_kinds_are_read_from_the_schema() -> None:
    from labkit.card.inherit import _METHODS, _SOURCES

    assert set(_METHODS) == {"full", "lora", "qlora"} and set(_SOURCES) == {"builtin", "path", "hf", "files"}



def _card(tmp_path: Path, name: str, parent: Path, text: str, target: str = "") -> Path:
    """A child card, with an experiment target of its own when `target` names a primary metric."""
    path = tmp_path / name
    experiment = (f"{{variant: {path.stem}, target: {{primary_metric: {target}}}, guardrails: []}}" if target
                  else f"{{variant: {path.stem}}}")
    path.write_text(f"parent: {parent}\nexperiment: {experiment}\n{text}")
    return path


def test_a_label_variant_of_a_json_target_and_back(tmp_path: Path) -> None:
    label = load_card(_card(tmp_path, "label.yaml", SMOKE, "data: {target_format: {kind: label}}\n", "accuracy"))
    fmt = label.card.data.target_format
    assert (fmt.kind, fmt.required_keys, fmt.category_key, fmt.labels) == ("label", [], "category", None)
    assert label.diff["data.target_format.required_keys"] == {"parent": ["category", "priority", "product"], "card": []}
    labelled = _card(tmp_path, "labelled.yaml", label.path, "data: {target_format: {labels: [billing, bug]}}\n")
    assert load_card(labelled).card.data.target_format.labels == ["billing", "bug"]  # no kind: merged as ever
    back = _card(tmp_path, "back.yaml", labelled, "data: {target_format: {kind: json, required_keys: [category]}}\n",
                 "field_accuracy")
    fmt = load_card(back).card.data.target_format
    assert (fmt.kind, fmt.required_keys, fmt.labels) == ("json", ["category"], None)


def test_a_target_format_key_the_child_writes_is_still_checked_at_its_line(tmp_path: Path) -> None:
    from labkit.cli.runner import check_card

    path = _card(tmp_path, "text.yaml", SMOKE, "data:\n  target_format:\n    kind: text\n    required_keys: [category]\n",
                 "exact_match")
    with pytest.raises(CardError, match=r"text\.yaml:6: data\.target_format\.required_keys: only a kind json"):
        check_card(load_card(path), tmp_path / "runs")


@pytest.mark.parametrize(("key", "value"), [("required_keys", "[category]"), ("optional_keys", "[note]"),
                                            ("category_key", "kind"), ("labels", "[billing]")])
def test_each_kind_only_key_is_refused_on_the_other_kinds(tmp_path: Path, key: str, value: str) -> None:
    """`TargetFormat.KIND_ONLY` (what a variant drops) agrees with what the checks refuse."""
    from labkit.card.experiment_and_data import TargetFormat
    from labkit.cli.runner import check_card

    for kind in sorted({"json", "label", "text"} - {TargetFormat.KIND_ONLY[key]}):
        extra = ", required_keys: [category]" if kind == "json" else ""
        path = _card(tmp_path, f"{kind}.yaml", SMOKE, f"data: {{target_format: {{kind: {kind}, {key}: {value}{extra}}}}}\n",
                     {"json": "field_accuracy", "label": "accuracy", "text": "exact_match"}[kind])
        with pytest.raises(CardError, match=rf"data\.target_format(\.|: ){key}"):
            check_card(load_card(path), tmp_path / "runs")
