"""The worker processes labkit starts itself; not for direct use.

- `python -m labkit.cli.worker train RUN_DIR`: one process of stage 04's `accelerate launch`
  (`labkit.stages.training`); every process builds the same trainer on its own device.
- `python -m labkit.cli.worker reload-check EXPORT_DIR [--run RUN_DIR] [--sample N] [--device D]`: the
  reload check of an export in a fresh process (`labkit.export.reload_check`), writing
  EXPORT_DIR/reload_check.json; exit code 0 when it passes, 1 when it does not. Its stdout is the export's to keep;
  on stderr (the export's terminal) it prints one progress line per phase (`labkit.core.progress.echo_to`), and the
  libraries' log records and warnings go to the run's `logs/libraries.log`, not to the terminal.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
import warnings
from pathlib import Path

from labkit.core import io, progress
from labkit.core.kernel import log_libraries_to, plain_bars

# the model libraries are imported inside the functions (the command line's rule): the reload check routes their
# log records before they load, as some log while they load (bitsandbytes' CPU kernel notice)


def _train(args: argparse.Namespace) -> int:
    from labkit.card.load import load_card
    from labkit.core.runs import Run
    from labkit.stages.context import Stage
    from labkit.stages.training import record_rendezvous, train
    from labkit.train.process_state import prepare

    run = Run(Path(args.run_dir).resolve())
    loaded = load_card(run.card_path)
    stage = Stage("training", loaded, run, interactive=False)
    # the process group (and FSDP's environment or ZeRO-3's DeepSpeed config) before the model loads, so loading
    # shards: FSDP rank 0 loads, the other ranks hold meta parameters; ZeRO-3 partitions at init
    state = prepare(loaded.card, stage.device)
    if loaded.card.distributed.num_machines > 1 and state.is_main_process:
        record_rendezvous(stage, state.num_processes)  # every machine's processes met (stage 04 reads it on failure)
    if stage.device == "cuda":
        stage.device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"  # each process loads onto its own GPU
    train(stage)
    return 0


def quiet_libraries() -> None:
    """`labkit export`'s own process (the merge): no library progress bars, deprecation warnings or log records
    below errors on the terminal, which shows labkit's lines and the reload check's phases."""
    import transformers.utils.logging

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("bitsandbytes", "peft", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _quiet_check(export_dir: Path, run_dir: str | None) -> None:
    """The reload check's terminal: its phases on stderr, the libraries' messages in the run's log, bars on stdout
    (which the export keeps to itself)."""
    os.environ["LABKIT_STAGE"] = "export"
    progress.echo_to(lambda line: print(line, file=sys.stderr, flush=True))
    plain_bars()  # before transformers binds tqdm.auto
    manifest = export_dir / "export.json"
    run = run_dir or (io.read_json(manifest).get("run_dir") if manifest.exists() else None)
    if not (run and Path(run).is_dir()):
        quiet_libraries()
        return
    log_libraries_to(Path(run).resolve(), "export")  # before the libraries load and log
    import transformers.utils.logging

    transformers.utils.logging.get_logger()  # its stderr handler is added on first use: now, so it can be removed
    log_libraries_to(Path(run).resolve(), "export")


def _reload_check(args: argparse.Namespace) -> int:
    export_dir = Path(args.export_dir).resolve()
    _quiet_check(export_dir, args.run)
    from labkit.export.reload_check import check, summary

    try:
        report = check(export_dir, Path(args.run) if args.run else None, args.sample, args.device)
    except Exception as exc:  # noqa: BLE001 - a check that cannot run is a failed check, with the reason
        traceback.print_exc()
        first = str(exc).splitlines()[0] if str(exc) else ""
        report = {"ok": False, "identical": False, "error": f"{type(exc).__name__}: {first}", "time": io.utc_now()}
    io.write_json(export_dir / "reload_check.json", report)
    print(("reload check passed: " if report["ok"] else "reload check FAILED: ") + summary(report))
    return 0 if report["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    """Run one worker.

    Args:
        argv: the arguments (default: sys.argv[1:]).
    Returns:
        the exit status.
    """
    parser = argparse.ArgumentParser(prog="python -m labkit.cli.worker", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="worker", required=True)
    train_parser = sub.add_parser("train", help="one training process of an accelerate launch")
    train_parser.add_argument("run_dir")
    train_parser.set_defaults(func=_train)
    reload_parser = sub.add_parser("reload-check", help="the reload check of an export")
    reload_parser.add_argument("export_dir")
    reload_parser.add_argument("--run", help="the run folder (default: the folder holding EXPORT_DIR, as `<run>/export` is)")
    reload_parser.add_argument("--sample", type=int, help="check only the first N evaluation batches (whole batches)")
    reload_parser.add_argument("--device", help="cpu, cuda or mps (default: cpu unless the run used CUDA)")
    reload_parser.set_defaults(func=_reload_check)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
