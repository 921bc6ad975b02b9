"""Replicates (experiment.replicates): the card key, each replicate's recorded seed, the seed the stages read, and
the comparison across seeds — on run folders created by labkit's own `new_run` and filled with scored rows (no
model): stage files as stages 01 and 05 write them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from labkit.card.load import load_card
from labkit.core import io
from labkit.core import runs as R
from labkit.core.protocol import check_protocol
from labkit.core.replicates import read_replicate, replicates, run_seed
from labkit.core.run_card import resolved_card
from labkit.errors import CardError
from labkit.experiment.compare import compare_experiment
from labkit.experiment.report import build_report
from labkit.experiment.runs_table import pair_rows, seed_rows, summary_rows
from labkit.scoring.metrics import score_predictions

N = 60
CATEGORIES = ("billing", "technical", "account")


def _card(tmp: Path, repo: Path, variant: str, k: int, **extra: object) -> Path:
    path = tmp / f"{variant}.yaml"
    path.write_text(yaml.safe_dump({"parent": str(repo / "params" / "smoke.yaml"),
                                    "experiment": {"variant": variant, "replicates": k, **extra}}))
    return path


def _answer(i: int, right: bool) -> str:
    return json.dumps({"category": CATEGORIES[i % 3], "priority": "low" if right else "high",
                       "product": "x" if right else "y"})


def _scored(loaded, p_right: float, rng: random.Random, n: int = N) -> tuple[list[dict], dict]:
    rows = [{"id": f"t{i:03d}", "category": CATEGORIES[i % 3], "target": _answer(i, True),
             "prediction": _answer(i, rng.random() < p_right)} for i in range(n)]
    return score_predictions(rows, loaded.card.data.target_format.model_dump())


def _finish(run: R.Run, loaded, p_right: float, seed: int, key: str = "k1", n: int = N) -> None:
    """What stages 01 and 05 leave for the comparison: both models' scored rows and metrics (on the first `n` examples),
    the baseline key, the verdict file; then the run completes."""
    base_rows, base_metrics = _scored(loaded, 0.1, random.Random(0), n)  # one baseline, shared by every run
    tuned_rows, tuned_metrics = _scored(loaded, p_right, random.Random(seed), n)
    io.write_jsonl(run.stage_dir("baseline") / "baseline_predictions.jsonl", base_rows)
    io.write_json(run.dir / "baseline" / "baseline_metrics.json", base_metrics)
    io.write_json(run.dir / "baseline" / "baseline_key.json", {"key": key})
    io.write_jsonl(run.stage_dir("comparison") / "tuned_predictions.jsonl", tuned_rows)
    io.write_json(run.dir / "comparison" / "tuned_metrics.json", tuned_metrics)
    io.write_json(run.dir / "comparison" / "verdict.json", {"confirmed": False})
    R.record(run, "completed", status="completed")


def _replicated(root: Path, path: Path, p_right: list[float]) -> list[R.Run]:
    loaded = load_card(path)
    out = []
    for rep, p in zip(replicates(loaded.card), p_right):
        assert check_protocol(loaded.resolved, root, str(path)) == {}  # a replicate's seed trips no protocol check
        run = R.new_run(loaded, root, replicate=rep)
        _finish(run, loaded, p, rep["seed"])
        out.append(run)
    return out


def test_the_card_key_defaults_to_one_and_refuses_zero(tmp_path: Path, repo: Path) -> None:
    assert load_card(repo / "params" / "smoke.yaml").card.experiment.replicates == 1
    assert load_card(_card(tmp_path, repo, "three", 3)).card.experiment.replicates == 3
    with pytest.raises(CardError, match="replicates"):
        load_card(_card(tmp_path, repo, "none", 0))


def test_each_replicate_records_its_seed_and_the_stages_read_it(tmp_path: Path, repo: Path) -> None:
    root = tmp_path / "runs"
    path = _card(tmp_path, repo, "three", 3)
    runs = _replicated(root, path, [0.5, 0.6, 0.7])
    seeds = [read_replicate(run.dir)["seed"] for run in runs]
    assert seeds == [42, 43, 44] and [read_replicate(run.dir)["index"] for run in runs] == [1, 2, 3]
    for run, seed in zip(runs, seeds):
        archived = load_card(run.card_path)
        assert archived.card.train.seed == 42  # the protocol's seed stays in card.yaml …
        assert resolved_card(archived.card, run.dir).train.seed == seed  # … the stages train with the replicate's
        assert run_seed(run.dir, archived.resolved) == seed and run.status()["seed"] == seed
    rows = {r["run_id"]: r for r in R.summarise(R.read_registry(root))}
    assert [(rows[r.run_id]["replicate"], rows[r.run_id]["replicates"], rows[r.run_id]["seed"]) for r in runs] == \
        [(1, 3, 42), (2, 3, 43), (3, 3, 44)]
    single = load_card(repo / "params" / "smoke.yaml")
    plain = R.new_run(single, root)  # a card without replicates: no record, the card's seed
    assert read_replicate(plain.dir) is None and resolved_card(single.card, plain.dir).train.seed == 42


def test_the_comparison_judges_replicated_variants_across_seeds(tmp_path: Path, repo: Path) -> None:
    root = tmp_path / "runs"
    wide = _replicated(root, _card(tmp_path, repo, "wide", 3), [0.15, 0.55, 0.95])  # a large seed spread
    tight = _replicated(root, _card(tmp_path, repo, "tight", 3), [0.8, 0.8, 0.8])
    comparison = compare_experiment(root, "smoke", resamples=400)
    variants = {v["variant"]: v for v in comparison["variants"]}
    assert set(variants) == {"wide", "tight"}
    for name, runs in (("wide", wide), ("tight", tight)):
        v = variants[name]
        assert v["runs"] == [r.run_id for r in runs] and v["seeds"] == [42, 43, 44]
        assert set(v["per_seed"]) == {"42", "43", "44"} and v["metric"] == "field_accuracy"
        assert v["mean"] == pytest.approx(sum(v["per_seed"].values()) / 3)
        assert v["min"] <= v["mean"] <= v["max"] and v["std"] >= 0
        iv = v["interval"]
        assert iv["b"]["per_seed"] == pytest.approx(list(v["per_seed"].values()))
        assert iv["diff"]["low"] <= iv["diff"]["value"] <= iv["diff"]["high"]
    assert variants["wide"]["std"] > 5 * variants["tight"]["std"]
    w = variants["wide"]["interval"]
    only = w["diff_examples_only"]
    assert w["diff"]["high"] - w["diff"]["low"] > 1.5 * (only["high"] - only["low"])
    # the mean gain clears min_improvement (0.05), the interval over seeds and examples does not
    assert w["diff"]["value"] > 0.05 > w["diff"]["low"]
    assert not variants["wide"]["confirmed"] and variants["wide"]["verdict"].startswith("INCONCLUSIVE across 3 seeds")
    assert variants["tight"]["interval"]["diff"]["low"] > 0.05
    assert variants["tight"]["confirmed"] and variants["tight"]["verdict"].startswith("CONFIRMED against the baseline")
    # variant against variant: one pair across seeds, no run-by-run pairs between replicates
    (pair,) = comparison["pairs"]
    assert (pair["a_variant"], pair["b_variant"]) == ("wide", "tight")
    assert pair["seeds"] == {"a": [42, 43, 44], "b": [42, 43, 44]} and pair["a_runs"] == [r.run_id for r in wide]
    assert pair["across_seeds"]["a"]["per_seed"] == pytest.approx(list(variants["wide"]["per_seed"].values()))
    assert pair["decision"] in ("B better", "no difference shown", "A better")
    assert pair["across_seeds"]["seed_pairs"]["of"] == 9
    table = pair_rows(comparison)[0]
    assert "3 seed(s): 42, 43, 44" in table["A"] and "sd " in table["A value"]
    assert "across seeds" in table["B − A [95% CI]"]
    seeds = [r["seed"] for r in summary_rows(comparison)]
    assert seeds == [f"{s} (replicate {i}/3)" for s, i in ((42, 1), (43, 2), (44, 3))] * 2
    rows = seed_rows(comparison)  # the report's table: every seed, then the variant across them
    assert [r["seed"] for r in rows] == ["42", "43", "44", "mean of 3"] * 2
    assert rows[3]["verdict"] == variants["wide"]["verdict"] and "sd " in rows[3]["field_accuracy"]
    index = build_report(root, "smoke", resamples=100).read_text()
    assert "Variants across seeds" in index and all(r.run_id in index for r in wide + tight)


def test_a_later_run_of_a_seed_replaces_the_earlier_one_and_an_edited_card_starts_a_new_group(
        tmp_path: Path, repo: Path) -> None:
    root = tmp_path / "runs"
    path = _card(tmp_path, repo, "v", 2)
    first = _replicated(root, path, [0.5, 0.6])
    again = _replicated(root, path, [0.7, 0.8])  # the same card run again: the latest run of each seed counts
    (v,) = compare_experiment(root, "smoke", resamples=100)["variants"]
    assert v["runs"] == [r.run_id for r in again] and not set(v["runs"]) & {r.run_id for r in first}
    edited = _card(tmp_path, repo, "v", 2, hypothesis="An edited hypothesis makes another card of the same name.")
    _replicated(root, edited, [0.5])
    comparison = compare_experiment(root, "smoke", resamples=100)
    assert comparison["variants"] == []  # the edited card has one seed so far: nothing to judge across seeds


def test_labkit_runs_shows_the_replicate_and_its_seed(tmp_path: Path, repo: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    from labkit.cli.main import main

    root = tmp_path / "runs"
    runs = _replicated(root, _card(tmp_path, repo, "three", 3), [0.5, 0.6, 0.7])
    assert main(["--runs", str(root), "runs", "smoke"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["run", "replicate", "status"]
    for run, shown in zip(runs, ("1/3 seed 42", "2/3 seed 43", "3/3 seed 44")):
        (line,) = [x for x in lines if x.split()[0] == f"smoke/{run.run_id}"]
        assert shown in line and "completed" in line


def test_variants_of_two_base_models_are_paired_on_the_same_examples(tmp_path: Path, repo: Path) -> None:
    """Two base models (each its own baseline key) evaluated on the same examples pair run against run; a run
    evaluated on other examples pairs with neither."""
    root = tmp_path / "runs"
    runs = {}
    for variant, source, key, n in (("llama", "tiny:llama", "k1", N), ("phi3", "tiny:phi3", "k2", N),
                                    ("fewer", "tiny:llama", "k1", N - 10)):
        loaded = load_card(_with_model(tmp_path, repo, variant, source))
        runs[variant] = R.new_run(loaded, root)
        _finish(runs[variant], loaded, 0.8, 42, key, n)
    comparison = compare_experiment(root, "smoke", resamples=200)
    assert all(r["comparable"] for r in comparison["runs"])
    (pair,) = comparison["pairs"]
    assert (pair["a_variant"], pair["b_variant"]) == ("llama", "phi3") and pair["metric"] == "field_accuracy"


def _with_model(tmp: Path, repo: Path, variant: str, source: str) -> Path:
    path = tmp / f"{variant}.yaml"
    path.write_text(yaml.safe_dump({"parent": str(repo / "params" / "smoke.yaml"), "experiment": {"variant": variant},
                                    "model": {"source": source}}))
    return path
