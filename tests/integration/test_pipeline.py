"""End to end through the real `labkit` command: papermill, a real kernel, the tiny model, TRL."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import yaml
from conftest import REPO, SECRETS, TOKEN_FILE_SECRET, labkit


def test_run_folder_layout(smoke_run) -> None:
    run, proc = smoke_run
    for name in ("card.yaml", "card.diff.yaml", "env.json", "status.json", "data_manifest.json", "model_source.json"):
        assert (run / name).is_file(), name
    notebooks = sorted(p.name for p in (run / "notebooks").iterdir())
    assert notebooks == ["01_baseline.ipynb", "02_preprocessing.ipynb", "03_parameter_check.ipynb",
                         "04_training.ipynb", "05_comparison.ipynb"]
    for nb in notebooks:
        book = nbformat.read(run / "notebooks" / nb, as_version=4)
        errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
        assert not errors, nb
        injected = [c for c in book.cells if "injected-parameters" in c.metadata.get("tags", [])]
        assert injected and str(run) in injected[0].source
    assert "[5/5] 05_comparison.ipynb" in proc.stdout and "completed" in proc.stdout
    assert yaml.safe_load((run / "card.yaml").read_text())["experiment"]["id"] == "smoke"


def test_the_last_line_of_labkit_run_is_the_verdict(smoke_run) -> None:
    run, proc = smoke_run
    last = proc.stdout.strip().splitlines()[-1]
    verdict = json.loads((run / "comparison" / "verdict.json").read_text())
    assert last.startswith("verdict smoke/tiny-lora: " + verdict["decision"].upper() + " · field_accuracy "), last
    assert " · guardrails " in last and "budget-stopped" not in last
    pairs = json.loads((run / "comparison" / "paired.json").read_text())
    assert f"{pairs['wins']} wins / {pairs['losses']} losses / {pairs['ties']} ties" in last


def test_no_secret_in_any_file_of_the_run(smoke_run) -> None:
    run, proc = smoke_run
    planted = [v.encode() for v in SECRETS.values()] + [TOKEN_FILE_SECRET.encode()]
    files = [p for p in run.rglob("*") if p.is_file()]
    assert len(files) > 30 and any(p.suffix == ".ipynb" for p in files) and (run / "env.json") in files
    for path in files:
        data = path.read_bytes()
        assert not any(secret in data for secret in planted), f"a planted secret leaked into {path}"
    assert not any(secret.decode() in proc.stdout + proc.stderr for secret in planted)
    env = json.loads((run / "env.json").read_text())
    assert env["pip_freeze"] and env["packages"]["torch"] and env["distributed"]["world_size"] == 1


def test_stage_data_files(smoke_run) -> None:
    run, _ = smoke_run
    manifest = json.loads((run / "data_manifest.json").read_text())
    sizes = manifest["split"]["sizes"]
    assert sizes["train"] > 0 and sizes["validation"] > 0 and sizes["test"] > 0
    assert manifest["tokenizer"]["chat_template_sha256"] and manifest["data_version"]
    base = json.loads((run / "baseline" / "baseline_metrics.json").read_text())
    assert base["n"] == sizes["validation"]
    assert {"json_valid_rate", "field_presence_rate", "field_accuracy", "accuracy", "macro_f1"} <= set(base["overall"])
    assert all("f1" in v for v in base["per_category"].values())
    preds = (run / "baseline" / "baseline_predictions.jsonl").read_text().splitlines()
    assert len(preds) == sizes["validation"]
    prompts = json.loads((run / "baseline" / "baseline_prompts.json").read_text())  # the default: the training prompt
    assert prompts["strongest"] == "training" and [p["name"] for p in prompts["prompts"]] == ["training"]
    assert (run / "baseline" / "prompts" / "training_predictions.jsonl").read_text().splitlines() == preds
    assert json.loads((run / "baseline" / "summary.json").read_text())["baseline_prompt"] == "training"
    planted = json.loads((run / "preprocessing" / "planted_check.json").read_text())
    assert planted["ok"], planted
    checks = json.loads((run / "preprocessing" / "checks.json").read_text())
    assert checks and all(c["ok"] for c in checks)
    assert (run / "preprocessing" / "samples.html").read_text().count("lk-loss") > 10
    update = json.loads((run / "parameter_check" / "update_check.json").read_text())
    assert update["ok"] and update["steps"] == 2
    lora = [t for t in update["tensors"] if "lora_" in t["name"]]
    assert lora and all(t["expected"] and t["changed"] for t in lora)
    assert not any(t["changed"] for t in update["tensors"] if not t["expected"])
    memory = json.loads((run / "parameter_check" / "memory.json").read_text())
    assert [m["seq_len"] for m in memory["measured"]] == list(memory["lengths"].values())
    assert all(m["memory"]["delta_bytes"] > 0 and m["seconds_per_step"] > 0 for m in memory["measured"])
    assert all(e["breakdown"]["activations"] > 0 and e["step_bytes"] > 0 for e in memory["estimates"])
    fit = json.loads((run / "parameter_check" / "fit.json").read_text())
    assert fit["verdict"]["fits"] and fit["plan"]["steps"] == 8
    for name in ("accumulation_check.json", "checkpointing_check.json"):
        assert json.loads((run / "parameter_check" / name).read_text())["ok"], name
    history = [json.loads(line) for line in (run / "training" / "log_history.jsonl").read_text().splitlines()]
    assert any("loss" in h for h in history) and any("eval_loss" in h for h in history)
    adapter = run / "training" / "adapter"
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    tied = json.loads((adapter / "labkit_base_model.json").read_text())
    assert tied["revision"] == json.loads((run / "model_source.json").read_text())["revision"]
    verdict = json.loads((run / "comparison" / "verdict.json").read_text())
    assert verdict["primary"]["metric"] == "field_accuracy" and isinstance(verdict["confirmed"], bool)
    assert verdict["guardrails"] and all("ok" in g for g in verdict["guardrails"])
    assert (run / "training" / "loss_curve.png").stat().st_size > 1000
    # stopping measured (a JSON card): per answer, in the metrics, as the default guardrail, in stage 05's notebook
    assert any(c["check"].startswith("every answer ends with a token generation stops on") for c in checks)
    limit = json.loads((run / "generation_length.json").read_text())["max_new_tokens"] \
        if (run / "generation_length.json").exists() else yaml.safe_load((run / "card.yaml").read_text())["eval"]["max_new_tokens"]
    for stage, name in (("baseline", "baseline"), ("comparison", "tuned")):
        rows = [json.loads(line) for line in (run / stage / f"{name}_predictions.jsonl").read_text().splitlines()]
        assert all(isinstance(r["stopped"], bool) and 0 <= r["answer_tokens"] <= limit for r in rows)
        assert all(r["answer_tokens"] == limit for r in rows if not r["stopped"])
        overall = json.loads((run / stage / f"{name}_metrics.json").read_text())["overall"]
        assert overall["stop_rate"] == sum(r["stopped"] for r in rows) / len(rows)
        assert overall["mean_answer_tokens"] == sum(r["answer_tokens"] for r in rows) / len(rows)
    (rail,) = [g for g in verdict["guardrails"] if g["metric"] == "stop_rate"]
    assert rail["guardrail"] == "stop_rate: default (≥ min(base, 0.95))" and rail["value"] == overall["stop_rate"]
    assert "Stopped before max_new_tokens" in (run / "notebooks" / "05_comparison.ipynb").read_text()


def test_registry_and_runs_table(smoke_run) -> None:
    run, _ = smoke_run
    events = [json.loads(line) for line in (run.parent.parent / "registry.jsonl").read_text().splitlines()]
    mine = [e for e in events if e["run_id"] == run.name]
    assert mine[0]["event"] == "started" and mine[-1]["event"] == "completed"
    assert [e["stage"] for e in mine if e["event"] == "stage_done"] == [
        "baseline", "preprocessing", "parameter_check", "training", "comparison"]
    table = labkit("runs", runs=run.parent.parent)
    assert table.returncode == 0 and run.name in table.stdout and "completed" in table.stdout


def test_bad_card_creates_no_run(tmp_path: Path) -> None:
    card = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    card["train"]["learning_rat"] = 0.1
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(card))
    runs = tmp_path / "runs"
    proc = labkit("run", str(path), runs=runs)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "train.learning_rat" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not runs.exists()


def test_failing_stage_is_recorded(tmp_path: Path) -> None:
    data = tmp_path / "tickets.jsonl"
    good = {"id": "a", "text": "my orbit phone is broken", "answer": '{"category": "technical", "priority": "low", "product": "Orbit Phone"}', "category": "technical"}
    data.write_text(json.dumps(good) + "\n" + '{"id": "b", "text": oops}\n')
    card = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    card["data"]["source"] = {"path": str(data)}
    path = tmp_path / "corrupt.yaml"
    path.write_text(yaml.safe_dump(card))
    runs = tmp_path / "runs"
    proc = labkit("run", str(path), runs=runs)
    assert proc.returncode == 2  # bad data found inside stage 01: still bad input (docs/deciding.md, exit codes)
    assert f"{data}:2: not valid JSON" in proc.stderr
    (run,) = list((runs / "smoke").iterdir())
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed" and "tickets.jsonl:2" in status["error"]
    book = nbformat.read(run / "notebooks" / "01_baseline.ipynb", as_version=4)
    assert any(o.output_type == "error" for c in book.cells if c.cell_type == "code" for o in c.outputs)
    assert not (run / "notebooks" / "02_preprocessing.ipynb").exists()
    events = [json.loads(line) for line in (runs / "registry.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["started", "stage_started", "stage_failed", "failed"]
    assert events[-1]["stage"] == "baseline"


def test_stage_command_refuses_to_rerun_a_stage_of_a_completed_run(smoke_run) -> None:
    """A completed run is a record: `labkit stage … --run` refuses in one line and changes no file."""
    run, _ = smoke_run
    before = {p: p.read_bytes() for p in sorted(run.parent.parent.rglob("*")) if p.is_file()}
    proc = labkit("stage", "preprocessing", str(run / "card.yaml"), "--run", str(run), runs=run.parent.parent)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "is complete" in line and "start a new run" in line
    assert {p: p.read_bytes() for p in sorted(run.parent.parent.rglob("*")) if p.is_file()} == before


def _without_times(path: Path) -> list[dict]:
    """JSON lines without wall-clock fields (runtimes, throughput), which differ between runs."""
    timing = ("runtime", "per_second", "seconds", "time")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(t in k for t in timing)} for r in rows]


def test_notebooks_run_interactively_top_to_bottom(tmp_path: Path, smoke_run) -> None:
    """As in JupyterLab: the committed notebooks, run in order from notebooks/, run_dir left empty."""
    from nbclient import NotebookClient

    runs = tmp_path / "runs"
    env_before = dict(os.environ)
    os.environ["LABKIT_RUNS"] = str(runs)
    try:
        for name in ("01_baseline", "02_preprocessing", "03_parameter_check", "04_training", "05_comparison"):
            book = nbformat.read(REPO / "notebooks" / f"{name}.ipynb", as_version=4)
            params = next(c for c in book.cells if "parameters" in c.metadata.get("tags", []))
            assert 'card = "../params/quickstart.yaml"' in params.source and 'run_dir = ""' in params.source
            params.source = params.source.replace("../params/quickstart.yaml", "../params/smoke.yaml")
            NotebookClient(book, timeout=600, kernel_name="python3",
                           resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    (run,) = list((runs / "smoke").glob("tiny-lora-*"))
    status = json.loads((run / "status.json").read_text())
    assert status["mode"] == "interactive" and status["status"] == "completed"
    # the same card and seed twice on the CPU: identical loss curve and identical predictions
    batch_run, _ = smoke_run
    for name in ("training/log_history.jsonl", "baseline/baseline_predictions.jsonl"):
        assert _without_times(run / name) == _without_times(batch_run / name), name
    assert _without_times(run / "comparison" / "tuned_predictions.jsonl") == _without_times(
        batch_run / "comparison" / "tuned_predictions.jsonl")
    assert set(status["stages"]) == {"baseline", "preprocessing", "parameter_check", "training", "comparison"}
    assert (run / "comparison" / "verdict.json").is_file()
