"""The `labkit` command: run cards through the stage notebooks, and read the registry."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from labkit import runs as R

EXPECTED = ("CardError", "ModelSourceError", "DataError", "StageFailed", "MethodError", "FileNotFoundError",
            "ValueError", "PermissionError", "LeakageError")


def _cmd_run(args: argparse.Namespace) -> int:
    from labkit.runner import load_all, notebooks_dir, resume_run, run_card

    if args.resume:
        if args.cards:
            raise ValueError("labkit run --resume RUN_ID takes no cards (the run's archived card is used)")
        root = Path(args.runs).resolve() if args.runs else R.runs_root()
        resume_run(args.resume, root, notebooks_dir(args.notebooks))
        return 0
    if not args.cards:
        raise ValueError("labkit run needs at least one card (or --resume RUN_ID)")
    cards = load_all(args.cards)  # every card validated before anything is created
    nb_dir = notebooks_dir(args.notebooks)
    failed = 0
    for loaded in cards:
        root = Path(args.runs).resolve() if args.runs else R.runs_root(loaded.path.parent)
        try:
            run_card(loaded, root, nb_dir)
        except Exception as exc:  # noqa: BLE001 - report, go on with the next card
            if type(exc).__name__ not in EXPECTED:
                raise
            print(f"labkit: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def _cmd_stage(args: argparse.Namespace) -> int:
    from labkit.cards import load_card
    from labkit.runner import notebooks_dir, stage_into

    loaded = load_card(args.card)
    root = Path(args.runs).resolve() if args.runs else R.runs_root(loaded.path.parent)
    stage_into(loaded, args.name, args.run, root, notebooks_dir(args.notebooks))
    return 0


def _cmd_invalidate(args: argparse.Namespace) -> int:
    root = Path(args.runs).resolve() if args.runs else R.runs_root()
    run = R.find_run(args.run, root)
    if not args.why.strip():
        raise ValueError("labkit invalidate needs --why \"the reason\" (it is kept with the run)")
    R.record(run, "invalidated", status="invalid", why=args.why.strip())
    print(f"{run.experiment}/{run.run_id} marked invalid: {args.why.strip()}")
    return 0


def _cmd_runs(args: argparse.Namespace) -> int:
    root = Path(args.runs).resolve() if args.runs else R.runs_root()
    for run_id in R.mark_dead_runs(root):
        print(f"labkit: {run_id} was recorded as running but its process is gone: marked interrupted", file=sys.stderr)
    rows = R.summarise(R.read_registry(root))
    if args.experiment:
        rows = [r for r in rows if r["experiment"] == args.experiment]
    if not rows:
        print(f"no runs in {root}")
        return 0
    header = ("run", "status", "stage", "updated", "result / error")
    table = []
    for r in rows:
        summary = r.get("summary") or {}
        result = ""
        if summary:
            metric = next((k for k in summary if k != "confirmed"), None)
            if metric:
                result = f"{metric} {summary[metric]['baseline']:.3f}→{summary[metric]['tuned']:.3f} "
            result += "confirmed" if summary.get("confirmed") else "not confirmed"
        table.append((f"{r['experiment']}/{r['run_id']}", r.get("status", "?"), r.get("stage", ""),
                      r.get("updated", ""), result or (r.get("error") or "")[:70]))
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table)]
    for line in [header, tuple("-" * w for w in widths), *table]:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip())
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from labkit.experiment import summary_rows
    from labkit.report import build_report

    root = Path(args.runs).resolve() if args.runs else R.runs_root()
    index = build_report(root, args.experiment, resamples=args.resamples)
    comparison = R.read_json(index.parent / "comparison.json")
    for row in summary_rows(comparison):
        print(" · ".join(f"{k}: {v}" for k, v in row.items() if v not in ("", None)))
    print(f"report: {index}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `labkit` command."""
    parser = argparse.ArgumentParser(prog="labkit", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--runs", help="runs folder (default: $LABKIT_RUNS or <project>/runs)")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run every stage of each card through papermill, archived")
    run.add_argument("cards", nargs="*", help="experiment cards (params/*.yaml)")
    run.add_argument("--resume", metavar="RUN_ID", help="continue an interrupted or failed run from its first unfinished "
                     "stage (training from its newest checkpoint), in this process")
    run.add_argument("--notebooks", help="folder of the stage notebooks (default: <project>/notebooks)")
    run.set_defaults(func=_cmd_run)
    stage = sub.add_parser("stage", help="run one stage notebook of a card")
    stage.add_argument("name", choices=R.STAGES)
    stage.add_argument("card")
    stage.add_argument("--run", help="an existing run folder to run the stage in (default: a new run)")
    stage.add_argument("--notebooks")
    stage.set_defaults(func=_cmd_stage)
    runs = sub.add_parser("runs", help="the registry as a table (every run, failed and interrupted too)")
    runs.add_argument("experiment", nargs="?")
    runs.set_defaults(func=_cmd_runs)
    invalidate = sub.add_parser("invalidate", help="mark a run invalid, with the reason (it stays in the registry)")
    invalidate.add_argument("run", help="run id (or run folder)")
    invalidate.add_argument("--why", required=True, help="the reason, kept with the run")
    invalidate.set_defaults(func=_cmd_invalidate)
    compare = sub.add_parser("compare", help="compare every run of an experiment (bootstrap intervals, paired per example, "
                             "protocol check) and write its HTML report")
    compare.add_argument("experiment", help="the experiment id (experiment.id of its cards)")
    compare.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    compare.set_defaults(func=_cmd_compare)
    from labkit import export, final, plan

    final.add_command(sub)
    export.add_command(sub)
    plan.add_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `labkit` console script."""
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("LABKIT_DEBUG") == "1"
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("labkit: interrupted (recorded in the registry)", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001
        if debug or type(exc).__name__ not in EXPECTED:
            traceback.print_exc()
        else:
            print(f"labkit: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
