"""Checkpoint validity: a truncated newest checkpoint falls back to the previous one, on checkpoints a real
(tiny) training wrote, and training resumes from the one chosen."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.data import sources as D
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.train.resilience import checkpoint_problem, last_checkpoint
from labkit.train.trainer import build_trainer


def _trainer(tiny_model, out: Path, steps: int):
    card = updated(load_card(REPO / "params" / "smoke.yaml").card, {"train.max_steps": steps, "train.save_steps": 2})
    rows = [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()]
    model = apply_method(load_model(tiny_model, card, "cpu"), card)
    return build_trainer(card, model, load_tokenizer(tiny_model, card), rows[:16], out, device="cpu",
                         checkpoints=True, disable_tqdm=True)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model) -> Path:
    """A Trainer output folder with checkpoint-2 and checkpoint-4, written by 4 steps of the smoke card."""
    out = tmp_path_factory.mktemp("trained")
    _trainer(tiny_model, out, 4).train()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    return out


def _copy(trained: Path, tmp_path: Path) -> Path:
    shutil.copytree(trained, tmp_path / "trainer")
    return tmp_path / "trainer"


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_complete_checkpoints_pass(trained: Path) -> None:
    for step in (2, 4):
        assert checkpoint_problem(trained / f"checkpoint-{step}") is None
    assert last_checkpoint(trained) == str(trained / "checkpoint-4")


@pytest.mark.parametrize("victim", ["weights", "optimizer.pt", "scheduler.pt", "trainer_state.json"])
def test_truncated_newest_falls_back_to_the_previous(trained: Path, tmp_path: Path, victim: str, capsys) -> None:
    folder = _copy(trained, tmp_path)
    newest = folder / "checkpoint-4"
    target = next(newest.glob("*.safetensors")) if victim == "weights" else newest / victim
    _truncate(target)
    assert checkpoint_problem(newest) is not None
    assert last_checkpoint(folder) == str(folder / "checkpoint-2")
    note = capsys.readouterr().out
    assert "checkpoint-4" in note and target.name in note  # the note names the skipped folder and why


def test_missing_or_empty_files_are_invalid(trained: Path, tmp_path: Path) -> None:
    folder = _copy(trained, tmp_path)
    newest = folder / "checkpoint-4"
    for weights in newest.glob("*.safetensors"):
        weights.unlink()
    assert "no weights" in checkpoint_problem(newest)
    (folder / "checkpoint-2" / "optimizer.pt").write_bytes(b"")
    assert "optimizer.pt is empty" in checkpoint_problem(folder / "checkpoint-2")
    assert last_checkpoint(folder, note=None) is None
    assert last_checkpoint(tmp_path / "missing") is None


def test_training_resumes_from_the_checkpoint_chosen(trained: Path, tmp_path: Path, tiny_model) -> None:
    folder = _copy(trained, tmp_path)
    _truncate(next((folder / "checkpoint-4").glob("*.safetensors")), keep=0.9)
    chosen = last_checkpoint(folder, note=None)
    assert chosen == str(folder / "checkpoint-2")
    trainer = _trainer(tiny_model, folder, 4)
    trainer.train(resume_from_checkpoint=chosen)
    assert trainer.state.global_step == 4
    assert checkpoint_problem(folder / "checkpoint-4") is None  # rewritten whole by the resumed training
