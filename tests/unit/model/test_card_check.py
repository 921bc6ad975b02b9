"""One `check_card` before a run exists: the CLI (`labkit check`, `run`, `stage`) and a notebook opened by hand
(`open_stage`) refuse a bad card with the same one line, `file:line` included, and the check needs no torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from labkit.cli.main import main
from labkit.errors import ModelSourceError


def _bad_source(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bad-source.yaml"
    path.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\nexperiment: {{variant: bad-source}}\n"
                    "model:\n  source: s3://bucket/model\n")
    return path


def test_open_stage_names_the_line_of_a_bad_model_source_like_the_cli(tmp_path: Path, monkeypatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from labkit.stages.context import open_stage

    card = _bad_source(tmp_path / "cards")
    runs = tmp_path / "runs"
    monkeypatch.setenv("LABKIT_RUNS", str(runs))
    assert main(["--runs", str(runs), "check", str(card)]) == 2
    cli = [line for line in capsys.readouterr().err.splitlines() if line.startswith("labkit: error: ")]
    with pytest.raises(ModelSourceError) as info:
        open_stage("baseline", str(card))
    message = str(info.value)
    assert message.startswith(f"{card}:4: model.source 's3://bucket/model': unknown scheme"), message
    assert cli == [f"labkit: error: {message}"]
    assert not list(runs.glob("*/*/status.json"))  # refused before a run folder exists


def test_the_card_check_imports_neither_torch_nor_transformers() -> None:
    code = "import sys, labkit.model.card_check; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.stdout.split() == ["False", "False"]
