"""`labkit final RUN_ID`: open an experiment's locked test split, once and on the record, for the final decision.

The test rows are never written by `prepare`: the run keeps only their count and sha256
(data_manifest.json, split.sha256.test). `open_test_split` re-derives them from the card's source with
the same pipeline and checks that hash; it is the only function in labkit that yields test rows.
`final` re-validates the test rows (references and hash; nothing of them is shown or kept) and records the
opening in the registry before any test row is used, then evaluates the base
model and the run's tuned model on the test rows with the validation procedure, and writes
`<run>/final/`. A second opening of the same experiment (by any of its runs) is refused unless it is
asked for with `--reopen --why "..."`, and is then recorded with its reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import os
import shutil
import socket
from pathlib import Path
from typing import Any, Iterator

from labkit.card.load import load_card
from labkit.core import io
from labkit.core import runs as R
from labkit.core.kernel import quiet_unactionable
from labkit.core.protocol import pin_card, pinned
from labkit.data.prepare import derive_splits
from labkit.data.reading import file_sha256
from labkit.data.sources import split_sha256
from labkit.errors import (
    DataError,
    MissingInput,
    RunStateError,
    SplitLocked,
    UsageError,
)
from labkit.evaluate.baseline_prompts import measure_strongest
from labkit.evaluate.procedure import evaluate_rows
from labkit.evaluate.verdict import verdict
from labkit.experiment.openings import openings
from labkit.model.loading import baseline_quantize
from labkit.model.tuned import load_tuned
from labkit.stages.context import Stage
from labkit.stages.records import ADAPTER, BASELINE_PROMPTS, baseline_named, strongest_baseline
from labkit.stages.run_metrics import run_metrics

FILES = ("baseline_predictions.jsonl", "tuned_predictions.jsonl", "baseline_metrics.json", "tuned_metrics.json",
         "verdict.json", "opening.json")


def _who() -> str:
    """user@host of whoever opens the split (no other identity is recorded)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _manifest(run: R.Run) -> dict[str, Any]:
    path = run.dir / "data_manifest.json"
    if not path.exists():
        raise MissingInput(f"{path} is missing: the run's data was never prepared (it has no test split to open)")
    return io.read_json(path)


def check_test_split(run: R.Run, tokenizer: Any, card: Any) -> dict[str, int]:
    """Re-validate the test split before its opening is recorded: every reference against the card's
    target_format, and the rows against the manifest's sha256. Nothing of the rows leaves this function.

    Returns:
        rows checked per split (counts only).
    Raises:
        DataError: a bad reference (file, line, row id, fix) or changed data; the opening is not spent.
    """
    rows = open_test_split(run, tokenizer, card, _checked=True)
    return {"test": len(rows)}


def open_test_split(run: R.Run, tokenizer: Any, card: Any = None, _checked: bool = False) -> list[dict[str, Any]]:
    """Re-derive a run's test rows from its card's source and check them against the run's manifest.

    The only function in labkit that yields test rows; `labkit final` calls it after recording the opening.

    Args:
        run: the run (its data_manifest.json holds split.sha256.test).
        tokenizer: the base model's tokenizer (token-length cleaning rules, as in `prepare`).
        card: the card to derive from (default: the run's archived card.yaml).
    Returns:
        the test rows ({"id", "input", "target", "category"}, sorted by id).
    Raises:
        DataError: the re-derived rows differ from the ones the run was prepared with.
    """
    manifest = _manifest(run)
    expected = manifest.get("split", {}).get("sha256", {}).get("test")
    if not expected:
        raise DataError(f"{run.dir / 'data_manifest.json'}: no split.sha256.test (prepared by an older labkit?); "
                        "the test rows cannot be checked: start a new run")
    if card is None:  # the archived card, with the hub commits the run recorded (revision: resolve)
        archived = load_card(run.card_path).card
        card = pinned(archived, pin_card(archived, run.root, run.experiment, run.dir))
    note = " (the test split was not opened: nothing is recorded)" if _checked else ""
    try:
        rows = derive_splits(card, tokenizer).splits["test"]
    except DataError as exc:
        raise DataError(f"{exc}{note}") from None
    got = split_sha256(rows)
    if got != expected:
        recorded = manifest["split"].get("sizes", {}).get("test", "?")
        raise DataError(f"{run.dir / 'data_manifest.json'}: split.sha256.test is {expected[:12]}… ({recorded} rows) but the "
                        f"card's source now gives {got[:12]}… ({len(rows)} rows): the data changed since the run; restore "
                        f"the data it used (see the manifest's source) or start a new run on the current data{note}")
    return rows


@contextlib.contextmanager
def _experiment_lock(run: R.Run) -> Iterator[None]:
    """Serialise the check-then-record of openings across processes (two `final`s at once open it once)."""
    path = run.root / run.experiment / "_test_split.lock"  # "_": not a run (like _baseline/)
    with open(path, "a", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _check_run(run: R.Run, loaded: Any) -> dict[str, Any]:
    """Refuse, before anything is recorded, a run that cannot give a meaningful test measurement.

    Returns:
        the run's data manifest.
    """
    state = run.status()
    status = state.get("status")
    if status != "completed":
        hint = {"failed": "finish it first with `labkit run --resume RUN_ID`",
                "interrupted": "finish it first with `labkit run --resume RUN_ID`",
                "invalid": f"it was invalidated ({state.get('invalid_reason')})",
                "running": "wait until it completes"}.get(status, "see `labkit runs`")
        raise RunStateError(f"{run.experiment}/{run.run_id} is {status}: only a completed run may open the test split ({hint})")
    undone = [s for s in R.STAGES if state.get("stages", {}).get(s, {}).get("status") != "done"]
    if undone:
        raise RunStateError(f"{run.experiment}/{run.run_id} has not run stage {undone[0]}: only a run with every stage "
                            "done may open the test split (finish it with `labkit run --resume RUN_ID`)")
    manifest = _manifest(run)
    if state.get("card_hash") != loaded.hash:
        raise RunStateError(f"{run.card_path} was changed since the run (hash {loaded.hash} ≠ {state.get('card_hash')} in "
                         "status.json): restore the archived card, or run the changed card as a new run")
    if not manifest.get("split", {}).get("sizes", {}).get("test"):
        raise RunStateError(f"{run.dir / 'data_manifest.json'}: the run has no test rows (data.split.test is 0): nothing to open")
    adapter = run.dir / "training" / "adapter"
    if not adapter.exists():
        raise MissingInput(f"{adapter} is missing: the run has no trained model to evaluate")
    source = manifest.get("source", {})
    if source.get("kind") == "file":  # a cheap check before anything is recorded or read
        path = Path(source.get("path", ""))
        if not path.is_file():
            raise DataError(f"{path}: the run's data file is gone (data_manifest.json source.path): restore it")
        sha = file_sha256(path)
        if sha != source.get("sha256"):
            raise DataError(f"{path}: the data file changed since the run (sha256 {sha[:12]}… ≠ "
                            f"{str(source.get('sha256'))[:12]}… in data_manifest.json): restore it or start a new run")
    return manifest


def _refuse_second_opening(run: R.Run, previous: list[dict[str, Any]], reopen: bool) -> None:
    if previous and not reopen:
        first = previous[0]
        raise SplitLocked(
            f"the test split of experiment {run.experiment!r} was already opened {len(previous)} time(s) (first by run "
            f"{first['run_id']}, {first['who']}, {first['when']}); it opens once. To open it again: labkit final "
            f"{run.run_id} --reopen --why \"the reason\" (the reopening is recorded with the reason)")


def _archive_previous(folder: Path) -> None:
    """Move an earlier opening's files of this run into final/opening-<n>/ (nothing written is lost)."""
    if not (folder / "opening.json").exists():
        return
    number = io.read_json(folder / "opening.json").get("opening", "previous")
    target = folder / f"opening-{number}"
    target.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        if path.is_file() and not path.name.startswith("."):
            shutil.move(str(path), target / path.name)


def _table(card: Any, base: dict[str, Any], tuned: dict[str, Any], validation: dict[str, dict[str, Any]]) -> str:
    """Overall metrics, test next to validation: the primary metric first, then the guardrails', then the rest."""
    header = ["metric", "baseline (test)", "tuned (test)", "gain", *[f"{k} (validation)" for k in validation]]
    first = [card.experiment.target.primary_metric, *[g.metric for g in card.experiment.guardrails]]
    names = sorted(tuned["overall"], key=lambda n: (first.index(n) if n in first else len(first), n))
    lines = []
    for name in names:
        b, t = base["overall"].get(name), tuned["overall"][name]
        lines.append([name, f"{b:.3f}" if b is not None else "", f"{t:.3f}", f"{t - b:+.3f}" if b is not None else "",
                      *[f"{v['overall'][name]:.3f}" if name in v.get("overall", {}) else "" for v in validation.values()]])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip()
                     for line in [header, ["-" * w for w in widths], *lines])


def final(run_id_or_dir: str | Path, root: Path, reopen: bool = False, why: str | None = None) -> dict[str, Any]:
    """Open the experiment's test split for a completed run and measure base and tuned models on it.

    The opening is recorded in the registry (event test_opened) before the test data is read; the
    result is recorded afterwards (test_evaluated, or test_open_failed if something broke).

    Args:
        run_id_or_dir: the run id (or its folder).
        root: the runs root.
        reopen: open the split again although the experiment's test split was already opened.
        why: the reason for reopening (required with reopen; kept in the registry and opening.json).
    Returns:
        {"dir": <run>/final, "opening": opening.json's data, "baseline": metrics, "tuned": metrics, "verdict": verdict}.
    Raises:
        ValueError: the run is not completed, its card changed, --reopen without --why.
        PermissionError: the test split was already opened and reopen is False.
        DataError: the data changed since the run (re-derived rows do not match the manifest's sha256).
    """
    quiet_unactionable()
    run = R.find_run(str(run_id_or_dir), Path(root))
    why = (why or "").strip() or None
    if reopen and not why:
        raise UsageError("--reopen needs --why \"the reason\" (it is recorded with the reopening)")
    loaded = load_card(run.card_path)
    manifest = _check_run(run, loaded)
    who = _who()
    with _experiment_lock(run):
        previous = openings(run.root, run.experiment, strict=True)
        _refuse_second_opening(run, previous, reopen)
        stage = Stage("final", loaded, run, interactive=False)  # the stages' own model and tokenizer loading
        try:
            revision, used = stage.model_source.revision, manifest["tokenizer"]["model_revision"]
            if revision != used:
                raise RunStateError(f"{loaded.card.model.source}: resolves to revision {revision[:16]}… but the run "
                                    f"used {used[:16]}… (data_manifest.json tokenizer.model_revision): the base model "
                                    "changed since the run; restore it or start a new run")
            check_test_split(run, stage.tokenizer, loaded.card)  # a bad reference never spends the opening
        except BaseException:
            with contextlib.suppress(OSError):
                stage.out.rmdir()  # only if empty: nothing of an earlier opening is touched
            raise
        number = len(previous) + 1
        opened = R.record(run, "test_opened", who=who, reopen=bool(previous), why=why, opening=number,
                          test_rows=manifest["split"]["sizes"]["test"])
    print(f"labkit final · {run.experiment}/{run.run_id} · test split opening {number} recorded "
          f"({who}{', reopened: ' + why if why else ''})")
    try:
        rows = open_test_split(run, stage.tokenizer, loaded.card)
        base_model = stage.load_model(quantize=baseline_quantize(stage.card))  # as the baseline stage measures it
        recorded = run.dir / "baseline" / BASELINE_PROMPTS  # under stage 01's strongest prompt, its shots included
        base_rows, base_metrics = measure_strongest(base_model, stage.tokenizer, stage.card, rows,
                                                    io.read_json(recorded) if recorded.exists() else None, "baseline")
        del base_model
        tuned_model = load_tuned(stage.model_source, stage.card, run.dir / "training" / ADAPTER,
                                 stage.device)  # as the comparison stage measures it
        tuned_rows, tuned_metrics = evaluate_rows(tuned_model, stage.tokenizer, stage.card, rows, "tuned")
        del tuned_model
    except BaseException as exc:
        R.record(run, "test_open_failed", opening=number, problem=f"{type(exc).__name__}: {exc}"[:500])
        if isinstance(exc, DataError):
            raise DataError(f"{exc} (this attempt is recorded as opening {number}: once fixed, open it with --reopen "
                            "--why \"...\")") from None
        raise
    tuned_metrics["run"] = run_metrics(run.dir, loaded.card.budget.price_per_gpu_hour)  # as stage 05 has them
    decision = baseline_named(verdict(loaded.card, base_metrics, tuned_metrics, reference_rows=base_rows,
                                      tuned_rows=tuned_rows), strongest_baseline(run.dir))
    opening = {"experiment": run.experiment, "run_id": run.run_id, "who": who, "when": opened["time"],
               "reopen": opened["reopen"], "why": why, "opening": number, "test_rows": len(rows),
               "test_sha256": manifest["split"]["sha256"]["test"], "data_version": manifest["data_version"],
               "previous": previous}
    folder = stage.out  # <run>/final
    _archive_previous(folder)
    stage.save_jsonl("baseline_predictions.jsonl", base_rows)
    stage.save_jsonl("tuned_predictions.jsonl", tuned_rows)
    stage.save_json("baseline_metrics.json", base_metrics)
    stage.save_json("tuned_metrics.json", tuned_metrics)
    stage.save_json("verdict.json", decision)
    stage.save_json("opening.json", opening)
    primary = decision["primary"]
    R.record(run, "test_evaluated", opening=number, n=len(rows), confirmed=decision["confirmed"],
             verdict=decision["verdict"], primary={"metric": primary["metric"], "baseline": _round(primary.get("baseline")),
                                                   "tuned": _round(primary.get("tuned"))})
    validation = {}
    for label, path in (("baseline", run.dir / "baseline" / "baseline_metrics.json"),
                        ("tuned", run.dir / "comparison" / "tuned_metrics.json")):
        if path.exists():
            validation[label] = io.read_json(path)
    print(_table(loaded.card, base_metrics, tuned_metrics, validation))
    print(f"test split ({len(rows)} rows): {decision['verdict']}")
    print(f"→ {folder}")
    return {"dir": folder, "opening": opening, "baseline": base_metrics, "tuned": tuned_metrics, "verdict": decision}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
