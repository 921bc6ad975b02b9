"""One resolved card per run, through papermill: a card that leaves `eval.max_new_tokens` out gets it sized in stage
01, and the stage's card carries it from then on (generation refuses an unsized card, so the baseline shows it)."""

from __future__ import annotations

from pathlib import Path

import yaml
from conftest import REPO, labkit

from labkit.core import io


def test_stage_01_sizes_the_length_and_the_baseline_generates_with_it(tmp_path: Path) -> None:
    card = tmp_path / "unsized.yaml"
    card.write_text(yaml.safe_dump({"parent": str(REPO / "params" / "smoke.yaml"), "experiment": {"variant": "unsized"},
                                    "eval": {"max_new_tokens": None}}))
    runs = tmp_path / "runs"
    proc = labkit("stage", "baseline", str(card), runs=runs)
    assert proc.returncode == 0, proc.stderr
    (run,) = [p for p in (runs / "smoke").iterdir() if not p.name.startswith("_")]
    sized = io.read_json(run / "generation_length.json")
    assert sized["from"] == "references" and sized["max_new_tokens"] >= sized["p95_tokens"] + 8
    assert yaml.safe_load((run / "card.yaml").read_text())["eval"]["max_new_tokens"] is None  # archived as written
    shown = (run / "notebooks" / "01_baseline.ipynb").read_text()
    assert f"Generation length: <strong>{sized['max_new_tokens']}</strong> new tokens, sized from the data" in shown
    assert io.read_json(run / "baseline" / "baseline_metrics.json")
