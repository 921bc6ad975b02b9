"""Under `labkit run`: progress streamed to the terminal, every run mirrored into a real MLflow store, TensorBoard
event files in the run folder, `labkit runs --follow`; the archived notebooks hold no progress bars."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from tests.conftest import REPO, labkit


WANDB_KEY = "labkit-planted-wandb-key-42"
CHROMIUM = Path("/usr/bin/chromium")  # Debian's, driven by Playwright (as tests/integration/test_report_browser.py)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def _stream(args: list[str], runs: Path, timeout: int = 900) -> tuple[int, list[tuple[float, str]]]:
    """Run labkit, reading its stdout line by line as it comes (time of arrival, line)."""
    env = {**os.environ, "LABKIT_RUNS": str(runs), "LABKIT_PROGRESS_SECONDS": "0", "LABKIT_REPORT": "1",
           "WANDB_MODE": "offline", "WANDB_DIR": str(runs.parent / "wandb_files"), "WANDB_API_KEY": WANDB_KEY}
    proc = subprocess.Popen([sys.executable, "-m", "labkit", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines, start = [], time.monotonic()
    for line in proc.stdout:
        lines.append((time.monotonic() - start, line.rstrip("\n")))
        assert time.monotonic() - start < timeout, "labkit run took too long"
    return proc.wait(), lines


def test_two_variants_streamed_tracked_and_followed(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    (tmp_path / "tracked.yaml").write_text(
        f"parent: {REPO / 'params' / 'smoke.yaml'}\nexperiment: {{variant: tracked}}\n"
        "tracking: {mlflow: {uri: 'sqlite:///mlflow.db'}, tensorboard: true, wandb: true}\n")
    (tmp_path / "truncated.yaml").write_text(  # valid card, but every example is truncated: stage 01 fails
        "parent: tracked.yaml\nexperiment: {variant: truncated}\n"
        "data: {max_length: 40, cleaning: [normalise_whitespace, drop_empty]}\n")
    code, lines = _stream(["run", str(tmp_path / "truncated.yaml"), str(tmp_path / "tracked.yaml")], runs)
    text = "\n".join(line for _, line in lines)
    assert code == 1, text  # the truncated variant failed; the tracked one completed
    assert "completed in" in text and "warning: the MLflow mirror" not in text

    # progress lines arrived while stage 04 ran, before its "done" line
    started = next(i for i, (_, l) in enumerate(lines) if "04_training.ipynb" in l and l.endswith("…"))
    done = next(i for i, (_, l) in enumerate(lines) if "04_training.ipynb" in l and "done in" in l)
    steps = [l for _, l in lines[started:done] if re.search(r"training: step \d+/8 · loss [\d.]+", l)]
    assert steps and steps[-1].strip().startswith("training: step 8/8"), text
    assert any("ETA" in l for l in steps)
    assert any(re.search(r"tuned: generating \d+/\d+ examples", l) for _, l in lines[done:]), text

    (tracked,) = (runs / "smoke").glob("tracked-*")
    (truncated,) = (runs / "smoke").glob("truncated-*")
    for name in ("04_training.ipynb", "05_comparison.ipynb"):  # archived notebooks: no progress bars
        book = nbformat.read(tracked / "notebooks" / name, as_version=4)
        printed = "".join(o.get("text", "") for c in book.cells if c.cell_type == "code" for o in c.outputs)
        assert "it/s]" not in printed and "%|" not in printed and "\r" not in printed, name

    # MLflow lists both runs, the failed one too, with parameters, metrics, status and artifacts
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("smoke")
    found = {r.data.tags["labkit.run_id"]: r for r in client.search_runs([experiment.experiment_id])}
    assert set(found) == {tracked.name, truncated.name}
    ok, failed = found[tracked.name], found[truncated.name]
    assert (ok.info.status, ok.data.tags["labkit.status"]) == ("FINISHED", "completed")
    assert (failed.info.status, failed.data.tags["labkit.status"]) == ("FAILED", "failed")
    assert "PreprocessingCheckFailed" in failed.data.tags["labkit.error"]
    for run in (ok, failed):
        assert run.data.params["train.lr"] == "0.005" and run.data.params["method.r"] == "4"
    assert failed.data.params["data.max_length"] == "40" and ok.data.params["data.max_length"] == "400"
    assert ok.data.params["data_version"] == ok.data.tags["labkit.data_version"]
    assert "learning_rate" not in ok.data.params  # the card is the parameters, not TrainingArguments
    for metric in ("baseline/field_accuracy", "comparison/field_accuracy", "parameter_check/plan.seconds_per_step",
                   "training/steps", "verdict/confirmed"):
        assert metric in ok.data.metrics, metric
    assert ok.data.metrics["training/steps"] == 8
    assert len(client.get_metric_history(ok.info.run_id, "loss")) == 8  # the trainer's own MLflow callback, per step
    notebooks = {a.path for a in client.list_artifacts(ok.info.run_id, "notebooks")}
    assert "notebooks/05_comparison.ipynb" in notebooks
    assert {a.path for a in client.list_artifacts(failed.info.run_id, "notebooks")} == {"notebooks/01_baseline.ipynb"}
    report = {a.path for a in client.list_artifacts(ok.info.run_id, "report")}
    assert {"report/index.html", "report/loss_curves.png", "report/runs"} <= report, report
    _wandb_offline(runs.parent / "wandb_files", tracked, truncated)
    _curated(client, experiment, ok, tmp_path)
    assert list((runs / "mlartifacts").rglob("05_comparison.ipynb"))  # beside the store, not in the working folder

    # TensorBoard: the event file in the run folder, read back with TensorBoard's own reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (tracked / "training" / "tensorboard").glob("events.out.tfevents.*")
    reader = EventAccumulator(str(events.parent))
    reader.Reload()
    losses = reader.Scalars("train/loss")
    assert [e.step for e in losses] == list(range(1, 9)) and all(e.value > 0 for e in losses)

    # `labkit runs --follow` on a finished run prints its stages and last updates, then exits
    follow = labkit("runs", "--follow", tracked.name, runs=runs, timeout=120)
    assert follow.returncode == 0, follow.stdout + follow.stderr
    assert "training: step 8/8" in follow.stdout and "04_training.ipynb" in follow.stdout
    assert follow.stdout.strip().splitlines()[-1].startswith("completed")
    follow = labkit("runs", "--follow", truncated.name, runs=runs, timeout=120)
    assert follow.returncode == 1 and "failed" in follow.stdout.strip().splitlines()[-1]

    # a person's blind A/B ratings of the completed run: the experiment's report shows the human verdict
    from labkit.experiment.report import build_report
    from labkit.show.widgets import ABRating

    rating = ABRating(tracked, rater="test", per_category=1)
    for _ in rating.session["items"]:
        rating.rate("tie")
    n = len(rating.session["items"])
    page = build_report(runs, "smoke", resamples=200).read_text(encoding="utf-8")
    assert "Human verdict" in page and f"tie {n} of {n} rated" in page


def _curated(client, experiment, ok, tmp_path: Path) -> None:
    """The MLflow run is curated: classic-training experiment, few metrics, a description, a report page whose
    images load in headless Chromium the way MLflow's artifact viewer shows it (a blob URL in a sandboxed iframe)."""
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    metrics = ok.data.metrics
    assert len(metrics) <= 40, sorted(metrics)
    assert not [m for m in metrics if "rouge" in m or "length_ratio" in m or "use_stemmer" in m]
    assert "train_runtime" in metrics and not [m for m in metrics if m.startswith("training/metrics")]
    note = ok.data.tags["mlflow.note.content"]
    assert "**Hypothesis:**" in note and "field accuracy" in note and "against the baseline" in note
    assert {a.path for a in client.list_artifacts(ok.info.run_id, "tables")} >= {"tables/per_category.json"}
    page = Path(client.download_artifacts(ok.info.run_id, "report.html", str(tmp_path / "dl")))
    if not CHROMIUM.exists():  # the rest of the test goes on: tests/integration/test_report_browser.py skips
        return
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=str(CHROMIUM),
                                                       args=ARGS, headless=True)
        view = browser.new_page()
        view.goto("about:blank")
        view.evaluate("""html => new Promise(done => {
            const frame = document.createElement('iframe');
            frame.sandbox = 'allow-scripts'; frame.style.width = '1200px'; frame.style.height = '900px';
            frame.onload = () => done();
            frame.src = URL.createObjectURL(new Blob([html], {type: 'text/html'}));
            document.body.appendChild(frame); })""", page.read_text(encoding="utf-8"))
        (frame,) = [f for f in view.frames if f != view.main_frame]
        frame.wait_for_load_state("load")
        drawn = frame.eval_on_selector_all("img", "els => els.map(e => e.complete && e.naturalWidth > 0)")
        browser.close()
    assert drawn and all(drawn), drawn


def _wandb_offline(folder: Path, tracked: Path, truncated: Path) -> None:
    """W&B's offline files: the trainer's loss of every step, the curated summary, and no API key anywhere."""
    from tests.wandb_log import history, summary

    logs = sorted(folder.glob(f"wandb/offline-run-*-{tracked.name}/run-{tracked.name}.wandb"))
    assert len(logs) == 2, list(folder.rglob("*.wandb"))  # the trainer's session, then the final update
    losses = [v for log in logs for v in history(log, "train/loss")]
    assert len(losses) == 8 and all(v > 0 for v in losses)
    values = summary(logs)
    assert values["labkit.status"] == "completed" and "comparison/field_accuracy" in values
    assert list(folder.glob(f"wandb/offline-run-*-{truncated.name}"))  # the failed run is reported too
    for path in [*folder.rglob("*"), *tracked.rglob("*")]:
        if path.is_file():
            assert WANDB_KEY.encode() not in path.read_bytes(), path
