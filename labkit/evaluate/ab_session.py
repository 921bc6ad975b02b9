"""The blind A/B sessions of a run folder: base against tuned, or this run's tuned answers against another run's.

A session is made once with a fresh seed and kept in the run's comparison folder, so reopening it shows the same
items in the same order; its ratings go beside it:

  comparison/human_ab.json, human_ratings.jsonl                      base model (A or B) against the tuned model
  comparison/human_ab_vs_<run_id>.json, human_ratings_vs_<run_id>.jsonl   another run's answers against this run's

Each session records its seed, the two sources' names (the variants', or the run ids where both runs are of one
variant) and where their answers come from (run id and file inside the run: no machine path).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import yaml

from labkit.core import io
from labkit.errors import MissingInput, UsageError
from labkit.evaluate.human import RATINGS, SIDES, ab_items, human_verdict

AB_SESSION = "human_ab.json"
BASE_ANSWERS = "baseline/baseline_predictions.jsonl"
TUNED_ANSWERS = "comparison/tuned_predictions.jsonl"


def ab_files(run_dir: Path, against: Path | None = None) -> tuple[Path, Path]:
    """(session file, ratings file) of a run's base-vs-tuned session, or of its session against another run."""
    folder = Path(run_dir) / "comparison"
    if against is None:
        return folder / AB_SESSION, folder / RATINGS
    other = Path(against).name
    return folder / f"human_ab_vs_{other}.json", folder / f"human_ratings_vs_{other}.jsonl"


def _answers(run_dir: Path, name: str) -> list[dict[str, Any]]:
    path = Path(run_dir) / name
    if not path.exists():
        raise MissingInput(f"{Path(run_dir).name}: no {name} (a run compared blind needs its stage "
                           f"{'01' if name == BASE_ANSWERS else '05'} answers: finish the run first)")
    return io.read_jsonl(path)


def _variant(run_dir: Path) -> str:
    card = Path(run_dir) / "card.yaml"
    data = yaml.safe_load(card.read_text(encoding="utf-8")) if card.exists() else None
    return str(((data or {}).get("experiment") or {}).get("variant") or Path(run_dir).name)


def _names(run_dir: Path, against: Path) -> tuple[str, str]:
    """The two sources' names: the variants', or the run ids when they are equal (two runs of one variant)."""
    first, second = _variant(against), _variant(run_dir)
    return (first, second) if first != second and "tie" not in (first, second) else (against.name, run_dir.name)


def ab_session(run_dir: str | Path, per_category: int = 3, against: str | Path | None = None) -> dict[str, Any]:
    """The run's blind A/B items: made once with a fresh seed, then reused.

    Args:
        run_dir: the run folder (its stage 05 answers; with `against` None, also its stage 01 answers).
        per_category: examples per category.
        against: another run's folder (a variant of the same experiment, evaluated on the same examples): its
            tuned answers are the first source, this run's the second.
    Returns:
        {"seed", "per_category", "sides" [first, second], "sources" {name: {"run", "answers"}}, "items"}.
    Raises:
        MissingInput: a run without the answers, or two runs without a common evaluation example.
        UsageError: a run against itself.
    """
    run_dir = Path(run_dir)
    other = Path(against) if against is not None else None
    path, _ = ab_files(run_dir, other)
    if path.exists():
        return {"sides": list(SIDES), "sources": {}, **io.read_json(path)}
    second = _answers(run_dir, TUNED_ANSWERS)
    if other is None:
        names, first = SIDES, _answers(run_dir, BASE_ANSWERS)
        sources = {"baseline": {"run": run_dir.name, "answers": BASE_ANSWERS},
                   "tuned": {"run": run_dir.name, "answers": TUNED_ANSWERS}}
    else:
        if other.resolve() == run_dir.resolve():
            raise UsageError(f"ab_rating: run {run_dir.name} against itself: give another run's folder as against=")
        names, first = _names(run_dir, other), _answers(other, TUNED_ANSWERS)
        sources = {names[0]: {"run": other.name, "answers": TUNED_ANSWERS},
                   names[1]: {"run": run_dir.name, "answers": TUNED_ANSWERS}}
        if not {r["id"] for r in first} & {r["id"] for r in second}:
            raise MissingInput(f"runs {other.name} and {run_dir.name} share no evaluation example: compare two runs "
                               "of one experiment evaluated on the same split")
    seed = random.SystemRandom().randrange(2**31)
    session = {"seed": seed, "per_category": per_category, "sides": list(names), "sources": sources,
               "items": ab_items(first, second, seed, per_category, tuple(names))}
    io.write_json(path, session)
    return session


def human_verdicts(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every human verdict of a run: base against tuned first, then against each other run rated (file order).

    Returns:
        `human_verdict` results, each with "file" (the ratings file's name).
    """
    folder = Path(run_dir) / "comparison"
    files = [folder / RATINGS, *sorted(folder.glob("human_ratings_vs_*.jsonl"))]
    return [{**v, "file": f.name} for f in files if (v := human_verdict(f))]
