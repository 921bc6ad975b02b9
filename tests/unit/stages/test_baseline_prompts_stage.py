"""Stage 01 measures the base model under several prompts and takes the strongest as the reference — a real run of
the tiny model on a card whose references are what the model answers under the card template (so under that prompt
the base model is right, under the training prompt it is not: a base model that was prompted badly)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from labkit.card.load import load_card
from labkit.core import io
from labkit.core import runs as R
from labkit.data.prompting_baseline import baseline_prompt_ids
from labkit.evaluate.baseline_prompts import measure_strongest
from labkit.evaluate.generation import generate_answers
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.sources import resolve
from labkit.stages import baseline
from labkit.stages.context import open_stage
from labkit.stages.records import BASELINE_PROMPTS, baseline_named, strongest_baseline
from tests.conftest import smoke_rows

REPO = Path(__file__).resolve().parents[3]
TEMPLATE = "Ticket: {input}\nAnswer:"


def _card(rows_path: Path) -> dict:
    """The smoke card with text answers from `rows_path`, a plain training prompt and four baseline prompts."""
    raw = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text(encoding="utf-8"))
    raw["experiment"].update(target={"behaviour": "extraction", "primary_metric": "exact_match",
                                     "min_improvement": 0.05},
                             guardrails=[])
    raw["data"].update(source={"path": str(rows_path)}, target_format={"kind": "text"},
                       cleaning=["normalise_whitespace", "drop_empty"],
                       prompt={"format": "plain", "instruction": "Ticket:\n{input}"})
    raw["eval"].update(max_new_tokens=6, baseline_prompts=[
        "training", "chat_template", {"template": TEMPLATE, "stop": ["\n"], "name": "own"}, {"few_shot": 2}])
    return raw


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[R.Run, dict]:
    """Stage 01 of a card whose references are the tiny model's own greedy answers under the card template."""
    folder = tmp_path_factory.mktemp("bl")
    (folder / "card.yaml").write_text(yaml.safe_dump(_card(folder / "rows.jsonl")), encoding="utf-8")
    rows = [{"id": r["id"], "text": " ".join(r["input"].split()), "category": r["category"]} for r in smoke_rows(40)]
    io.write_jsonl(folder / "rows.jsonl", [{**r, "answer": "x"} for r in rows])
    card = load_card(folder / "card.yaml").card
    source = resolve(card.model.source)
    tokenizer, model = load_tokenizer(source, card), load_model(source, card, "cpu")
    own = card.eval.baseline_prompts[2]
    prompts = [baseline_prompt_ids(tokenizer, card, own, r["text"], []) for r in rows]
    answers = generate_answers(model, tokenizer, card, [{"input": r["text"], "id": r["id"]} for r in rows],
                               prompts=prompts, stop_strings=["\n"])
    io.write_jsonl(folder / "rows.jsonl", [{**r, "answer": a} for r, a in zip(rows, answers)])
    run = R.new_run(load_card(folder / "card.yaml"), folder / "runs")
    stage = open_stage("baseline", str(run.card_path), str(run.dir))
    result = baseline.run_baseline(stage)
    baseline.decide(stage)
    return run, result


def test_the_card_template_is_the_strongest_baseline_and_the_reference(measured: tuple[R.Run, dict]) -> None:
    run, result = measured
    record = io.read_json(run.dir / "baseline" / BASELINE_PROMPTS)
    by_name = {p["name"]: p for p in record["prompts"]}
    assert list(by_name) == ["training", "chat_template", "own", "few_shot_2"]
    assert record["strongest"] == "own" and record["higher_is_better"] is True
    assert by_name["own"]["primary"] > by_name["training"]["primary"]
    assert by_name["own"]["primary"] >= 0.8  # its own answers, up to batch-order numerics
    assert by_name["chat_template"]["skipped"] is None  # a plain training prompt: the tokenizer's ChatML is measured
    # the reference files are the strongest prompt's; every prompt's own files are kept
    assert result["metrics"] == io.read_json(run.dir / "baseline" / "prompts" / "own_metrics.json")
    reference = io.read_json(run.dir / "baseline" / "baseline_metrics.json")
    assert reference["overall"]["exact_match"] == by_name["own"]["primary"]
    for name in by_name:
        assert (run.dir / "baseline" / "prompts" / f"{name}_predictions.jsonl").exists()
    assert io.read_json(run.dir / "baseline" / "summary.json")["baseline_prompt"] == "own"
    # no answer under the card template carries the stop string
    own = io.read_jsonl(run.dir / "baseline" / "prompts" / "own_predictions.jsonl")
    assert not any("\n" in r["prediction"] for r in own)
    table = baseline.prompts_table(record)
    assert [r["reference"] for r in table] == ["", "", "strongest", ""]


def test_few_shot_examples_come_from_the_training_split_only(measured: tuple[R.Run, dict]) -> None:
    run, _ = measured
    record = io.read_json(run.dir / "baseline" / BASELINE_PROMPTS)
    shots = next(p for p in record["prompts"] if p["name"] == "few_shot_2")["shots"]
    train = {r["id"] for r in io.read_jsonl(run.dir / "data" / "train.jsonl")}
    validation = {r["id"] for r in io.read_jsonl(run.dir / "data" / "validation.jsonl")}
    assert len(shots) == 2 and {s["id"] for s in shots} <= train and not {s["id"] for s in shots} & validation


def test_consumers_name_the_strongest_baseline_and_final_measures_under_it(measured: tuple[R.Run, dict]) -> None:
    run, result = measured
    which = strongest_baseline(run.dir)
    assert which == {"name": "own", "description": f"the card template {TEMPLATE!r}", "measured": 4}
    decision = baseline_named({"verdict": "NOT CONFIRMED against the baseline: exact_match gain +0.000 < 0.05."}, which)
    assert decision["verdict"].startswith("NOT CONFIRMED against the baseline (strongest of 4 prompts: own, the card "
                                          "template")
    card = load_card(run.card_path).card
    source = resolve(card.model.source)
    rows = io.read_jsonl(run.dir / "data" / "validation.jsonl")
    _, metrics = measure_strongest(load_model(source, card, "cpu"), load_tokenizer(source, card), card, rows,
                                   io.read_json(run.dir / "baseline" / BASELINE_PROMPTS), "baseline")
    assert metrics["overall"]["exact_match"] == result["metrics"]["overall"]["exact_match"]
