"""Execute the stage notebooks of a run with papermill, archive them, keep the registry current."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable

from labkit import errors
from labkit.card.load import LoadedCard, load_card
from labkit.cli.follow import Tail
from labkit.cli.signals import Signals
from labkit.cli.summary import budget_stop, registry_summary, verdict_summary
from labkit.core import io
from labkit.core import runs as R
from labkit.core.heartbeat import is_dead, start_heartbeat
from labkit.core.kernel import start_line
from labkit.core.progress import ENV as PROGRESS_ENV, FILE as PROGRESS_FILE, stage_seconds
from labkit.core.replicates import Replicate, replicates
from labkit.errors import MissingInput, RunStateError, StageFailed, StageInterrupted, UsageError
from labkit.experiment.tracking import apply_env, mirror_safely, restore_env, scoped_env
from labkit.model.card_check import check_card
from labkit.stages import records

# `labkit check` reaches this module for `check_card`: what only a run needs — papermill, the environment capture
# (torch), the experiment report (matplotlib, nbconvert) — is imported inside the function that needs it (the command
# line is where imports are late; tests/unit/cli/test_fast_start.py).


def _say(line: str) -> None:
    """A progress line on stdout, at once (also when stdout is a pipe)."""
    print(line, flush=True)


def _kernel_env(run: R.Run, stage: str) -> dict[str, str]:
    """Environment for the notebook kernels: no progress bars in archived notebooks (the stage's progress events go
    to the run's progress.jsonl, which the runner prints), and stage 03's step time for stage 04's ETA."""
    env = {"TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    fit = run.dir / "parameter_check" / records.FIT
    step = (io.read_json(fit).get("plan") or {}).get("seconds_per_step") if fit.exists() else None
    return {"LABKIT_BATCH": "1", PROGRESS_ENV: str(run.dir / PROGRESS_FILE), "LABKIT_STAGE": stage,
            "LABKIT_STEP_SECONDS": str(step or ""), **{k: v for k, v in env.items() if k not in os.environ}}


def execute_stage(run: R.Run, stage: str, nb_dir: Path, log: Callable[[str], None] = _say) -> float:
    """Execute one stage notebook of a run with papermill, printing its progress events as they come.

    Args:
        run: the run (its card.yaml is what the notebook loads).
        stage: the stage name.
        nb_dir: folder of the template notebooks.
        log: where progress lines go.
    Returns:
        the stage's wall time in seconds.
    Raises:
        StageFailed: the notebook raised (its executed copy is kept up to the failing cell).
    """
    import papermill as pm

    source = nb_dir / R.NOTEBOOKS[stage]
    target = run.dir / "notebooks" / R.NOTEBOOKS[stage]
    target.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    try:
        # the stage's own variables end with it: a notebook calling labkit.run keeps its progress bars and
        # interactive stages, and the next stage gets its own
        with scoped_env(_kernel_env(run, stage)), Tail(run.dir, log):
            pm.execute_notebook(str(source), str(target), parameters={"card": str(run.card_path), "run_dir": str(run.dir)},
                                kernel_name="python3", cwd=str(nb_dir), progress_bar=False, log_output=False,
                                # the kernel's own log lines (transport warnings) would drown the progress lines;
                                # everything the notebook prints or raises is kept in the executed notebook
                                extra_arguments=["--IPKernelApp.log_level=CRITICAL",  # then plain-text bars,
                                                 # library logs to the run's log: before the first cell imports one
                                                 f"--IPKernelApp.exec_lines={start_line(run.dir, stage)}"])
    except pm.PapermillExecutionError as exc:
        seconds = stage_seconds(run.dir, stage) or time.monotonic() - start  # as `labkit runs --follow` prints it
        error = f"{exc.ename}: {exc.evalue}".strip().splitlines()[0][:2000]  # the fix ends the line
        interrupted = exc.ename == "TrainingInterrupted"
        R.record(run, "stage_interrupted" if interrupted else "stage_failed", stage=stage, error=error,
                 cell=exc.exec_count, seconds=round(seconds, 1))
        failure = (StageInterrupted if interrupted else StageFailed)(
            f"stage {stage} failed at cell [{exc.exec_count}]: {error} (executed notebook: {target})")
        raised = getattr(errors, exc.ename, None)  # bad input found inside the stage (data, model source): exit 2
        if isinstance(raised, type) and issubclass(raised, errors.LabkitError):
            failure.exit_code = raised.exit_code
        raise failure from None
    return stage_seconds(run.dir, stage) or time.monotonic() - start  # the marks `labkit runs --follow` reads


def _execute(run: R.Run, stages: tuple[str, ...], nb_dir: Path, log: Callable[[str], None]) -> None:
    """Execute stages in order, recording failure and interruption (the run's status follows)."""
    total = time.monotonic()
    timings: dict[str, float] = {}
    stage = stages[0]
    beating = start_heartbeat(run.dir)
    apply_env(mirror_safely(run))  # the trainer's MLflow callback joins the mirrored run
    try:
        with Signals(run) as signals:
            for i, stage in enumerate(stages, 1):
                log(f"  [{i}/{len(stages)}] {R.NOTEBOOKS[stage]:<28} …")
                with signals.during(stage):  # a stage that ended in an error after a signal passed on: interrupted
                    seconds = execute_stage(run, stage, nb_dir, log)
                timings[stage] = round(seconds, 1)
                log(f"  [{i}/{len(stages)}] {R.NOTEBOOKS[stage]:<28} done in {seconds:6.1f} s")
                mirror_safely(run)
                signals.check_between(stages[i] if i < len(stages) else None)
    except StageInterrupted as exc:
        R.record(run, "interrupted", status="interrupted", stage=stage, error=str(exc), timings=timings)
        mirror_safely(run, final=True)
        log(f"interrupted: {exc}")
        raise KeyboardInterrupt(str(exc)) from None
    except StageFailed as exc:
        R.record(run, "failed", status="failed", stage=stage, error=str(exc), timings=timings)
        mirror_safely(run, final=True, report=refresh_report(run, log))
        raise
    except KeyboardInterrupt:
        R.record(run, "interrupted", status="interrupted", stage=stage, timings=timings)
        mirror_safely(run, final=True)
        raise
    except Exception as exc:  # noqa: BLE001 - the kernel died, papermill broke…: still recorded
        R.record(run, "failed", status="failed", stage=stage, error=f"{type(exc).__name__}: {exc}"[:500], timings=timings)
        mirror_safely(run, final=True)
        raise
    finally:
        beating.set()
        restore_env()  # the next card's run is its own
    budget = budget_stop(run)
    R.record(run, "completed", status="completed", timings=timings, seconds=round(time.monotonic() - total, 1),
             summary=registry_summary(run), **budget)
    label = R.status_label({**budget, "status": run.status()["status"]})  # "invalid" when invalidated meanwhile
    log(f"{label} in {time.monotonic() - total:.0f} s → {run.dir}" + (f" ({budget['note']})" if budget else ""))
    mirror_safely(run, final=True, report=refresh_report(run, log))
    log(verdict_summary(run))  # the card's result is its output's last line


def refresh_report(run: R.Run, log: Callable[[str], None] = print) -> Path | None:
    """Rebuild the experiment's HTML report after a run changed (a failure to do so never fails the run).

    LABKIT_REPORT=0 skips it (`labkit compare EXPERIMENT` builds it on demand).
    """
    from labkit.experiment.report import build_report

    if os.environ.get("LABKIT_REPORT") == "0":
        return None
    try:
        page = build_report(run.root, run.experiment)
        log(f"experiment report: {page}")
        return page
    except Exception as exc:  # noqa: BLE001 - the run's own results are already recorded
        log(f"labkit: the experiment report was not refreshed ({type(exc).__name__}: {exc}); "
            f"`labkit compare {run.experiment}` retries")
    return None


def run_card(loaded: LoadedCard, root: Path, nb_dir: Path, stages: tuple[str, ...] = R.STAGES,
             log: Callable[[str], None] = _say, replicate: Replicate | None = None, run_id: str | None = None) -> R.Run:
    """Run the stages of one card in a new run folder (or, given a run id that exists and is not completed, resume
    it: the same command again after a machine was lost).

    Args:
        loaded: the validated card.
        root: the runs root.
        nb_dir: the template notebooks.
        stages: which stages, in order.
        log: where progress lines go.
        replicate: which replicate of the card (`run_replicates` passes each), or None.
        run_id: the run's id (`--run-id`; default: generated). The head of a run on several machines runs this.
    Returns:
        the completed Run.
    Raises:
        StageFailed: a stage failed (the run is recorded as failed).
        KeyboardInterrupt: interrupted (the run is recorded as interrupted).
    """
    from labkit.core.environment import capture

    from labkit.cli.join import check_head

    check_card(loaded, root)  # before anything is created
    check_head(loaded.card)  # several machines: this one is the head, and the environment names it
    folder = root / loaded.card.experiment.id / R.check_run_id(run_id) if run_id else None
    if folder is not None and (folder / "status.json").is_file():  # the same command again: the run goes on
        R.check_archived_card(R.Run(folder), loaded)
        if R.Run(folder).status().get("status") == "completed":
            log(f"run {loaded.card.experiment.id}/{run_id} is already completed: nothing to do → {folder}")
            return R.Run(folder)
        return resume_run(str(folder), root, nb_dir, log)
    run = R.new_run(loaded, root, mode="batch", replicate=replicate, run_id=run_id)
    io.write_json(run.dir / "env.json", capture())
    log(f"run {run.experiment}/{run.run_id}" + (f" (replicate {replicate['index']}/{replicate['of']}, seed "
                                               f"{replicate['seed']})" if replicate else ""))
    _execute(run, stages, nb_dir, log)
    return run


def run_replicates(loaded: LoadedCard, root: Path, nb_dir: Path, log: Callable[[str], None] = _say,
                   run_id: str | None = None) -> list[R.Run]:
    """`run_card` once, or once per replicate (`experiment.replicates`: seeds train.seed + 0 … k-1, a run folder each,
    stage 01's baseline reused from the experiment's cache; a failed replicate stops the later ones).

    Returns: the completed runs, in seed order.
    """
    reps = replicates(loaded.card) if loaded.card.experiment.replicates > 1 else [None]
    if run_id and len(reps) > 1:
        raise UsageError(f"--run-id names one run, and {loaded.path} has experiment.replicates {len(reps)}: run it "
                         "without --run-id (or one replicate per card)")
    return [run_card(loaded, root, nb_dir, log=log, replicate=rep, run_id=run_id) for rep in reps]


def check_training_restart(run: R.Run, restart: bool) -> None:
    """Before stage 04 runs again in a run where it ran before: refuse when no usable checkpoint is left (training
    would start from step 1 and overwrite the earlier loss history), unless told to start over, which keeps the
    earlier history and checkpoints beside the new ones.

    Args:
        run: the run.
        restart: `--restart-training`.
    Raises:
        RunStateError: no checkpoint to continue from, and no --restart-training (one line with both options).
    """
    from labkit.train.resilience import last_checkpoint

    folder = run.dir / "training"
    history, checkpoints = folder / records.LOG_HISTORY, folder / records.CHECKPOINTS
    ran = history.exists() or (checkpoints.is_dir() and any(checkpoints.glob("checkpoint-*")))
    if not ran or last_checkpoint(checkpoints) is not None:
        return
    if not restart:
        raise RunStateError(f"{run.run_id}: training ran before ({history.name if history.exists() else 'checkpoint folders'}"
                            f" in {folder}) but no usable checkpoint is left in {checkpoints}: resuming would start "
                            "again from step 1 and overwrite its history; restore the checkpoints, or add "
                            "--restart-training to start over (the earlier history is kept beside the new one)")
    stamp = io.utc_now().replace(":", "")
    for path in (history, checkpoints):
        if path.exists():
            path.rename(path.with_name(f"{path.stem}.before-{stamp}{path.suffix}"))


def resume_run(run_id: str, root: Path, nb_dir: Path, log: Callable[[str], None] = _say,
               restart_training: bool = False) -> R.Run:
    """Continue an interrupted or failed run in this process: the stages not yet done, in order;
    the training stage continues from its newest checkpoint.

    Args:
        run_id: the run's id (folder name), or its path.
        root: the runs root.
        nb_dir: the template notebooks.
        log: where progress lines go.
        restart_training: start training over when it ran before and no usable checkpoint is left.
    Returns:
        the completed Run.
    """
    from labkit.core.environment import capture

    run = R.find_run(run_id, root)
    R.check_archived_card(run, load_card(run.card_path))  # the card every stage of the run was and is run under
    status = run.status()
    done = {s for s, v in status.get("stages", {}).items() if v.get("status") == "done"}
    todo = tuple(s for s in R.STAGES if s not in done)
    if status["status"] == "invalid" or not todo:
        raise RunStateError(f"{run.run_id} is {status['status']}: nothing to resume")
    if status["status"] == "running":
        if not is_dead(run.dir, status):
            raise RunStateError(f"{run.run_id} is still running (pid {status.get('pid')}); stop it first")
    if "training" in todo:
        check_training_restart(run, restart_training)
    R.record(run, "resumed", status="running", from_stage=todo[0], pid=os.getpid())
    R.set_owner(run, os.getpid())
    io.write_json(run.dir / f"env.resumed-{io.utc_now().replace(':', '')}.json", capture())  # the machine may differ
    log(f"resume {run.experiment}/{run.run_id} from {R.NOTEBOOKS[todo[0]]}")
    _execute(run, todo, nb_dir, log)
    return run


def load_all(paths: list[str], root: Callable[[LoadedCard], Path]) -> list[LoadedCard]:
    """Load and check every card before any run starts (a bad card, or a method that does not apply to its model,
    creates no run folder).

    Args:
        paths: the card files.
        root: the runs root of a loaded card.
    Returns:
        the loaded cards.
    """
    from labkit.preflight.sizing import check_before_run  # the model's config on the meta device: torch

    cards = [load_card(p) for p in paths]
    for loaded in cards:
        check_before_run(loaded, root(loaded))
    return cards


def stage_into(loaded: LoadedCard, stage: str, run_dir: str | None, root: Path, nb_dir: Path,
               restart_training: bool = False) -> R.Run:
    """Run one stage of a card, into an existing run folder or a new one; the run then ends `completed` (this stage
    done), `failed` with its error or `interrupted` (SIGTERM / Ctrl-C, handled as `labkit run` does), never `running`.

    Returns:
        the Run.
    """
    from labkit.core.environment import capture
    from labkit.preflight.sizing import check_before_run

    if run_dir:
        run = R.Run(Path(run_dir).resolve())
        if not run.status_path.exists():
            raise MissingInput(f"{run_dir}: not a run folder (no status.json)")
        status = run.status()
        R.check_archived_card(run, loaded)
        R.check_stage_may_run(run, stage)
        if stage == "training":
            check_training_restart(run, restart_training)
        if status.get("status") == "running" and not is_dead(run.dir, status):
            raise RunStateError(f"{run_dir} is running (pid {status.get('pid')}); wait for it or stop it first")
        check_before_run(loaded, root)
        R.record(run, "resumed", status="running", from_stage=stage, pid=os.getpid())
        R.set_owner(run, os.getpid())
    else:
        check_before_run(loaded, root)  # before anything is created
        run = R.new_run(loaded, root, mode="batch")
        io.write_json(run.dir / "env.json", capture())
    beating = start_heartbeat(run.dir)
    apply_env(mirror_safely(run))
    try:
        with Signals(run) as signals, signals.during(stage):  # as in `labkit run`: training checkpoints and stops
            seconds = execute_stage(run, stage, nb_dir)
    except StageInterrupted as exc:
        R.record(run, "interrupted", status="interrupted", stage=stage, error=str(exc))
        print(f"interrupted: {exc}", file=sys.stderr)
        raise KeyboardInterrupt(str(exc)) from None
    except StageFailed as exc:
        R.record(run, "failed", status="failed", stage=stage, error=str(exc))
        raise
    except BaseException as exc:  # Ctrl-C, the kernel died, papermill broke: still recorded
        interrupted = isinstance(exc, KeyboardInterrupt)
        R.record(run, "interrupted" if interrupted else "failed", status="interrupted" if interrupted else "failed",
                 stage=stage, error=f"{type(exc).__name__}: {exc}"[:500])
        raise
    finally:
        beating.set()
        if run.status().get("status") != "running":
            mirror_safely(run, final=True)
        restore_env()
    budget = budget_stop(run) if stage == "training" else {}
    R.record(run, "completed", status="completed", stage=stage, seconds=round(seconds, 1), **budget)
    mirror_safely(run, final=True)
    label = R.status_label({**budget, "status": run.status()["status"]})  # "invalid" when invalidated meanwhile
    print(f"{R.NOTEBOOKS[stage]} done in {seconds:.1f} s → {run.dir} ({label})", file=sys.stderr)
    return run
