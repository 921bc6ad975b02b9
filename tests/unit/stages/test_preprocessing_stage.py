"""Stage 02's module writes every file of preprocessing/ and its summary; `decide` decides from those files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from labkit.card.load import load_card
from labkit.core import io
from labkit.core import runs as R
from labkit.errors import PreprocessingCheckFailed
from labkit.stages import preprocessing
from labkit.stages.context import Stage, open_stage
from labkit.stages.records import PreprocessingSummary

REPO = Path(__file__).resolve().parents[3]


def _keys(record: type) -> set[str]:
    return set(record.__required_keys__ | record.__optional_keys__)


@pytest.fixture
def stage(tmp_path: Path) -> Stage:
    """Stage 02 of a fresh run of the smoke card (tiny Llama, 60 built-in tickets), as `labkit run` opens it."""
    run = R.new_run(load_card(REPO / "params" / "smoke.yaml"), tmp_path / "runs")
    return open_stage("preprocessing", str(run.card_path), str(run.dir))


def test_inspect_writes_what_the_notebook_shows(stage: Stage) -> None:
    found = preprocessing.inspect(stage)
    written = {p.name for p in stage.out.iterdir()}
    assert {"category_counts.json", "planted_check.json", "checks.json", "lengths.json", "samples.html"} <= written
    assert io.read_json(stage.path("checks.json")) == found.checks and all(c["ok"] for c in found.checks)
    assert {c["split"] for c in found.checks} == {"train", "validation", "model"}
    assert io.read_json(stage.path("lengths.json")) == found.lengths
    assert found.lengths["train"]["rows"] == len(found.splits["train"]) == found.manifest["split"]["sizes"]["train"]
    counts = io.read_json(stage.path("category_counts.json"))
    assert counts == found.counts and sum(counts["validation"].values()) == len(found.splits["validation"])
    assert found.planted is not None and found.planted["ok"]  # the built-in tickets know what they planted
    assert io.read_json(stage.path("planted_check.json")) == found.planted
    page = stage.path("samples.html").read_text(encoding="utf-8")
    assert page == found.page and page.count("lk-loss") > 10
    assert len(found.samples) == 2 * len(counts["train"]) + 2  # two per category, the longest and the shortest


def test_decide_records_the_summary_from_the_files(stage: Stage) -> None:
    found = preprocessing.inspect(stage)
    summary = preprocessing.decide(stage)
    assert set(summary) == _keys(PreprocessingSummary)
    assert json.loads(stage.path("summary.json").read_text()) == summary
    assert summary["data_version"] == found.manifest["data_version"] and summary["checks_ok"] is True
    assert summary["sizes"] == found.manifest["split"]["sizes"]
    assert summary["duplicate_pairs"] == len(found.leakage["pairs"])
    assert summary["cross_split_pairs"] == found.leakage["cross_split_pairs"]
    assert "preprocessing" in stage.run.status()["stages"]


def test_decide_stops_on_a_failed_check_in_checks_json(stage: Stage) -> None:
    """The decision reads checks.json, so a notebook cell cannot pass it other checks; nothing is recorded."""
    preprocessing.inspect(stage)
    checks = io.read_json(stage.path("checks.json"))
    checks[0].update(ok=False, failed=1, failed_ids=["r7"])
    io.write_json(stage.path("checks.json"), checks)
    expected = f"\"{checks[0]['check']}\" fails — {checks[0]['split']}: 1 row(s) r7: "
    with pytest.raises(PreprocessingCheckFailed, match=re.escape(expected)):
        preprocessing.decide(stage)
    assert not stage.path("summary.json").exists()


def test_a_check_failed_in_two_splits_is_one_entry_naming_the_check_then_each_splits_rows() -> None:
    """The check's name is a statement ("no example truncated …"): the line says it fails, then where."""
    why = "a truncated completion loses its EOS"
    checks = [{"split": "train", "check": "no example truncated by max_length", "ok": False, "failed": 7,
               "failed_ids": [f"t{i}" for i in range(7)], "explanation": why},
              {"split": "validation", "check": "no example truncated by max_length", "ok": False, "failed": 1,
               "failed_ids": ["v1"], "explanation": why},
              {"split": "train", "check": "every example has loss positions", "ok": True, "failed": 0, "failed_ids": [],
               "explanation": "teaches nothing"},
              {"split": "validation", "check": "padding carries no loss, the EOS does (pad = EOS)", "ok": False,
               "failed": 0, "failed_ids": [], "explanation": "the EOS is masked"}]
    with pytest.raises(PreprocessingCheckFailed) as failed:
        preprocessing.raise_on_failed(checks)
    assert str(failed.value) == (
        '"no example truncated by max_length" fails — train: 7 row(s) t0, t1, t2, t3, t4; validation: 1 row(s) v1: '
        'a truncated completion loses its EOS | "padding carries no loss, the EOS does (pad = EOS)" fails — '
        "validation: the EOS is masked")
