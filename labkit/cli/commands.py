"""The subcommands of `labkit`: each takes the parsed arguments and returns the exit status.

Errors a user can act on are raised as `labkit.errors.LabkitError` and printed by `labkit.cli.main` as one
line; a command never prints a traceback for them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from labkit.card.load import dump_yaml, load_card
from labkit.card.locate import locate
from labkit.card.shipped import init_folder, shipped
from labkit.core import io, listing
from labkit.core import runs as R
from labkit.core.registry import lost_events_note
from labkit.errors import CardError, LabkitError, MethodError, MissingInput, ModelSourceError, UsageError

# The command line is where imports are late: each command imports its implementation (torch, transformers, papermill,
# matplotlib… behind it) inside its function, so `labkit --help`, `labkit runs` and `labkit check` load none of them
# (tests/unit/cli/test_fast_start.py). Library modules import at the top.


def _root(args: argparse.Namespace, start: Path | None = None) -> Path:
    """The runs root: --runs, else $LABKIT_RUNS or <project>/runs (from `start`, default the working folder).

    Raises:
        UsageError: the root names a file, not a folder.
    """
    given = getattr(args, "runs", None)
    root = Path(given).expanduser().resolve() if given else R.runs_root(start)
    if root.exists() and not root.is_dir():
        origin = "--runs" if given else ("$LABKIT_RUNS" if os.environ.get("LABKIT_RUNS") else "the runs folder")
        raise UsageError(f"{origin} {root}: is a file, not a folder (name the folder that holds registry.jsonl, "
                         "or a new one)")
    return root


def notebooks_dir(explicit: str | Path | None = None) -> Path:
    """Where the stage notebooks are: --notebooks, else <project>/notebooks (a checkout or a `labkit init` folder),
    else the ones shipped inside the package.

    Raises:
        MissingInput: --notebooks names a folder without the stage notebooks.
    """
    first = R.NOTEBOOKS[R.STAGES[0]]
    if explicit:
        if not (Path(explicit) / first).is_file():
            raise MissingInput(f"--notebooks {explicit}: no {first} there (name the folder holding the five stage "
                               "notebooks, e.g. the notebooks/ that labkit init wrote)")
        return Path(explicit).resolve()
    local = R.project_root() / "notebooks"
    return local.resolve() if (local / first).is_file() else shipped("notebooks")


def cmd_init(args: argparse.Namespace) -> int:
    """`labkit init [DIR]`: copy the stage notebooks and the example cards into DIR (default: here); never
    overwrites a file."""
    written = init_folder(args.dir)
    dest = Path(args.dir).expanduser().resolve()
    counts = {kind: sum(1 for p in written if p.relative_to(dest).parts[0] == kind) for kind in ("notebooks", "params")}
    print(f"{dest}: {counts['notebooks']} notebooks in notebooks/, {counts['params']} card files in params/")
    print(f"next: cd {dest} && labkit check params/quickstart.yaml && labkit run params/quickstart.yaml")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """`labkit run CARD… [--run-id ID] | --resume RUN_ID | --join ID`: 0 when every card's run completed, else the worst failure's code (1 a
    stage failed on valid input, 2 bad input found inside a stage)."""
    from labkit.cli.runner import load_all, resume_run, run_replicates
    from labkit.cli.summary import verdict_summary

    if args.join:  # a machine other than the head of a run on several machines (labkit.cli.join)
        from labkit.cli.join import join_run

        if args.cards or args.resume or args.run_id or args.restart_training:
            raise UsageError("labkit run --join ID takes no card, --resume, --run-id or --restart-training (the head's "
                             "run says what to train)")
        return join_run(args.join, _root(args))
    if args.run_id and (args.resume or len(args.cards) != 1):
        raise UsageError("--run-id names one new run (or the run to continue): give exactly one card, without --resume")
    if args.resume:
        if args.cards:
            raise UsageError("labkit run --resume RUN_ID takes no cards (the run's archived card is used)")
        resume_run(args.resume, _root(args), notebooks_dir(args.notebooks), restart_training=args.restart_training)
        return 0
    if args.restart_training:
        raise UsageError("--restart-training goes with --resume RUN_ID (a new run has no earlier training)")
    if not args.cards:
        raise UsageError("labkit run needs at least one card (or --resume RUN_ID)")
    cards = load_all(args.cards, lambda loaded: _root(args, loaded.path.parent))  # every card checked first
    nb_dir = notebooks_dir(args.notebooks)
    code, ends = 0, []
    for loaded in cards:
        try:
            runs = run_replicates(loaded, _root(args, loaded.path.parent), nb_dir, run_id=args.run_id)
            ends += [verdict_summary(run) for run in runs]
        except LabkitError as exc:  # report, go on with the next card
            print(f"labkit: error: {exc}", file=sys.stderr)
            code = max(code, exc.exit_code)
            ends.append(f"verdict {loaded.card.experiment.id}/{loaded.card.experiment.variant}: none "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0][:80]})")
    if len(ends) > 1:  # several runs: each one's verdict again, together, at the very end
        print(f"summary of {len(ends)} runs:", flush=True)
        for line in ends:
            print(f"  {line}", flush=True)
    return code


def cmd_stage(args: argparse.Namespace) -> int:
    """`labkit stage NAME CARD [--run DIR]`: one stage notebook; the run ends completed or failed."""
    from labkit.cli.runner import stage_into

    loaded = load_card(args.card)
    stage_into(loaded, args.name, args.run, _root(args, loaded.path.parent), notebooks_dir(args.notebooks),
               restart_training=args.restart_training)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """`labkit check CARD… [--data]`: every check that needs only the card (parent chain, diff, data section, model
    source, the experiment's protocol); with --data also stage 01's preparation checks in memory and the method on
    the model's config (`labkit.cli.checks`). Writes no run.
    0 when every card passes, else the worst error's code (2 bad input)."""
    from labkit.cli.runner import check_card

    code = 0
    for path in args.cards:
        loaded = None
        try:
            loaded = load_card(path)
            changes = check_card(loaded, _root(args, loaded.path.parent))
            extra: list[str] = []
            if args.data:  # the tokenizer, the data and the model's config: transformers and torch
                from labkit.cli.checks import data_line, method_line

                extra = [f"data: {data_line(loaded, _root(args, loaded.path.parent))}", f"method: {method_line(loaded)}"]
        except LabkitError as exc:  # a card that loaded gets its place in front of a check's line (several cards)
            print(f"labkit: error: {locate(str(exc), loaded) if loaded else exc}", file=sys.stderr)
            code = max(code, exc.exit_code)
            continue
        print(f"{loaded.path}: ok ({loaded.card.experiment.id}/{loaded.card.experiment.variant}, hash {loaded.hash})")
        for line in extra:
            print("  " + line)
        for parent in loaded.chain[1:]:
            print(f"  parent: {parent}")
        if len(loaded.chain) > 1:
            diff = {k: v["card"] for k, v in loaded.diff.items()}
            print("  changed against its parent:" + ("" if diff else " nothing"))
            if diff:
                print("\n".join("    " + line for line in dump_yaml(diff).splitlines()))
        if changes:
            print(f"  protocol: changes {', '.join(changes)} (experiment.protocol_change: "
                  f"{loaded.card.experiment.protocol_change!r}; flagged not comparable)")
        else:
            print("  protocol: follows the experiment's reference run (or is its first)")
    return code


def cmd_invalidate(args: argparse.Namespace) -> int:
    """`labkit invalidate RUN --why …`: mark a run invalid; it stays in the registry with its reason."""
    run = R.find_run(args.run, _root(args))
    if not args.why.strip():
        raise UsageError("labkit invalidate needs --why \"the reason\" (it is kept with the run)")
    R.record(run, "invalidated", status="invalid", why=args.why.strip())
    print(f"{run.experiment}/{run.run_id} marked invalid: {args.why.strip()}")
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    """`labkit runs [EXPERIMENT]`: the registry as a table (every run, failed and interrupted too)."""
    root = _root(args)
    if getattr(args, "follow", None):  # one run's live progress (labkit.cli.follow)
        from labkit.cli.follow import follow, resolve_run

        return 0 if follow(resolve_run(args.follow, root)) == "completed" else 1
    for run_id in R.mark_dead_runs(root):
        print(f"labkit: {run_id} was recorded as running but its process is gone: marked interrupted", file=sys.stderr)
    rows = listing.rows(root, args.experiment)  # interactive runs whose kernel is gone: abandoned (kernel gone)
    if getattr(args, "json", False):  # one JSON document: the table's columns and machine-friendly ones
        print(json.dumps(rows, ensure_ascii=False, indent=1))
        return 0
    if not rows:
        print(f"no runs in {root}")
        return 0
    header = tuple(listing.COLUMNS.values())
    table = [tuple(str(r[k] or "")[:70] if k == "result" else r[k] for k in listing.COLUMNS) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table)]
    for line in [header, tuple("-" * w for w in widths), *table]:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip())
    if note := lost_events_note(root):
        print(f"labkit: note: {note}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """`labkit compare EXPERIMENT`: every run of an experiment under one protocol, and its HTML report."""
    from labkit.experiment.compare import summary_rows
    from labkit.experiment.report import build_report
    from labkit.cli.summary import compare_lines
    from labkit.experiment.runs_table import pair_rows, seed_rows

    root = _root(args)
    if not any(r.get("experiment") == args.experiment for r in R.summarise(R.read_registry(root))):
        raise MissingInput(f"no runs of experiment {args.experiment!r} under {root} (see `labkit runs`)")
    report = root / args.experiment / "_report"
    existed = report.exists()
    try:
        index = build_report(root, args.experiment, resamples=args.resamples)
    except BaseException:
        if not existed:  # a failed first report leaves no half-written folder
            shutil.rmtree(report, ignore_errors=True)
        raise
    comparison = io.read_json(index.parent / "comparison.json")
    # a table of at most ~118 columns; every number and sentence is in comparison.json and the report
    for line in compare_lines(comparison, summary_rows(comparison), pair_rows(comparison), seed_rows(comparison)):
        print(line)
    if note := lost_events_note(root):
        print(f"labkit: note: {note}")
    print(f"data: {index.parent / 'comparison.json'}")
    print(f"report: {index}")
    return 0


def cmd_final(args: argparse.Namespace) -> int:
    """`labkit final RUN [--reopen --why …]`: open the experiment's locked test split once, then refresh the report."""
    from labkit.cli.runner import refresh_report
    from labkit.experiment.final import final

    out = final(args.run, _root(args), reopen=args.reopen, why=args.why)
    refresh_report(R.Run(Path(out["dir"]).parent), print)  # the experiment's report shows every opening
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """`labkit export RUN`: 0 exported, 1 the reload check failed (ExportCheckFailed), 2 refused (ExportRefused)."""
    from labkit.cli.worker import quiet_libraries
    from labkit.export.deliver import export
    from labkit.export.reload_check import summary as reload_summary

    quiet_libraries()  # its lines and the reload check's phases, not the libraries' bars and warnings
    result = export(args.run, _root(args), merged=args.merged, out=Path(args.out) if args.out else None,
                    sample=args.sample, device=args.device, memory_gib=getattr(args, "memory", None),
                    dtype=getattr(args, "dtype", None))
    print(f"exported {result['run_id']} to {result['export_dir']}: reload check passed "
          f"({reload_summary(result['reload_check'])})")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """`labkit plan CARD --days D …`: the rental plan from measured timings."""
    from labkit.experiment.plan import make_plan

    make_plan(args.card, args.days, args.price_per_hour, _root(args) if getattr(args, "runs", None) else None,
              speedup=args.speedup, margin=args.margin, max_loss_minutes=args.max_loss_minutes,
              max_loss_fraction=args.max_loss_fraction, continuation_factor=args.continuation,
              grid=getattr(args, "grid", None), spread=getattr(args, "spread", None),
              setup_hours=getattr(args, "setup_hours", 1.0))
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    """`labkit estimate CARD --gpu NAME | --gpu-memory GIB [--processes N --machines M --strategy S]`: size a card for
    a GPU before renting it, per GPU under the card's layout of processes (offline, no weights). Exit 1 when the step
    does not fit, or cannot be estimated (an architecture the estimate does not model: what the config gives is shown)."""
    from labkit.preflight.gpus import gpu_named
    from labkit.preflight.layouts import estimate_layout, layout_of
    from labkit.show.memory import export_line, layout_lines, step_lines, unmodelled_lines

    loaded = load_card(Path(args.card))
    card = loaded.card
    named = gpu_named(args.gpu) if args.gpu else None
    memory = named.memory_gib if named else args.gpu_memory
    capability = args.capability or (named.capability if named else "8.0")
    layout = layout_of(card, args.processes, args.machines, args.strategy)
    try:
        got = estimate_layout(card, loaded.path, memory, capability, args.seq_len, args.config, layout,
                              name=named.name if named else None)
    except (CardError, MethodError, ModelSourceError) as exc:  # a key of the card: its file and line in front
        raise type(exc)(locate(str(exc), loaded)) from None
    est, verdict, made = got["estimate"], got["verdict"], got["decisions"]
    print(f"card: {args.card} ({card.method.kind}, {card.model.source})")
    print(f"device: {got['device']}: weights {made['weight_dtype']}, precision {made['precision']}"
          + (f", 4-bit compute {made['compute_dtype']}" if made["compute_dtype"] else ""))
    if not est["modelled"]:  # the config gives the weights and states; the step itself is stage 03's to measure
        lines, over = unmodelled_lines(est, memory)
        print(f"step at micro-batch {est['micro_batch']}, {got['seq_len']} tokens:\n" + "\n".join(lines))
        print(f"verdict: does not fit: the weights and optimiser states alone exceed {memory:g} GiB" if over else
              "verdict: not estimated: run stage 03 on the machine, which measures the step")
        return 1
    print(f"step at micro-batch {est['micro_batch']}, {got['seq_len']} tokens"
          + (", activation checkpointing" if est["checkpointing"] else "")
          + (", one process holding everything" if layout["id"] != "single" else "") + ":")
    print("\n".join(step_lines(est, verdict["overheads"], verdict["needed_bytes"], memory)))
    print("\n".join(layout_lines(got, named.name if named else f"{memory:g} GiB GPU", memory)))
    print(export_line(card, loaded.path, memory, capability, args.config, got))
    largest = got["largest_micro_batch"]
    print(f"largest micro-batch that fits: {largest['plain'] or 'none'} without activation checkpointing, "
          f"{largest['checkpointing'] or 'none'} with it" + (" (one process)" if layout["id"] != "single" else ""))
    return 0 if got["layout_verdict"]["fits"] else 1


def cmd_launch(args: argparse.Namespace) -> int:
    """`labkit launch CARD --on skypilot|slurm|torchrun [--gpu NAME]`: write the files that start the card's run
    where GPUs are rented (labkit.experiment.launch_files), into a folder it prints."""
    from labkit.experiment.launch_files import check_options, choose_gpu, launch_spec, write_launch

    loaded = load_card(Path(args.card))
    check_options(runs_mount=args.runs_mount, wheel=args.wheel, bucket=args.bucket, head=args.head,
                  run_id=args.run_id, out=args.out)  # before the estimate: bad options fail at once
    for option, value in (("--cpus-per-node", args.cpus_per_node), ("--time-minutes", args.time_minutes)):
        if value is not None and value < 1:
            raise UsageError(f"{option} {value}: give a positive whole number")
    gpu, verdict = choose_gpu(loaded, args.gpu)
    spec = launch_spec(loaded, gpu, runs=args.runs_mount, wheel=args.wheel, bucket=args.bucket, head=args.head,
                       cpus=args.cpus_per_node, minutes=args.time_minutes, run_id=args.run_id, target=args.on)
    out = Path(args.out) if args.out else R.project_root(loaded.path.parent) / "launch" / f"{spec.name}-{args.on}"
    written = write_launch(loaded, args.on, out.expanduser().resolve(), spec, verdict)
    print(f"{loaded.path}: {spec.machines} machine(s) x {spec.per_machine} {gpu} ({verdict['message']})")
    print(f"launch files ({args.on}) in {out.expanduser().resolve()}: {', '.join(p.name for p in written)}")
    if args.on == "skypilot" and not Path(spec.wheel).is_file():
        print(f"note: {spec.wheel} does not exist yet: build it in the project folder with python -m build --wheel "
              "(or pass --wheel PATH) before sky jobs launch")
    return 0
