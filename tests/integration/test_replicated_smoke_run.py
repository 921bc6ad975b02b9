"""Three replicates of the smoke card through `labkit run`: three runs with their own recorded seeds, trained
differently, one baseline measurement, and `labkit compare` judging the variant across its seeds."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from conftest import labkit

from labkit.core.io import read_jsonl


def test_three_replicates_of_the_smoke_card_give_a_seed_aware_comparison(tmp_path: Path, repo: Path) -> None:
    runs = tmp_path / "runs"
    card = tmp_path / "smoke-3-seeds.yaml"
    card.write_text(yaml.safe_dump({"parent": str(repo / "params" / "smoke.yaml"),
                                    "experiment": {"variant": "tiny-lora-3-seeds", "replicates": 3}}))
    proc = labkit("run", str(card), runs=runs, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for i, seed in ((1, 42), (2, 43), (3, 44)):
        assert f"(replicate {i}/3, seed {seed})" in proc.stdout
    folders = sorted((p for p in (runs / "smoke").iterdir() if not p.name.startswith("_")),
                     key=lambda p: json.loads((p / "replicate.json").read_text())["index"])
    assert [json.loads((p / "replicate.json").read_text())["seed"] for p in folders] == [42, 43, 44]
    assert all(yaml.safe_load((p / "card.yaml").read_text())["train"]["seed"] == 42 for p in folders)
    cached = [json.loads((p / "baseline" / "baseline_key.json").read_text())["cached"] for p in folders]
    assert cached == [False, True, True]  # one baseline measurement, reused by the later replicates
    losses = [[e["loss"] for e in read_jsonl(p / "training" / "log_history.jsonl") if "loss" in e] for p in folders]
    assert all(losses) and len({tuple(x) for x in losses}) == 3  # each seed trained differently

    compared = labkit("compare", "smoke", "--resamples", "300", runs=runs)
    assert compared.returncode == 0, compared.stderr[-3000:]
    comparison = json.loads((runs / "smoke" / "_report" / "comparison.json").read_text())
    assert [r["seed"] for r in comparison["runs"]] == [42, 43, 44]
    (variant,) = comparison["variants"]
    assert variant["seeds"] == [42, 43, 44] and variant["runs"] == [p.name for p in folders]
    assert len(variant["per_seed"]) == 3 and variant["std"] is not None
    iv = variant["interval"]
    assert iv["method"].startswith("two-level") and iv["n"] == comparison["runs"][0]["intervals"]["n"]
    assert iv["diff"]["low"] <= iv["diff"]["value"] <= iv["diff"]["high"]
    assert iv["diff_examples_only"]["low"] is not None
    assert variant["verdict"].startswith(("CONFIRMED", "NOT CONFIRMED", "INCONCLUSIVE across 3 seeds"))
    assert comparison["pairs"] == []  # replicates of one variant are not paired run by run
    index = (runs / "smoke" / "_report" / "index.html").read_text()
    assert "Variants across seeds" in index and all(p.name in index for p in folders)
