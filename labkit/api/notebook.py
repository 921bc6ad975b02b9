"""`labkit.run(card)` and `labkit.stage(name, card)`: run a card's stages from a notebook cell, open a stage of a run.

`labkit.run` is `labkit run` (each stage's notebook through papermill, archived, the registry updated) in this
process; `labkit.stage` is what a stage notebook's first cell calls (`labkit.stages.context.open_stage`), with
run_dir "latest" by default: the card's newest completed run, opened for review (nothing in it is changed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from labkit.api.registry import runs as registry_runs
from labkit.api.registry import runs_root
from labkit.cli.commands import notebooks_dir
from labkit.cli.runner import load_all, run_replicates
from labkit.core import runs as R
from labkit.core.listing import LATEST
from labkit.card.load import LoadedCard
from labkit.errors import LabkitError, UsageError
from labkit.stages.context import Stage, open_stage

__all__ = ["run", "stage"]


def run(*cards: str | Path, runs: str | Path | None = None, notebooks: str | Path | None = None) -> pd.DataFrame:
    """Run every stage of each card, as `labkit run CARD…` does: every card is checked before the first runs; a
    card whose run fails is reported and the next one runs; its error is raised once all have run.

    Args:
        cards: experiment cards (params/*.yaml).
        runs: the runs root (default: $LABKIT_RUNS or <project>/runs, found from each card).
        notebooks: folder of the stage notebooks (default: <project>/notebooks, else the shipped ones).
    Returns:
        the runs made, one row each, as `labkit.runs()` shows them (status, result, dir…).
    Raises:
        LabkitError: the first failure (bad input: exit-2 kind; a stage that failed: StageFailed), after every card ran.
    """
    if not cards:
        raise UsageError("labkit.run needs at least one card: labkit.run(\"params/quickstart.yaml\")")

    def root_of(loaded: LoadedCard) -> Path:
        return runs_root(runs) if runs else R.runs_root(loaded.path.parent)

    loaded_cards = load_all([str(c) for c in cards], root_of)
    nb_dir = notebooks_dir(notebooks)
    made: dict[Path, list[str]] = {}
    failure: LabkitError | None = None
    for loaded in loaded_cards:
        root = root_of(loaded)
        try:
            made.setdefault(root, []).extend(r.run_id for r in run_replicates(loaded, root, nb_dir))
        except LabkitError as exc:  # reported, the next card runs
            print(f"labkit: error: {exc}", file=sys.stderr)
            failure = failure or exc
    if failure is not None:
        raise failure
    frames = [registry_runs(runs=root).loc[ids] for root, ids in made.items()]
    return pd.concat(frames) if frames else registry_runs(runs=runs)


def stage(name: str, card: str | Path, run_dir: str | Path = LATEST, runs: str | Path | None = None) -> Stage:
    """Open a stage of a run, as a stage notebook's first cell does.

    Args:
        name: the stage (baseline, preprocessing, parameter_check, training, comparison).
        card: the experiment card.
        run_dir: "latest" (default): the card's newest completed run with this stage done, opened for review;
            a run folder, or a run id (or unique prefix) as `labkit runs` lists it; "": the card's interactive run.
        runs: the runs root used to find a run id (default: $LABKIT_RUNS or <project>/runs).
    Returns:
        the Stage: `stage.card`, `stage.run`, `stage.read(stage, file)`, `stage.load_model()`…
    """
    given = str(run_dir)
    if given not in ("", LATEST) and not Path(given).expanduser().is_dir():
        given = str(R.find_run(given, runs_root(runs)).dir)
    return open_stage(name, str(card), given)
