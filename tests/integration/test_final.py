"""`labkit final`: the test split is written nowhere, opens once (recorded), reopens only with a reason."""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

import pytest
import yaml

from labkit.card.load import load_card
from labkit.cli.main import build_parser
from labkit.cli.main import main as cli_main
from labkit.core import io
from labkit.core import runs as R
from labkit.data.prepare import load_split
from labkit.errors import CardError, DataError
from labkit.experiment import final as F
from labkit.stages.context import Stage


@pytest.fixture(scope="module")
def copy_run(smoke_run, tmp_path_factory):
    """Copy the shared smoke run's whole runs root (registry included) and return the copied run."""
    run_dir, _ = smoke_run

    def make(name: str) -> R.Run:
        root = tmp_path_factory.mktemp(name) / "runs"
        shutil.copytree(run_dir.parent.parent, root)
        return R.Run(root / run_dir.parent.name / run_dir.name)

    return make


def _tokenizer(run: R.Run):
    return Stage("preprocessing", load_card(run.card_path), run, interactive=False).tokenizer


def _events(run: R.Run, *kinds: str) -> list[dict]:
    return [e for e in R.read_registry(run.root) if e["event"] in kinds and e["run_id"] == run.run_id]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


@pytest.fixture(scope="module")
def opened(copy_run):
    """A copied run whose test split was opened once through `labkit --runs DIR final RUN`."""
    run = copy_run("opened")
    assert cli_main(["--runs", str(run.root), "final", run.run_id]) == 0
    return run


def test_final_evaluates_base_and_tuned_on_the_test_split(opened, capsys) -> None:
    run = opened
    manifest = io.read_json(run.dir / "data_manifest.json")
    n_test = manifest["split"]["sizes"]["test"]
    out = run.dir / "final"
    assert sorted(p.name for p in out.iterdir()) == sorted(F.FILES)
    base, tuned = io.read_json(out / "baseline_metrics.json"), io.read_json(out / "tuned_metrics.json")
    assert base["n"] == tuned["n"] == n_test > 0
    rows = F.open_test_split(run, _tokenizer(run))
    for name in ("baseline_predictions.jsonl", "tuned_predictions.jsonl"):
        preds = _jsonl(out / name)
        assert [p["id"] for p in preds] == [r["id"] for r in rows]  # exactly the test rows, none of validation's
        assert [p["input"] for p in preds] == [r["input"] for r in rows]
    # the same shapes as the comparison stage's files (same procedure, same scoring)
    shown = _jsonl(run.dir / "comparison" / "tuned_predictions.jsonl")[0]
    assert set(_jsonl(out / "tuned_predictions.jsonl")[0]) == set(shown)
    assert set(tuned) == set(io.read_json(run.dir / "comparison" / "tuned_metrics.json"))
    assert set(tuned["overall"]) == set(io.read_json(run.dir / "comparison" / "tuned_metrics.json")["overall"])
    verdict = io.read_json(out / "verdict.json")
    assert set(verdict) == set(io.read_json(run.dir / "comparison" / "verdict.json"))
    assert verdict["primary"]["tuned"] == tuned["overall"][verdict["primary"]["metric"]]
    opening = io.read_json(out / "opening.json")
    assert opening["experiment"] == run.experiment and opening["run_id"] == run.run_id
    assert opening["opening"] == 1 and opening["reopen"] is False and opening["why"] is None and opening["previous"] == []
    assert "@" in opening["who"] and opening["test_sha256"] == manifest["split"]["sha256"]["test"]
    # recorded before the data was read, the result after; the run's status is unchanged
    kinds = [e["event"] for e in R.read_registry(run.root) if e["run_id"] == run.run_id]
    assert kinds[-2:] == ["test_opened", "test_evaluated"]
    assert all(e["status"] == "completed" for e in _events(run, "test_opened", "test_evaluated"))
    assert run.status()["status"] == "completed"


def test_second_opening_is_refused_and_a_reopening_needs_a_reason(opened, capsys) -> None:
    run = opened
    before = (run.dir / "final" / "tuned_predictions.jsonl").read_text(encoding="utf-8")
    capsys.readouterr()
    assert cli_main(["--runs", str(run.root), "final", run.run_id]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "already opened 1 time(s)" in err and f"labkit final {run.run_id} --reopen --why" in err
    # any run of the experiment: a sibling run is refused as well
    twin = R.Run(run.dir.parent / (run.run_id + "-twin"))
    shutil.copytree(run.dir, twin.dir, ignore=shutil.ignore_patterns("final"))
    with pytest.raises(PermissionError, match=r"test split of experiment 'smoke' was already opened"):
        F.final(twin.run_id, run.root)
    with pytest.raises(ValueError, match=r"--reopen needs --why"):
        F.final(run.run_id, run.root, reopen=True, why="  ")
    assert len(_events(run, "test_opened")) == 1 and not _events(twin, "test_opened")  # refusals record nothing

    args = build_parser().parse_args(["--runs", str(run.root), "final", run.run_id, "--reopen", "--why", "validation set was tiny"])
    assert args.func(args) == 0
    opening = io.read_json(run.dir / "final" / "opening.json")
    assert opening["opening"] == 2 and opening["reopen"] is True and opening["why"] == "validation set was tiny"
    assert [p["opening"] for p in opening["previous"]] == [1]
    assert (run.dir / "final" / "opening-1" / "tuned_predictions.jsonl").read_text(encoding="utf-8") == before  # kept
    assert io.read_json(run.dir / "final" / "opening-1" / "opening.json")["opening"] == 1
    (last,) = _events(run, "test_opened")[-1:]
    assert last["opening"] == 2 and last["reopen"] is True and last["why"] == "validation set was tiny"
    listed = F.openings(run.root, "smoke")
    assert [(o["opening"], o["reopen"], o["why"], o["outcome"]) for o in listed] == [
        (1, False, None, "evaluated"), (2, True, "validation set was tiny", "evaluated")]
    assert F.openings(run.root, "other-experiment") == []


def _forms(text: str) -> set[bytes]:
    """The ways a text can appear in a file: raw, JSON-escaped, HTML-escaped, JSON inside JSON (notebook outputs)."""
    once = [text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1], html.escape(text),
            html.escape(text, quote=False)]
    return {f.encode() for f in once} | {json.dumps(f)[1:-1].encode() for f in once}


def _files_containing(folder: Path, texts: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    forms = {t: _forms(t) for t in texts}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        hits = [t for t, fs in forms.items() if any(f in data for f in fs)]
        if hits:
            found[str(path.relative_to(folder))] = hits
    return found


def test_test_rows_are_in_no_file_of_a_completed_run(copy_run, tmp_path) -> None:
    run = copy_run("nowhere")
    assert run.status()["status"] == "completed" and not (run.dir / "final").exists()
    assert not (run.dir / "data" / "test.jsonl").exists()
    rows = F.open_test_split(run, _tokenizer(run))
    assert len(rows) == io.read_json(run.dir / "data_manifest.json")["split"]["sizes"]["test"]
    others = [r["input"] for name in ("train", "validation") for r in load_split(run, name)]
    # a test text that is also another split's text (a planted cross-split duplicate) is not a secret
    secret = [r["input"] for r in rows if not any(r["input"] in o for o in others)]
    assert len(secret) >= len(rows) - 2 and secret
    assert _files_containing(run.dir, secret) == {}
    # the same scan does find the other splits' texts, in their JSON, HTML and notebook-output forms
    seen = _files_containing(run.dir, others)
    assert {"data/validation.jsonl", "baseline/baseline_predictions.jsonl", "preprocessing/samples.html",
            "notebooks/02_preprocessing.ipynb"} <= set(seen)

    with pytest.raises(PermissionError, match="locked"):
        load_split(run, "test")
    stage = Stage("comparison", load_card(run.card_path), run, interactive=False)
    with pytest.raises(PermissionError, match="locked"):
        stage.split("test")
    card = yaml.safe_load(run.card_path.read_text())
    card["eval"]["split"] = "test"
    (tmp_path / "card.yaml").write_text(yaml.safe_dump(card))
    with pytest.raises(CardError, match=r"card\.yaml:\d+: eval\.split: expected one of 'validation'; got 'test'"):
        load_card(tmp_path / "card.yaml")


def test_changed_data_is_refused(copy_run) -> None:
    run = copy_run("tampered")
    path = run.dir / "data_manifest.json"
    manifest = io.read_json(path)
    manifest["split"]["sha256"]["test"] = "0" * 64
    io.write_json(path, manifest)
    with pytest.raises(DataError) as caught:
        F.final(run.run_id, run.root)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    assert "split.sha256.test is 000000000000" in message and "the data changed since the run" in message
    assert message.endswith("(the test split was not opened: nothing is recorded)")  # re-validated before recording
    assert not (run.dir / "final").exists()
    assert not _events(run, "test_opened", "test_open_failed", "test_evaluated")
    assert F.openings(run.root, "smoke") == []  # the opening is not spent

    run = copy_run("edited")
    card = yaml.safe_load(run.card_path.read_text())
    card["data"]["source"]["rows"] = 70
    run.card_path.write_text(yaml.safe_dump(card, sort_keys=False))
    with pytest.raises(ValueError, match=rf"{run.card_path} was changed since the run"):
        F.final(run.run_id, run.root)
    assert not _events(run, "test_opened")
    with pytest.raises(DataError, match=r"data_manifest\.json: split\.sha256\.test is .* the data changed since the run"):
        F.open_test_split(run, _tokenizer(run))


def test_a_changed_data_file_is_refused_before_anything_is_recorded(copy_run, tmp_path) -> None:
    run = copy_run("file-source")
    data = tmp_path / "tickets.jsonl"
    data.write_text('{"id": "a", "text": "x", "answer": "{}"}\n')
    path = run.dir / "data_manifest.json"
    manifest = io.read_json(path)
    manifest["source"] = {"kind": "file", "path": str(data), "sha256": "f" * 64, "format": "jsonl"}  # as if read from it
    io.write_json(path, manifest)
    with pytest.raises(DataError, match=rf"{data}: the data file changed since the run \(sha256 [0-9a-f]{{12}}… ≠ ffffffffffff"):
        F.final(run.run_id, run.root)
    data.unlink()
    with pytest.raises(DataError, match=rf"{data}: the run's data file is gone"):
        F.final(run.run_id, run.root)
    assert not _events(run, "test_opened")


@pytest.mark.parametrize("event, status, reason", [("failed", "failed", "stage training failed"),
                                                   ("invalidated", "invalid", "wrong seed")])
def test_only_a_completed_run_opens_the_test_split(copy_run, event, status, reason) -> None:
    run = copy_run(status)
    R.record(run, event, status=status, error=reason, why=reason)
    with pytest.raises(ValueError, match=rf"smoke/{run.run_id} is {status}: only a completed run may open the test split"):
        F.final(run.run_id, run.root)
    assert not _events(run, "test_opened") and not (run.dir / "final").exists()
    with pytest.raises(FileNotFoundError, match="no run 'nope'"):
        F.final("nope", run.root)
