"""The notebooks' entry point: open a stage of a run, give it the card, data, model and a place to write.

`open_stage("baseline", card, run_dir)` works the same under papermill (run_dir given by `labkit run`)
and interactively: run_dir "" → the newest unfinished interactive run of this card, or a new one — except stage 05
(`REQUIRES`), which opens the card's newest completed run for review when the interactive run has no trained adapter;
run_dir "latest" → the card's newest completed run with this stage done, opened for review (`Stage.review`: read-only,
the notebook's files go to a scratch folder, the run is not changed: a completed run is a record).
"""

from __future__ import annotations

import os
import tempfile
import time
from functools import cached_property
from pathlib import Path
from typing import Any

import datasets.utils.logging  # noqa: F401  (adds its stderr handler on import: `capture_library_logs` removes it)
import transformers.utils.logging
from transformers import AutoConfig

from labkit.card.load import LoadedCard, load_card
from labkit.card.schema import Card
from labkit.core import io
from labkit.core import runs as R
from labkit.core.device import on_cuda
from labkit.core.environment import capture
from labkit.core.heartbeat import start_heartbeat
from labkit.core.kernel import log_libraries_to, plain_bars, quiet_unactionable
from labkit.core.listing import LATEST, latest_completed, openable_text, stages_done
from labkit.core.protocol import pin_card, read_pins
from labkit.core.run_card import complete, resolved_card
from labkit.data.prepare import load_split, prepare
from labkit.errors import MissingInput, UsageError
from labkit.evaluate import length
from labkit.evaluate.base_answers import base_model_answers
from labkit.model.loading import load_model, load_tokenizer, pick_device
from labkit.model.sources import ResolvedModel, resolve
from labkit.core.allocator import release_promptly

# with run_dir "", a stage continues the card's interactive run only when that run has done these stages; else it opens
# the card's newest completed run for review (stage 05 without a trained adapter), or names the runs it could open
REQUIRES = {"comparison": ("training",)}


class Stage:
    """One stage of one run, as seen from its notebook.

    Attributes:
        name: stage name (baseline, preprocessing, parameter_check, training, comparison).
        loaded: the validated card and its provenance.
        card: the run's resolved card (labkit.core.run_card): hub commits and the generation length put in, frozen.
        run: the run folder.
        out: this stage's data folder.
        device: cuda, mps or cpu.
        review: None, or the scratch folder of a completed run opened for review: what the notebook writes goes
            there (`out` is its stage folder), `read` reads the run's archived files, `done` records nothing.
    """

    def __init__(self, name: str, loaded: LoadedCard, run: R.Run, interactive: bool,
                 review: Path | None = None) -> None:
        self.name = name
        self.loaded = loaded
        self.run = run
        self.review = review
        self.out = run.stage_dir(name) if review is None else review / name
        self.out.mkdir(parents=True, exist_ok=True)
        self.interactive = interactive
        self.device = pick_device()
        self._start = time.monotonic()
        record_in = None if review is not None and read_pins(run.dir) is None else run.dir  # a review records nothing
        self.pins = pin_card(loaded.card, run.root, run.experiment, record_in)  # hub commits: recorded once (pins.json)
        self._card: Card | None = None

    @property
    def card(self) -> Card:
        """The run's card, resolved once (labkit.core.run_card.resolved_card): the loaded card with the hub commits
        and the generation length the run recorded. Until stage 01 sizes the generation length (a card that leaves
        `eval.max_new_tokens` out), `eval.max_new_tokens` is None; the first read after it is recorded resolves it."""
        if self._card is None or not complete(self._card):
            self._card = resolved_card(self.loaded.card, self.run.dir)
        return self._card

    def __repr__(self) -> str:
        review = f", review={str(self.review)!r}" if self.review else ""
        return f"Stage({self.name!r}, run={str(self.run.dir)!r}, device={self.device!r}{review})"

    # ------------------------------------------------------------------ model and data
    @cached_property
    def model_source(self) -> ResolvedModel:
        """The resolved base model (fetched and converted once, then cached)."""
        resolved = resolve(self.card.model.source, self.card.model.revision, base=self.loaded.path.parent)
        path = self.run.dir / "model_source.json"
        if not path.exists() and self.review is None:
            io.write_json(path, {"source": resolved.source, "kind": resolved.kind, "location": resolved.location,
                                "revision": resolved.revision, "details": resolved.details})
        return resolved

    @cached_property
    def tokenizer(self) -> Any:
        """The base model's tokenizer."""
        return load_tokenizer(self.model_source, self.card)

    @cached_property
    def model_config(self) -> Any:
        """The base model's transformers config (read from its folder; no weights are loaded)."""
        return AutoConfig.from_pretrained(self.model_source.location, trust_remote_code=self.card.model.trust_remote_code,
                                          **self.model_source.from_pretrained_kwargs())

    def load_model(self, quantize: bool = True) -> Any:
        """Load the base model on this stage's device (4-bit for qlora unless quantize=False)."""
        return load_model(self.model_source, self.card, self.device, quantize=quantize)

    def prepare_data(self) -> dict[str, Any]:
        """Prepare the run's splits once (see labkit.data.prepare) and return the data manifest; size the generation
        length from them when the card leaves `eval.max_new_tokens` out (labkit.evaluate.length)."""
        answers = None
        if self.card.data.rejected is not None:  # the base model's own answers as the rejected ones (cached)
            answers = base_model_answers(self.card, self.tokenizer, self.model_source.revision,
                                         self.load_model)
        manifest = prepare(self.card, self.run, self.tokenizer, self.model_source.revision, answers)
        if self.card.eval.max_new_tokens is None:  # recorded in the run: `card` reads it from now on
            length.record(self.run.dir, self.tokenizer, load_split(self.run, "train"), load_split(self.run, "validation"))
        return manifest

    def split(self, name: str) -> list[dict[str, Any]]:
        """Rows of a prepared split ("train" or "validation"; the test split is locked)."""
        self.prepare_data()
        return load_split(self.run, name)

    # ------------------------------------------------------------------ results as data
    def path(self, name: str) -> Path:
        """A file in this stage's folder."""
        return self.out / name

    def save_json(self, name: str, data: Any) -> Path:
        """Write JSON into this stage's folder (atomically) and return its path."""
        io.write_json(self.path(name), data)
        return self.path(name)

    def save_jsonl(self, name: str, rows: list[dict[str, Any]]) -> Path:
        """Write JSON lines into this stage's folder (atomically)."""
        io.write_jsonl(self.path(name), rows)
        return self.path(name)

    def save_text(self, name: str, text: str) -> Path:
        """Write a text file (an HTML page) into this stage's folder (atomically) and return its path."""
        io.write_atomic(self.path(name), text)
        return self.path(name)

    def read(self, stage: str, name: str) -> Any:
        """Read a data file a stage of this run wrote (JSON or JSONL), with a clear error when it is missing: the runs
        of this card the notebook could open instead, and how to set run_dir. Under review, this stage's own files
        are read from the scratch folder once the notebook has written them there."""
        path = self.run.dir / stage / name
        if self.review is not None and stage == self.name and (self.out / name).exists():
            path = self.out / name
        if not path.exists():
            why = f"{path} is missing: run the {stage} stage of run {self.run.run_id} first"
            if os.environ.get("LABKIT_BATCH") == "1":  # under `labkit run` the run is given: no run_dir to choose
                raise MissingInput(why)
            raise MissingInput(openable_text(self.loaded, self.run.root, self.name, f"{why}, or open another run"))
        if name.endswith(".jsonl"):
            return io.read_jsonl(path)
        return io.read_json(path)

    def done(self, **summary: Any) -> dict[str, Any]:
        """Record the stage as done (status.json and registry) with a short summary.

        Returns:
            the summary written to <stage>/summary.json.
        """
        summary = {"stage": self.name, "seconds": round(time.monotonic() - self._start, 1), **summary}
        self.save_json("summary.json", summary)
        if self.review is not None:  # a completed run is a record: nothing is recorded for a review
            return summary
        extra = {k: summary[k] for k in ("data_version",) if k in summary}  # the run records its data version
        R.record(self.run, "stage_done", stage=self.name, seconds=summary["seconds"], **extra)
        if self.interactive and self.name == R.STAGES[-1]:
            R.record(self.run, "completed", status="completed")
        return summary


def _quiet_batch() -> None:
    """Plain-text progress bars under `labkit run` (widgets do not survive in archived notebooks), written to stdout
    (stderr renders as an error-coloured block in an archived notebook; `labkit.core.kernel.plain_bars`), and no
    library-internal deprecation noise a user cannot act on."""
    quiet_unactionable()
    if os.environ.get("LABKIT_BATCH") == "1":
        plain_bars()


def capture_library_logs(run_dir: Path, stage: str) -> Path:
    """Send the libraries' log records and Python warnings to the run's `logs/libraries.log` instead of stderr, where
    an archived notebook shows them as error-coloured blocks (`labkit.core.kernel.log_libraries_to`); print one line
    saying where they are.

    Args:
        run_dir: the run folder.
        stage: the stage name (on every line of the log).
    Returns:
        the log file.
    """
    transformers.utils.logging.get_logger()  # its stderr handler is added on first use: now, so it can be removed
    path = log_libraries_to(run_dir, stage)
    print(f"library messages (transformers, datasets, bitsandbytes, warnings) are logged to {path}")
    return path


def _default_run(name: str, loaded: LoadedCard, root: Path) -> tuple[R.Run | None, bool]:
    """run_dir "": the card's unfinished interactive run (None: start one) and False; or, for a stage whose
    `REQUIRES` that run has not done, the card's newest completed run and True (review)."""
    run = R.find_interactive_run(loaded, root)
    needs = REQUIRES.get(name, ())
    if not needs or (run is not None and set(needs) <= set(stages_done(run.status()))):
        return run, False
    latest = latest_completed(loaded, root, name)
    if latest is None:
        where = f"interactive run {run.run_id} has not done" if run else "no interactive run of this card has done"
        raise MissingInput(openable_text(loaded, root, name, f"stage {name} needs stage {', '.join(needs)} done: "
                                         f"{where} it, and no completed run of this card has stage {name} done"))
    print(f"labkit · run_dir \"\": {'interactive run ' + run.run_id if run else 'no interactive run'} has no "
          f"stage {', '.join(needs)} done: opening the card's newest completed run {latest.run_id} for review")
    return latest, True


def open_stage(name: str, card: str, run_dir: str = "") -> Stage:
    """Open a stage for a notebook.

    Args:
        name: the stage.
        card: path of the card (the run's archived card.yaml under `labkit run`).
        run_dir: the run folder (`labkit run` passes it); "" when the notebook is run by hand: the card's unfinished
            interactive run, or a new one (stage 05 without a trained adapter there: the card's newest completed run,
            for review); "latest": the card's newest completed run with this stage done, opened for review. A
            completed run's folder given by hand also opens for review when this stage is done in it.
    Returns:
        the Stage (`Stage.review` set when a completed run is opened for review: nothing in it is changed).
    Raises:
        MissingInput: no run to open, with the runs of this card the notebook could open and how to set run_dir.
    """
    if name not in R.STAGES:
        raise UsageError(f"unknown stage {name!r} (expected one of {', '.join(R.STAGES)})")
    _quiet_batch()
    if name == "parameter_check" and not on_cuda(pick_device()):
        release_promptly()  # before any model is loaded, so the memory measurements read live tensors (the CPU's)
    loaded = load_card(card)
    interactive, review = not run_dir or run_dir == LATEST, False
    root = R.runs_root(loaded.path.parent)
    if run_dir == LATEST:
        run = latest_completed(loaded, root, name)
        if run is None:
            raise MissingInput(openable_text(loaded, root, name, f"run_dir \"{LATEST}\": no completed run of this "
                                             f"card (hash {loaded.hash}) has stage {name} done"))
        review = True
    elif run_dir:
        run = R.Run(Path(run_dir).resolve())
        if not run.status_path.exists():
            raise MissingInput(f"{run_dir} is not a run folder (no status.json); leave run_dir empty to start one, or "
                               f"set it to \"{LATEST}\" for this card's newest completed run")
        R.check_archived_card(run, loaded)  # the card every stage of the run is run under
        status = run.status()
        # by hand, a completed run's done stage opens for review; `labkit run`/`stage` never re-execute it (refused)
        review = (os.environ.get("LABKIT_BATCH") != "1" and status.get("status") == "completed"
                  and name in stages_done(status))
        if not review:
            R.check_stage_may_run(run, name, rerun_done=status.get("mode") == "interactive")
    else:
        found, review = _default_run(name, loaded, root)
        if found is None:  # the checks `labkit run` makes, before anything is created
            from labkit.preflight.sizing import check_before_run  # the method on the meta device: peft

            check_before_run(loaded, root)
            found = R.new_run(loaded, root, mode="interactive")
        run = found
    if review:
        return _review(name, loaded, run)
    if not (run.dir / "env.json").exists():
        io.write_json(run.dir / "env.json", capture())
    R.record(run, "stage_started", stage=name, pid=os.getpid())

    start_heartbeat(run.dir)  # lets `labkit runs` tell a live run from one whose process died
    stage = Stage(name, loaded, run, interactive)
    print(f"labkit · {loaded.card.experiment.id}/{run.run_id} · stage {name} · device {stage.device}")
    capture_library_logs(run.dir, name)
    return stage


def _review(name: str, loaded: LoadedCard, run: R.Run) -> Stage:
    """A completed run opened read-only: nothing recorded, no heartbeat; the notebook's files go to a scratch folder."""
    R.check_archived_card(run, loaded)
    scratch = Path(tempfile.mkdtemp(prefix=f"labkit-review-{run.run_id}-"))
    stage = Stage(name, loaded, run, interactive=True, review=scratch)
    status = run.status()
    print(f"labkit · {loaded.card.experiment.id}/{run.run_id} ({R.status_label(status)}) · stage {name} · device "
          f"{stage.device} · review: the run is a record and is not changed; what these cells write goes to {scratch}")
    capture_library_logs(scratch, name)
    return stage
