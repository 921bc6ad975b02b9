"""Data rows that try to slip past the checks: a key twice in one JSON row, a validation copy hidden by zero-width
characters."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.data.leakage import find_duplicates, normalise_text
from labkit.data.reading import read_file
from labkit.errors import DataError


def test_a_jsonl_row_with_a_key_twice_is_refused_with_file_and_line(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text('{"text": "fine", "label": "a"}\n{"text": "first", "label": "a", "text": "second"}\n')
    with pytest.raises(DataError, match=rf"{data}:2: key text appears twice"):
        read_file(data)


def test_a_json_object_with_a_key_twice_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "rows.json"
    data.write_text('[{"text": "a", "label": "x", "label": "y"}]')
    with pytest.raises(DataError, match="key label appears twice"):
        read_file(data)
    data.write_text('[{"text": "a", "label": "x"}, {"text": "a", "label": "x"}]')  # the same keys in two rows: fine
    assert len(read_file(data)[0]) == 2


def test_zero_width_characters_do_not_hide_a_copy() -> None:
    text = "The printer on floor three jams whenever a duplex job is sent from the billing laptop"
    hidden = "\u200b".join(text[i:i + 3] for i in range(0, len(text), 3)).replace(" ", " \u200d")
    hidden = "\ufeff" + hidden.replace("billing", "bil\u2060ling")
    assert hidden != text and normalise_text(hidden) == normalise_text(text)
    pairs = find_duplicates({"train": [("t1", text)], "validation": [("v1", hidden)]}, threshold=0.85)
    assert [(p["a_id"], p["b_id"], p["kind"]) for p in pairs] == [("t1", "v1", "exact")]


def test_a_reference_holding_the_eos_is_refused_at_preparation_with_the_row(tmp_path: Path, tiny_model) -> None:
    import json
    import re

    import yaml
    from conftest import REPO
    from transformers import AutoTokenizer

    from labkit.card.load import load_card
    from labkit.data.checks import check_special_tokens
    from labkit.data.prepare import derive_splits

    tok = AutoTokenizer.from_pretrained(tiny_model.location)
    rows = [{"id": f"r{i}", "text": f"note number {i} about the weather today", "summary": f"weather note {i}"}
            for i in range(40)]
    rows[17]["summary"] = f"weather note{tok.eos_token} and then more"
    data = tmp_path / "notes.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = yaml.safe_load((REPO / "params" / "quickstart.yaml").read_text())
    raw["model"] = {"source": "tiny:llama", "dtype": "float32"}
    raw["data"] = {"source": {"path": str(data)}, "fields": {"input": "text", "target": "summary", "id": "id", "category": None},
                   "target_format": {"kind": "text"}, "split": {"validation": 0.2, "test": 0.2, "seed": 1},
                   "max_length": 64}
    raw["experiment"]["target"] = {"behaviour": "summarisation", "primary_metric": "rougeL", "min_improvement": 0.1}
    raw["experiment"]["guardrails"] = []
    card = tmp_path / "card.yaml"
    card.write_text(yaml.safe_dump(raw))
    with pytest.raises(DataError, match=re.escape(f"{data}:18: row id 'r17' (") + r"\w+ split\): the reference "
                                        + re.escape(f"holds the special token '{tok.eos_token}'")):
        derive_splits(load_card(card).card, tok)
    check_special_tokens(tok, {"train": [{"id": "ok", "target": "plain words"}]}, {})  # nothing special: no error
