"""The `labkit` command: run cards through the stage notebooks, read the registry, decide and deliver.

Exit status: 0 done; 1 a stage or a check failed on valid input; 2 bad input (a card, a data file, a
model source, the command's arguments, a run in the wrong state) — printed as one line, never a traceback
(`--debug` or LABKIT_DEBUG=1 shows it); 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from labkit import __version__
from labkit.cli import commands
from labkit.core.kernel import quiet_unactionable
from labkit.core.runs import STAGES
from labkit.errors import LabkitError


def _add_final(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("final", help="open the experiment's locked test split once (recorded) and evaluate "
                            "base and tuned models on it")
    parser.add_argument("run", help="run id (or run folder); it must be completed")
    parser.add_argument("--reopen", action="store_true",
                        help="open the test split again although this experiment's was already opened (needs --why)")
    parser.add_argument("--why", help="the reason for reopening (kept in the registry and in final/opening.json)")
    parser.set_defaults(func=commands.cmd_final)


def _add_export(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("export", help="deliver a completed run: adapter tied to its base revision, model card, "
                            "reload check")
    parser.add_argument("run", help="run id (or run folder) of a completed run")
    parser.add_argument("--merged", action="store_true", help="also write merged/: base + adapter merged (safetensors)")
    parser.add_argument("--out", help="export folder (default: <run>/export)")
    parser.add_argument("--sample", type=int, help="reload check on the first N evaluation batches only (default: all)")
    parser.add_argument("--device", help="device of the merge and the reload check (default: cpu unless the run used CUDA)")
    parser.add_argument("--memory", type=float, metavar="GIB", help="memory the export may use (default: the device's free memory)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                        help="dtype of the merge and merged/ (default: the 4-bit compute dtype for qlora, else the "
                        "training weights'); a 16-bit merge of a float32 run halves its memory")
    parser.set_defaults(func=commands.cmd_export)


def _add_plan(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plan", help="phases, variants, cost and checkpoint interval of a rental")
    add = parser.add_argument
    add("card", help="the experiment card (params/*.yaml)")
    add("--days", type=float, required=True, help="rental length in days (3, 7 or 30; any positive number)")
    add("--price-per-hour", type=float, help="rental price per hour (default: the card's budget.price_per_gpu_hour)")
    add("--speedup", type=float, default=1.0, help="the rental is X times faster than the measured machine (default 1)")
    add("--margin", type=float, default=0.15, help="fraction of the rental kept free (default 0.15)")
    add("--max-loss-minutes", type=float, default=15.0, help="most work an interruption may lose (default 15)")
    add("--max-loss-fraction", type=float, default=0.01, help="… and as a fraction of the rental (default 0.01)")
    add("--continuation", type=float, default=2.0, help="continuation run, in units of the card's steps (default 2)")
    add("--grid", nargs="+", help="plan a campaign over these variant cards (files or a folder of *.yaml)")
    add("--spread", type=float, help="campaign: the range of gains the variants may span (default 2 × min_improvement)")
    add("--setup-hours", type=float, default=1.0, help="campaign: machine set-up, assumed (default 1)")
    parser.set_defaults(func=commands.cmd_plan)


def _add_estimate(sub: argparse._SubParsersAction) -> None:
    from labkit.preflight.gpus import GPUS  # light: the GPU catalogue and the layouts' ids (no torch)
    from labkit.preflight.records import LAYOUTS

    parser = sub.add_parser("estimate", help="a card's training-step memory and fit verdict on a GPU of a given "
                            "memory, before renting it (offline, no weights)")
    add = parser.add_argument
    add("card", help="the experiment card (params/*.yaml)")
    gpu = parser.add_mutually_exclusive_group(required=True)
    gpu.add_argument("--gpu", metavar="NAME", help="a GPU by name: " + ", ".join(GPUS) + " (its memory and capability)")
    gpu.add_argument("--gpu-memory", type=float, metavar="GIB", help="the GPU's memory in GiB (16 for a T4)")
    add("--capability", help="CUDA compute capability: 7.5 T4, 8.0 A100, 9.0 H100 (default: the --gpu's, else 8.0)")
    add("--processes", type=int, metavar="N", help="processes in all, over every machine (default: the card's "
        "distributed.num_processes)")
    add("--machines", type=int, metavar="M", help="machines (default: the card's distributed.num_machines)")
    add("--strategy", choices=LAYOUTS[1:], help="how the processes share the model (default: the card's; ddp "
        "for a card of one process given --processes)")
    add("--seq-len", type=int, help="tokens per row (default: the card's data.max_length)")
    add("--config", help="the model's config.json (default: configs/<org>--<name>.json next to the card, the hub "
                         "cache, or the local model folder)")
    parser.set_defaults(func=commands.cmd_estimate)


def _add_launch(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("launch", help="write the files that start a card's run where GPUs are rented: a SkyPilot "
                            "task, a Slurm script or per-machine torchrun commands (docs/launch.md)")
    add = parser.add_argument
    add("card", help="the experiment card (params/*.yaml)")
    add("--on", required=True, choices=("skypilot", "slurm", "torchrun"), help="where the run starts")
    add("--gpu", help="the GPU (T4, A10G, L4, L40S, A100, A100-80GB, H100, H200, B200); refused when labkit "
                      "estimate says the step does not fit (default: the smallest that fits)")
    add("--out", help="the folder to write (default: launch/<experiment>-<variant>-<on>/ in the project)")
    add("--runs-mount", metavar="PATH", help="the shared runs folder as every machine sees it (default: /labkit-runs "
                                              "for SkyPilot, the project's runs folder for Slurm and torchrun)")
    add("--bucket", default="labkit-runs-change-me", help="SkyPilot: the bucket mounted as the runs folder "
                                                         "(a name of yours; created when missing)")
    add("--wheel", help="SkyPilot: the labkit wheel installed on the machines (default: dist/labkit-<version>-py3-"
                        "none-any.whl, written by python -m build --wheel)")
    add("--head", metavar="ADDRESS", help="torchrun: the head machine's address (default: each script asks for "
                                          "MASTER_ADDR)")
    add("--run-id", help="torchrun: the run id every machine shares (default: <variant>-<UTC time>)")
    add("--cpus-per-node", type=int, help="Slurm: CPUs per machine (default 8 per GPU)")
    add("--time-minutes", type=int, help="Slurm: the time limit (default: the card's budget x 1.5 + 30)")
    parser.set_defaults(func=commands.cmd_launch)


def _completion(args: argparse.Namespace) -> int:
    """`labkit completion bash|zsh|tcsh`: the shell completion script (shtab), printed for the shell to load."""
    import shtab

    print(shtab.complete(build_parser(), shell=args.shell))
    return 0


def _add_setup(sub: argparse._SubParsersAction) -> None:
    init = sub.add_parser("init", help="copy the stage notebooks and the example cards into a working folder "
                          "(never overwrites a file)")
    init.add_argument("dir", nargs="?", default=".", help="the working folder (default: the current one)")
    init.set_defaults(func=commands.cmd_init)
    completion = sub.add_parser("completion", help="print the shell completion script: "
                                "eval \"$(labkit completion bash)\"")
    completion.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    completion.set_defaults(func=_completion)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `labkit` command.

    Returns:
        the parser; each subcommand sets `func`, a function of `labkit.cli.commands`.
    """
    parser = argparse.ArgumentParser(prog="labkit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"labkit {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--runs", help="runs folder (default: $LABKIT_RUNS or <project>/runs)")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run every stage of each card through papermill, archived")
    run.add_argument("cards", nargs="*", help="experiment cards (params/*.yaml)")
    run.add_argument("--resume", metavar="RUN_ID", help="continue an interrupted or failed run from its first unfinished "
                     "stage (training from its newest checkpoint), in this process")
    run.add_argument("--restart-training", action="store_true", help="with --resume: when training ran before but no "
                     "usable checkpoint is left, start it again from step 1 (the earlier history is kept beside it)")
    run.add_argument("--run-id", metavar="ID", help="the new run's id (default: variant-time-hash); when run ID exists "
                     "and is not completed, it is resumed (the same command again after a machine was lost); the head "
                     "of a run on several machines")
    run.add_argument("--join", metavar="ID", help="on a machine other than the head (rank from NODE_RANK, "
                     "SLURM_NODEID or SKYPILOT_NODE_RANK): join run ID's training (a run id or folder) in the shared "
                     "runs folder, waiting up to LABKIT_JOIN_TIMEOUT seconds (600) for it and for the head")
    run.add_argument("--notebooks", help="folder of the stage notebooks (default: <project>/notebooks)")
    run.set_defaults(func=commands.cmd_run)
    check = sub.add_parser("check", help="every check that needs only the card: parent, diff, data section, model "
                           "source, the experiment's protocol (writes nothing; exit 2 on any error)")
    check.add_argument("cards", nargs="+", help="experiment cards (params/*.yaml)")
    check.add_argument("--data", action="store_true", help="also prepare the data in memory with the model's "
                       "tokenizer and run stage 01's checks (references in every split, truncation, EOS); no run")
    check.set_defaults(func=commands.cmd_check)
    stage = sub.add_parser("stage", help="run one stage notebook of a card")
    stage.add_argument("name", choices=STAGES)
    stage.add_argument("card")
    stage.add_argument("--run", help="an existing run folder to run the stage in (default: a new run)")
    stage.add_argument("--restart-training", action="store_true", help="with --run, stage training: start training "
                       "again from step 1 when it ran before but no usable checkpoint is left (history kept beside it)")
    stage.add_argument("--notebooks")
    stage.set_defaults(func=commands.cmd_stage)
    runs = sub.add_parser("runs", help="the registry as a table (every run, failed and interrupted too)")
    runs.add_argument("experiment", nargs="?")
    runs.add_argument("--follow", metavar="RUN", help="print a running run's progress until it ends (`latest`, a run id, a unique prefix of one, or the folder; "
                      "exit 0 when it completed, 1 when it failed or was interrupted)")
    runs.add_argument("--json", action="store_true", help="print the runs as one JSON document (a list: the table's "
                      "columns and machine-friendly ones: state, stages_done, metric, baseline, tuned, decision, dir…)")
    runs.set_defaults(func=commands.cmd_runs)
    invalidate = sub.add_parser("invalidate", help="mark a run invalid, with the reason (it stays in the registry)")
    invalidate.add_argument("run", help="run id (or run folder)")
    invalidate.add_argument("--why", required=True, help="the reason, kept with the run")
    invalidate.set_defaults(func=commands.cmd_invalidate)
    compare = sub.add_parser("compare", help="compare every run of an experiment (bootstrap intervals, paired per "
                             "example, protocol check) and write its HTML report")
    compare.add_argument("experiment", help="the experiment id (experiment.id of its cards)")
    compare.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    compare.set_defaults(func=commands.cmd_compare)
    _add_final(sub)
    _add_export(sub)
    _add_plan(sub)
    _add_estimate(sub)
    _add_launch(sub)
    _add_setup(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `labkit` console script.

    Args:
        argv: the arguments (default: sys.argv[1:]).
    Returns:
        the exit status (see the module docstring).
    """
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("LABKIT_DEBUG") == "1"
    # this process trains nothing: bitsandbytes' import-time notice about an optional CPU kernel (printed when the
    # report or the export imports the model layer) is not the user's concern here; stage kernels log it to the run
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    quiet_unactionable()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("labkit: interrupted (recorded in the registry)", file=sys.stderr)
        return 130
    except LabkitError as exc:
        if debug:
            traceback.print_exc()
        print(f"labkit: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception:  # noqa: BLE001 - a bug: keep the traceback
        traceback.print_exc()
        return 2


if __name__ == "__main__":
    sys.exit(main())
