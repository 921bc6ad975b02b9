"""Rejected answers from the base model are generated only for the rows the run trains on (with train.max_steps,
what its steps read) and the validation rows, not the whole training split; a longer run of the same data adds only
the rows the cache lacks; the data version stays the whole split's (an SFT variant of the same rows shares it); and
stage 03's time plan counts what their generation took."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.core import runs as R
from labkit.core.io import read_jsonl
from labkit.data.pairs import rows_to_answer, rows_trained
from labkit.data.prepare import load_split, prepare
from labkit.evaluate.base_answers import base_model_answers
from labkit.model.loading import load_model, load_tokenizer
from labkit.preflight.timeplan import rejected_text, time_plan

CARD = REPO / "params" / "smoke-orpo-base.yaml"


def test_the_rows_a_run_reads() -> None:
    card = load_card(CARD).card  # max_steps 8 × micro_batch 4
    assert rows_trained(card, 100) == 32 and rows_trained(card, 20) == 20
    assert rows_trained(updated(card, {"train.grad_accum": 1, "train.micro_batch": 2}), 100) == 16
    assert rows_trained(updated(card, {"train.max_steps": None, "train.epochs": 0.5}), 100) == 100  # epochs: all
    rows = [{"id": f"r{i}"} for i in range(100)]
    few, more = rows_to_answer(card, rows), rows_to_answer(updated(card, {"train.max_steps": 12}), rows)
    assert len(few) == 32 and len(more) == 48 and {r["id"] for r in few} < {r["id"] for r in more}
    assert few == sorted(few, key=lambda r: int(r["id"][1:]))  # split order kept
    assert few != rows[:32]  # a seeded sample of the split, not its head


def test_only_the_trained_and_validation_rows_are_answered(tmp_path: Path, tiny_model) -> None:
    loaded = load_card(CARD)
    card = updated(loaded.card, {"train.max_steps": 2})  # 2 steps × 4 rows: 8 training rows of the split
    tokenizer = load_tokenizer(tiny_model, card)
    cache = tmp_path / "cache"
    sft = prepare(load_card(REPO / "params" / "smoke.yaml").card, R.new_run(loaded, tmp_path / "runs"), tokenizer,
                  tiny_model.revision)
    in_split = sft["split"]["sizes"]["train"]
    validation = sft["split"]["sizes"]["validation"]
    assert in_split > 8

    def load() -> object:
        return load_model(tiny_model, card, "cpu")

    run = R.new_run(loaded, tmp_path / "runs")
    manifest = prepare(card, run, tokenizer, tiny_model.revision, base_model_answers(card, tokenizer,
                                                                                     tiny_model.revision, load, cache))
    info = manifest["preference"]["from_base_model"]
    assert info["status"] == "generated" and info["generated_rows"] == 8 + validation
    assert info["rows_answered"] == {"train": 8, "validation": validation} and info["train_rows_in_split"] == in_split
    assert len(list(read_jsonl(Path(info["file"])))) == 8 + validation  # what was generated and cached, counted
    train = load_split(run, "train")
    assert len(train) == 8 - len(info["same_as_reference_left_out"]) and all("rejected" in r for r in train)
    assert manifest["data_version"] == sft["data_version"]  # the whole split's version: an SFT sibling shares it
    assert info["seconds"] > 0

    longer = updated(card, {"train.max_steps": 4})  # 16 rows: the 8 answered and 8 more, generated alone
    again = prepare(longer, R.new_run(loaded, tmp_path / "runs"), tokenizer, tiny_model.revision,
                    base_model_answers(longer, tokenizer, tiny_model.revision, load, cache))["preference"]["from_base_model"]
    assert again["status"] == "extended" and again["generated_rows"] == 8 and again["rows_answered"]["train"] == 16
    assert again["cached_seconds"] == pytest.approx(info["seconds"])
    reused = prepare(card, R.new_run(loaded, tmp_path / "runs"), tokenizer, tiny_model.revision,
                     base_model_answers(card, tokenizer, tiny_model.revision, load, cache))["preference"]["from_base_model"]
    assert reused["status"] == "reused" and reused["generated_rows"] == 0 and reused["seconds"] == 0.0
    cached_plan = time_plan(card, [100] * 8, [100] * 4, [{"seq_len": 100, "seconds_per_step": 1.0}], rejected=reused)
    assert "came from the cache: 0:00 in this run" in rejected_text(cached_plan)

    # stage 03's plan counts the generation (apart from the training time the trainer measures)
    measured = [{"seq_len": 100, "seconds_per_step": 1.0, "grad_accum": 1}]
    plan = time_plan(card, [100] * len(train), [100] * validation, measured, rejected=info)
    assert plan["rejected_answers"]["generated_rows"] == 8 + validation
    assert plan["total_seconds"] == pytest.approx(plan["train_seconds"] + info["seconds"])
    assert f"answered {8 + validation} of {8 + validation} rows (8 of the {in_split} training rows" in rejected_text(plan)
    assert time_plan(card, [100] * 8, [100] * 4, measured)["rejected_answers"] is None
