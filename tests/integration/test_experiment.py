"""Comparison across an experiment's variants: bootstrap intervals, concentration flags, the protocol check,
and the HTML report on real runs of the tiny model (one completed, one failed, one with a changed seed)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import labkit

from labkit.model.sources import resolve
from labkit.scoring.bootstrap import (
    Columns,
    concentration,
    metric,
    paired_intervals,
    per_category,
    weights,
)
from labkit.scoring.metrics import aggregate, score_predictions

FMT = {"kind": "json", "required_keys": ["category", "priority"], "category_key": "category"}
CATS = ["billing", "account", "shipping"]


def _rows(n: int, correct: list[bool], seed: int = 0) -> list[dict]:
    """Crafted scored predictions: example i answers its category right when correct[i]."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        cat = CATS[i % 3]
        wrong = rng.choice([c for c in CATS if c != cat])
        answer = {"category": cat if correct[i] else wrong, "priority": "low" if i % 2 else "high"}
        rows.append({"id": f"ex-{i:03d}", "category": cat, "target": json.dumps({"category": cat, "priority": "low" if i % 2 else "high"}),
                     "prediction": json.dumps(answer) if i % 7 else "not json"})
    return score_predictions(rows, FMT)[0]


def test_unit_weights_reproduce_the_metrics_exactly() -> None:
    rows = _rows(30, [i % 4 != 0 for i in range(30)])
    expected = aggregate(rows, FMT)
    cols = Columns(rows, [r["id"] for r in rows])
    ones = np.ones((1, len(rows)))
    for name in ("field_accuracy", "json_valid_rate", "field_presence_rate", "rouge1", "rouge2", "rougeL", "rougeLsum",
                 "mean_length_ratio", "exact_match", "accuracy", "macro_f1"):
        assert metric(ones, cols, name)[0] == pytest.approx(expected["overall"][name], abs=1e-12), name
    f1 = metric(ones, cols, "per_category_f1")
    accuracy = per_category(ones, cols, "field_accuracy")
    for cat, values in expected["per_category"].items():
        assert f1[cat][0] == pytest.approx(values["f1"], abs=1e-12)
        assert accuracy[cat][0] == pytest.approx(values["field_accuracy"], abs=1e-12)


def test_paired_bootstrap_intervals_on_crafted_predictions() -> None:
    n = 120
    base = _rows(n, [False] * n)
    same = paired_intervals(base, base, ["field_accuracy"], resamples=500)
    diff = same["overall"]["field_accuracy"]["diff"]
    assert (diff["value"], diff["low"], diff["high"]) == (0.0, 0.0, 0.0)  # paired: identical answers, no spread
    half = _rows(n, [i % 2 == 0 for i in range(n)])
    out = paired_intervals(base, half, ["field_accuracy", "per_category_f1"], resamples=2000, seed=1)
    leaf = out["overall"]["field_accuracy"]["diff"]
    # the category becomes right in the 51 even-numbered JSON answers: field accuracy gains 0.5 × 51/120 = 0.2125,
    # with a standard error of about 0.5 × sqrt(0.425 × 0.575 / 120) = 0.023
    assert leaf["value"] == pytest.approx(0.2125)
    assert 0.15 < leaf["low"] < 0.195 and 0.23 < leaf["high"] < 0.275
    assert "per_category_f1" not in out["overall"] and set(out["per_category"]["per_category_f1"]) == set(CATS)
    again = paired_intervals(base, half, ["field_accuracy"], resamples=2000, seed=1)
    assert again["overall"]["field_accuracy"] == out["overall"]["field_accuracy"]  # seeded: reproducible
    assert weights(5, 3, 0).sum(axis=1).tolist() == [5.0] * 4
    with pytest.raises(ValueError, match="same split"):
        paired_intervals(base, half[:-1], ["field_accuracy"])


def test_concentration_flags_a_gain_from_few_examples_or_one_category() -> None:
    n = 60
    base = _rows(n, [False] * n)
    broad = concentration(base, _rows(n, [i % 2 == 0 for i in range(n)]), "field_accuracy")
    assert broad["flags"] == [] and broad["top_share_of_gain"] < 0.5
    few = concentration(base, _rows(n, [i in (0, 1, 2) for i in range(n)]), "field_accuracy")
    assert few["top_share_of_gain"] == pytest.approx(1.0) and "most improved" in few["flags"][0]
    one_category = concentration(base, _rows(n, [i % 3 == 0 for i in range(n)]), "field_accuracy")  # billing only
    assert one_category["largest_category"] == "billing"
    assert any("one category (billing)" in flag for flag in one_category["flags"])


def _variant(tmp_path: Path, repo: Path, name: str, **changes: object) -> Path:
    card = {"parent": str(repo / "params" / "smoke.yaml"), "experiment": {"variant": name}}
    for key, value in changes.items():
        section, _, field = key.partition("__")
        card.setdefault(section, {})[field] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(card))
    return path


def test_three_variants_compared_with_failed_and_not_comparable_runs(smoke_run, tmp_path: Path, repo: Path) -> None:
    run_dir, _ = smoke_run
    runs = tmp_path / "runs"
    shutil.copytree(run_dir.parent.parent, runs)
    reference = run_dir.name

    refused = labkit("run", str(_variant(tmp_path, repo, "seed7", train__seed=7)), runs=runs)
    assert refused.returncode == 2  # a card refused before any run folder: bad input
    assert "protocol-fixed" in refused.stderr and "train.seed: 42 → 7" in refused.stderr
    assert "experiment.protocol_change" in refused.stderr
    assert not list((runs / "smoke").glob("seed7-*")), "a refused card must create no run folder"

    seed = _variant(tmp_path, repo, "seed7", train__seed=7,
                    experiment__protocol_change="checking how much the seed alone moves the result")
    assert labkit("run", str(seed), runs=runs).returncode == 0
    no_such = _variant(tmp_path, repo, "no-such-modules", method__target_modules=["no_such_proj"])
    refused = labkit("run", str(no_such), runs=runs)  # the method applied on the meta device before any run folder
    assert refused.returncode == 2 and f"labkit: error: {no_such}:" in refused.stderr, refused.stderr
    assert "method.target_modules ['no_such_proj']" in refused.stderr
    assert not list((runs / "smoke").glob("no-such-modules-*")), "a method that cannot apply must create no run folder"
    alone = labkit("stage", "parameter_check", str(no_such), runs=runs)  # a stage alone checks it alike
    assert alone.returncode == 2 and alone.stderr.strip().splitlines()[-1] == refused.stderr.strip().splitlines()[-1]
    assert not list((runs / "smoke").glob("no-such-modules-*"))
    weights = tmp_path / "broken-weights"  # a failure no check can see: weights that do not load (a failed run)
    shutil.copytree(resolve("tiny:llama").location, weights)
    (weights / "model.safetensors").write_bytes(b"\0" * 64)
    broken_card = _variant(tmp_path, repo, "broken-weights", model__source=str(weights), model__dtype="float32",
                           experiment__protocol_change="the same model from a local folder")
    broken = labkit("run", str(broken_card), runs=runs)
    assert broken.returncode != 0 and "model does not load" in broken.stderr, broken.stderr

    compared = labkit("compare", "smoke", "--resamples", "300", runs=runs)
    assert compared.returncode == 0, compared.stderr
    out = runs / "smoke" / "_report"
    comparison = json.loads((out / "comparison.json").read_text())
    by_variant = {r["variant"]: r for r in comparison["runs"]}
    assert set(by_variant) == {"tiny-lora", "seed7", "broken-weights"}
    assert comparison["reference"] == reference
    assert by_variant["broken-weights"]["status"] == "failed"
    assert "model does not load" in by_variant["broken-weights"]["reason"]
    assert by_variant["tiny-lora"]["comparable"] is True
    seed_row = by_variant["seed7"]
    assert seed_row["comparable"] is False and set(seed_row["protocol_changes"]) == {"train.seed"}
    assert seed_row["protocol_change_why"].startswith("checking how much")
    assert {k: v["new"] for k, v in seed_row["changed"].items()} == {
        "experiment.variant": "seed7", "experiment.protocol_change": seed_row["protocol_change_why"], "train.seed": 7}
    assert seed_row["changed"]["train.seed"]["old"] == 42
    for row in (by_variant["tiny-lora"], seed_row):  # the intervals' point values are stage 05's own metrics
        verdict = json.loads((tmp_path / row["dir"] / "comparison" / "verdict.json").read_text())  # relative to the project
        primary = row["intervals"]["overall"]["field_accuracy"]
        assert primary["tuned"]["value"] == pytest.approx(verdict["primary"]["tuned"])
        assert primary["baseline"]["value"] == pytest.approx(verdict["primary"]["baseline"])
        assert primary["tuned"]["low"] <= primary["tuned"]["value"] <= primary["tuned"]["high"]
        assert sum(row["paired"][k] for k in ("wins", "losses", "ties")) == row["intervals"]["n"]

    index = (out / "index.html").read_text()
    for row in comparison["runs"]:  # each run's executed stages as pages (the failed one's stage 01 too)
        assert row["run_id"] in index
        assert (out / "runs" / row["run_id"] / "01_baseline.html").exists()
    assert "Not comparable" in index and "checking how much the seed alone" in index and "model does not load" in index
    for image in ("loss_curves.png", "per_category_field_accuracy.png", "per_category_f1.png", "confusion_matrices.png"):
        assert (out / image).stat().st_size > 5000 and f'src="{image}"' in index
