"""Issue 13, one test per item: bad input never costs a decision.

1. every reference checked at preparation, in every split, before anything is written; `labkit final` re-validates
   before recording the opening; stage 02's data checks fail stage 01 first, with the same message;
2. cards: duplicate keys, paths relative to the card only, non-UTF-8, card-only checks before a run folder exists,
   `labkit check`;
3. honest statuses and the budget stop;
4. the registry and folders;
5. hub sources.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO
from test_bad_inputs import CARD, MARKER, TEST_ROW, _merge, _rows

from labkit.card.load import load_card
from labkit.cli import runner
from labkit.cli.summary import budget_stop
from labkit.cli.main import main
from labkit.core import io
from labkit.core import runs as R
from labkit.core.protocol import experiment_runs
from labkit.data import prepare as P
from labkit.errors import CardError, DataError, PreprocessingCheckFailed
from labkit.experiment.final import openings
from labkit.stages import preprocessing
from labkit.stages.context import Stage


def _project(tmp_path: Path, rows: list[dict[str, Any]] | None = None, **card: Any) -> Path:
    project = tmp_path / "project"
    project.mkdir(parents=True, exist_ok=True)
    (project / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (rows or _rows())))
    path = project / "card.yaml"
    path.write_text(yaml.safe_dump(_merge(CARD, card), sort_keys=False))
    return path


def _files(folder: Path) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime for p in folder.rglob("*")} if folder.exists() else {}


@pytest.fixture
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model.location)


def _bad_test_reference(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows[TEST_ROW] = {**rows[TEST_ROW], "answer": f"{MARKER}: not json"}
    return rows


# ---------------------------------------------------------------------- 1. references
def test_item1_every_reference_is_validated_at_preparation_in_every_split(tmp_path: Path, tok, tiny_model) -> None:
    card = _project(tmp_path, _bad_test_reference(_rows()))
    loaded = load_card(card)
    run = R.new_run(loaded, tmp_path / "runs")
    with pytest.raises(DataError) as caught:
        P.prepare(loaded.card, run, tok, tiny_model.revision)
    message = str(caught.value)
    assert message == (f"{card.parent / 'data.jsonl'}:{TEST_ROW + 1}: row id 'r0{TEST_ROW}' (test split): reference is "
                       "not JSON (data.target_format.kind is json); fix the 'answer' value or remove the row")
    assert MARKER not in message  # the test row's content is never shown
    assert not (run.dir / "data_manifest.json").exists() and not (run.dir / "data").exists()  # nothing written


def test_item1_category_column_against_the_category_inside_the_answer(tmp_path: Path, tok) -> None:
    rows = _rows()
    rows[3]["category"] = "billing"  # the answer says refund
    loaded = load_card(_project(tmp_path, rows))
    with pytest.raises(DataError, match=r"data\.jsonl:4: row id 'r003' \(train split\): the 'category' column "
                                        r"\(data\.fields\.category\) disagrees with 'category' inside the reference"):
        P.derive_splits(loaded.card, tok)


def test_item1_truncation_fails_stage_01_with_stage_02s_message(tmp_path: Path, tok, tiny_model) -> None:
    loaded = load_card(_project(tmp_path, data={"max_length": 40}))
    run = R.new_run(loaded, tmp_path / "runs")
    with pytest.raises(PreprocessingCheckFailed) as in_stage_01:
        P.prepare(loaded.card, run, tok, tiny_model.revision)  # what stage 01 calls, before the baseline
    splits = P.derive_splits(loaded.card, tok).splits
    _, checks = preprocessing.run_checks(tok, loaded.card, {n: splits[n] for n in ("train", "validation")})
    with pytest.raises(PreprocessingCheckFailed) as in_stage_02:
        preprocessing.raise_on_failed(checks)  # what stage 02 would have reported
    assert str(in_stage_01.value) == str(in_stage_02.value)
    assert "no example truncated by max_length" in str(in_stage_01.value)
    assert not (run.dir / "data_manifest.json").exists()


def test_item1_final_revalidates_before_recording_the_opening(tmp_path: Path, tok, tiny_model, monkeypatch,
                                                              capsys) -> None:
    """A run prepared without reference checks (an older labkit) with a bad test reference: `labkit final` refuses
    before the opening is recorded, so the opening is not spent."""
    card = _project(tmp_path, _bad_test_reference(_rows()))
    loaded = load_card(card)
    root = tmp_path / "runs"
    run = R.new_run(loaded, root)
    with monkeypatch.context() as older:
        older.setattr(P, "check_references", lambda card, splits, where: {})
        P.prepare(loaded.card, run, tok, tiny_model.revision)
    Stage("baseline", loaded, run, interactive=False).model_source  # noqa: B018 - as stage 01 records it
    for stage in R.STAGES:
        R.record(run, "stage_done", stage=stage)
    R.record(run, "completed", status="completed")
    (run.dir / "training" / "adapter").mkdir(parents=True)
    registry, files = run.registry.read_text(), _files(run.dir)
    code = main(["--runs", str(root), "final", run.run_id])
    out, err = capsys.readouterr()
    assert code == 2
    (line,) = [x for x in err.splitlines() if x.startswith("labkit: error:")]
    assert f"data.jsonl:{TEST_ROW + 1}: row id 'r0{TEST_ROW}' (test split): reference is not JSON" in line
    assert line.endswith("(the test split was not opened: nothing is recorded)")
    assert MARKER not in out + err
    assert openings(root, run.experiment) == [] and run.registry.read_text() == registry  # the opening is not spent
    assert _files(run.dir) == files and not (run.dir / "final").exists()


def test_item1_final_on_a_failed_run_names_its_status(tmp_path: Path, capsys) -> None:
    loaded = load_card(_project(tmp_path))
    run = R.new_run(loaded, tmp_path / "runs")
    R.record(run, "failed", status="failed", stage="baseline", error="boom")
    assert main(["--runs", str(tmp_path / "runs"), "final", run.run_id]) == 2
    err = capsys.readouterr().err
    assert f"labkit: error: bad-inputs/{run.run_id} is failed: only a completed run may open the test split (finish it " \
           "first with `labkit run --resume RUN_ID`)" in err


# ---------------------------------------------------------------------- 2. cards
def test_item2_duplicate_keys_name_both_lines(tmp_path: Path) -> None:
    card = tmp_path / "card.yaml"
    card.write_text(yaml.safe_dump(CARD, sort_keys=False) + "train: {max_steps: 9}\n")
    first = next(i for i, line in enumerate(card.read_text().splitlines(), 1) if line.startswith("train:"))
    last = len(card.read_text().splitlines())
    with pytest.raises(CardError) as caught:
        load_card(card)
    assert str(caught.value) == (f"{card}:{last}: train: given twice (lines {first} and {last}); keep one (YAML would "
                                 "silently use the last)")


def test_item2_paths_resolve_relative_to_the_card_only(tmp_path: Path) -> None:
    (tmp_path / "shadow.jsonl").write_text("{}\n")  # in the folder above the card: must not be found
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(CARD))
    card = _project(tmp_path, data={"source": {"path": "shadow.jsonl"}})
    with pytest.raises(CardError, match=r"card\.yaml:\d+: data\.source\.path: file not found: shadow\.jsonl \(looked for "
                                        f"{card.parent / 'shadow.jsonl'}; paths are relative to the folder of the card that writes them\\)"):
        load_card(card)
    card.write_text("parent: base.yaml\n")
    with pytest.raises(CardError, match=rf"{card}:1: parent: card not found: {card.parent / 'base.yaml'}"):
        load_card(card)
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text("{}")
    card = _project(tmp_path, model={"source": "../my-model"})
    assert load_card(card).card.model.source == str(tmp_path / "my-model")  # against the card, not the run folder


def test_item2_non_utf8_card_is_one_line_with_the_byte_offset(tmp_path: Path) -> None:
    card = tmp_path / "card.yaml"
    text = yaml.safe_dump(CARD).encode()
    card.write_bytes(text + b"# \xe9t\xe9\n")
    line = text.count(b"\n") + 1
    with pytest.raises(CardError) as caught:
        load_card(card)
    assert str(caught.value) == f"{card}:{line}: not UTF-8 text (byte 0xe9 at offset {len(text) + 2}); save the card as UTF-8"


def test_item2_card_only_checks_run_before_a_run_folder_exists(tmp_path: Path, capsys) -> None:
    root = tmp_path / "runs"
    card = _project(tmp_path, data={"split": {"field": None, "validation": 0.49, "test": 0.49}})
    line = next(i for i, text in enumerate(card.read_text().splitlines(), 1) if "validation: 0.49" in text)
    for command in (["run", str(card)], ["stage", "baseline", str(card)], ["check", str(card)]):
        assert main(["--runs", str(root), *command]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (f"labkit: error: {card}:{line}: data.split: validation 0.49 + test 0.49 leave 0.02 of the rows for "
                       "training (at least 0.2 needed); lower data.split.validation or data.split.test"), err
        assert not root.exists()  # no run folder, no registry entry


def test_item2_labkit_check_shows_parent_diff_and_protocol_and_writes_nothing(tmp_path: Path, capsys) -> None:
    root = tmp_path / "runs"
    assert main(["--runs", str(root), "check", str(REPO / "params" / "smoke-dpo.yaml")]) == 0
    out = capsys.readouterr().out
    assert f"parent: {REPO / 'params' / 'smoke.yaml'}" in out
    assert "train.trainer: dpo" in out and "protocol: follows" in out
    assert not root.exists()
    # a variant that changes a protocol-fixed key of an experiment with a completed run is refused, exit 2
    loaded = load_card(_project(tmp_path))
    run = R.new_run(loaded, root)
    io.write_json(run.dir / "comparison" / "verdict.json", {})
    R.record(run, "completed", status="completed")
    other = _project(tmp_path / "other", eval={"max_new_tokens": 3})
    before = _files(root)
    assert main(["--runs", str(root), "check", str(other)]) == 2
    assert "changes protocol-fixed key(s) of experiment 'bad-inputs'" in capsys.readouterr().err
    assert _files(root) == before


# ---------------------------------------------------------------------- 3. statuses
def test_item3_budget_stop_is_a_visible_status(tmp_path: Path, capsys) -> None:
    root = tmp_path / "runs"
    run = R.new_run(load_card(_project(tmp_path)), root)
    # training/outcome.json as training writes it; a summary a notebook cell could edit is not read
    io.write_json(run.dir / "training" / "outcome.json", {"steps": 3, "budget_exhausted": True})
    io.write_json(run.dir / "training" / "summary.json", {"steps": 3, "budget_exhausted": False})
    budget = budget_stop(run)  # what `labkit run` records when the run completes
    R.record(run, "completed", status="completed", **budget)
    assert main(["--runs", str(root), "runs"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if run.run_id in line][0]
    assert row.split()[1:3] == ["completed", "(budget)"] and "stopped by budget.max_minutes" in row
    (listed,) = experiment_runs(root, run.experiment)  # the report's run rows
    assert listed["status"] == "completed" and listed["reason"].startswith("completed (budget): training stopped")


def test_item3_lone_stage_statuses_and_exit_codes(tmp_path: Path) -> None:
    """The stage runner's own bookkeeping: a failed notebook → `failed` with its error, exit code of its cause."""
    from labkit.errors import StageFailed

    root = tmp_path / "runs"
    card = _project(tmp_path, _bad_test_reference(_rows()))
    nb = tmp_path / "nb"
    nb.mkdir()
    import nbformat

    notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                 "language": "python"},
                                                  "language_info": {"name": "python"}})
    notebook.cells = [nbformat.v4.new_code_cell("card = ''\nrun_dir = ''", metadata={"tags": ["parameters"]}),
                      nbformat.v4.new_code_cell("from labkit.errors import DataError\nraise DataError('data.jsonl:1: bad')")]
    for name in R.NOTEBOOKS.values():
        nbformat.write(notebook, nb / name)
    with pytest.raises(StageFailed) as caught:
        runner.stage_into(load_card(card), "baseline", None, root, nb)
    assert caught.value.exit_code == 2  # bad input found inside the stage: 2, as `labkit run` reports it
    (run_dir,) = [p for p in (root / "bad-inputs").iterdir()]
    status = io.read_json(run_dir / "status.json")
    assert status["status"] == "failed" and "DataError: data.jsonl:1: bad" in status["error"]
    assert R.mark_dead_runs(root) == []  # never mistaken for a dead process


# ---------------------------------------------------------------------- 4. registry and folders
def test_item4_corrupt_registry_line_is_reported_with_its_line_number(tmp_path: Path, capsys) -> None:
    root = tmp_path / "runs"
    run = R.new_run(load_card(_project(tmp_path)), root)
    with open(run.registry, "a") as handle:
        handle.write('{"time": "x", "run_id": \n')
    R.record(run, "failed", status="failed", error="boom")
    assert main(["--runs", str(root), "runs"]) == 0
    captured = capsys.readouterr()
    assert f"labkit: warning: {run.registry}:2: not valid JSON" in captured.err
    assert "failed" in captured.out  # the other lines still count
    assert main(["--runs", str(root), "final", run.run_id]) == 2  # final needs every opening: refuses
    assert "is failed" in capsys.readouterr().err
    with pytest.raises(Exception, match=r"registry\.jsonl:2: not valid JSON"):
        openings(root, run.experiment, strict=True)


def test_item4_failed_commands_leave_no_stray_folders(tmp_path: Path, capsys) -> None:
    root = tmp_path / "runs"
    root.mkdir()
    assert main(["--runs", str(root), "compare", "no-such-exp"]) == 2
    assert f"no runs of experiment 'no-such-exp' under {root}" in capsys.readouterr().err
    assert list(root.iterdir()) == []  # no no-such-exp/_report/


def test_item4_runs_option_naming_a_file_is_one_line(tmp_path: Path, capsys) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    card = _project(tmp_path)
    for command in (["run", str(card)], ["runs"], ["compare", "x"], ["final", "x"], ["stage", "baseline", str(card)]):
        assert main(["--runs", str(afile), *command]) == 2
        assert capsys.readouterr().err == (f"labkit: error: --runs {afile}: is a file, not a folder (name the folder "
                                           "that holds registry.jsonl, or a new one)\n")


# ---------------------------------------------------------------------- 5. hub sources
class _CountingHub(http.server.BaseHTTPRequestHandler):
    """A local endpoint that answers every request 503 and counts them (class attribute `seen`)."""

    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).seen.append(self.path)
        self.send_response(503)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_item5_unreachable_hub_fails_at_the_first_request(tmp_path: Path, monkeypatch) -> None:
    card = _project(tmp_path, model={"source": "hf:org/model@" + "a" * 40})
    env = {k: v for k, v in os.environ.items() if k not in {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"}}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", PYTHONPATH=str(REPO), LABKIT_RUNS=str(tmp_path / "runs"))
    proc = subprocess.run([sys.executable, "-m", "labkit", "check", "--data", str(card)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    model_line = next(i for i, text in enumerate(card.read_text().splitlines(), 1) if "hf:org/model@" in text)
    assert line.startswith(f"labkit: error: {card}:{model_line}: model.source: the hub (http://127.0.0.1:9) cannot be "
                           "reached for hf:org/model@aaaaaaaaaaaa… (ConnectError")
    # a hub that answers but fails: one request, no retry loop (huggingface_hub's backoff would send several)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CountingHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _CountingHub.seen = []
        env["HF_ENDPOINT"] = f"http://127.0.0.1:{server.server_address[1]}"
        proc = subprocess.run([sys.executable, "-m", "labkit", "check", "--data", str(card)], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert "cannot be reached for hf:org/model@aaaaaaaaaaaa…" in proc.stderr, proc.stderr
        assert len(_CountingHub.seen) == 1, _CountingHub.seen
        from labkit.model.sources import resolve
        _CountingHub.seen = []
        monkeypatch.setenv("HF_ENDPOINT", env["HF_ENDPOINT"])
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline: refused before any request
        with pytest.raises(Exception, match="HF_HUB_OFFLINE=1"):
            resolve("hf:org/model@" + "b" * 40)
        assert _CountingHub.seen == []
    finally:
        server.shutdown()


def test_item5_branch_names_are_refused_as_pins(tmp_path: Path, capsys) -> None:
    for model in ({"source": "hf:org/model@main"}, {"source": "hf:org/model@" + "a" * 40, "revision": "main"}):
        card = _project(tmp_path, model=model)
        assert main(["check", str(card)]) == 2
        err = capsys.readouterr().err
        assert "'main' is a branch or tag name, not a pin: use the 40-hex commit hash of that revision" in err
    card = _project(tmp_path, data={"source": {"hf": "org/data", "revision": "main", "path": None}})
    raw = yaml.safe_load(card.read_text())
    del raw["data"]["source"]["path"]
    card.write_text(yaml.safe_dump(raw))
    assert main(["check", str(card)]) == 2
    assert "data.source.revision: 'main' is a branch or tag name" in capsys.readouterr().err
