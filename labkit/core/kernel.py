"""How `labkit run` starts a stage's notebook kernel: plain-text progress bars, and the libraries' log records in the
run's log, both set before the first cell imports a library.

transformers, datasets and huggingface_hub bind `tqdm.auto.tqdm` when they are imported, and some libraries log at
import (bitsandbytes' CPU kernel notice); a notebook widget does not survive in an archived notebook, and stderr shows
there as an error-coloured block. The runner starts each kernel with `start_line` (IPython's `exec_lines`), which
imports nothing heavy; the stage's `open_stage` captures the libraries' logs again once they are imported
(`labkit.stages.context.capture_library_logs`). Every labkit process (the CLI, a stage's kernel) hides the libraries'
warnings about their own calls (`quiet_unactionable`).
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path
from typing import Any

import tqdm.auto
import tqdm.std

# the libraries whose log records (weights loading, dropped examples, bitsandbytes' kernel notice) go to the run's log
LIBRARY_LOGGERS = ("transformers", "datasets", "bitsandbytes", "peft", "accelerate", "trl", "torch", "huggingface_hub",
                   "py.warnings")
LOG = "logs/libraries.log"  # under the run folder
# transformers' deprecation of `is_gradient_checkpointing`, which peft and trl read themselves: nothing a user can act on
UNACTIONABLE = (r".*is_gradient_checkpointing.*",)
# PEFT gives a mixture of experts' fused gate/up weight twice the rank (`rank_pattern`/`alpha_pattern`
# `.*\.gate_up_proj`, peft.utils.transformers_weight_conversion), applies it, then warns that the key "matched no
# targeted module" because it compares module names, not the parameters it adapts; a card sets no rank pattern
UNACTIONABLE_RUNTIME = (r"The following (rank|alpha)_pattern keys did not match any targeted module",)


class StdoutTqdm(tqdm.std.tqdm):  # type: ignore[misc]
    """tqdm's plain-text bar, on stdout (stderr renders as an error-coloured block in an archived notebook)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("file", sys.stdout)
        super().__init__(*args, **kwargs)


def plain_bars() -> None:
    """Plain-text progress bars in this process: `tqdm.auto.tqdm` becomes `StdoutTqdm` for every library imported
    afterwards (and for labkit's own bars, which look it up when they start)."""
    tqdm.auto.tqdm = StdoutTqdm


def quiet_unactionable() -> None:
    """Hide, in this process, the warnings the libraries raise about their own calls (`UNACTIONABLE`: FutureWarnings,
    `UNACTIONABLE_RUNTIME`: RuntimeWarnings)."""
    for message in UNACTIONABLE:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)
    for message in UNACTIONABLE_RUNTIME:
        warnings.filterwarnings("ignore", message=message, category=RuntimeWarning)


def log_libraries_to(run_dir: Path, stage: str) -> Path:
    """Send the libraries' log records and Python warnings to the run's `logs/libraries.log` instead of stderr.

    Replaces the handler an earlier call attached and the plain stderr handlers the libraries added themselves.

    Args:
        run_dir: the run folder.
        stage: the stage name (on every line of the log).
    Returns:
        the log file.
    """
    path = Path(run_dir) / LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(f"%(asctime)s {stage} %(name)s %(levelname)s: %(message)s"))
    handler.labkit = True  # type: ignore[attr-defined]
    logging.captureWarnings(True)
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            if getattr(old, "labkit", False) or type(old) is logging.StreamHandler:
                logger.removeHandler(old)
        logger.addHandler(handler)
        logger.propagate = False
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)
    return path


def start(run_dir: str, stage: str) -> None:
    """A stage kernel's first statement under `labkit run`: plain-text bars, library logs to the run's log.

    Args:
        run_dir: the run folder.
        stage: the stage name.
    """
    plain_bars()
    log_libraries_to(Path(run_dir), stage)


def start_line(run_dir: Path, stage: str) -> str:
    """The Python line a stage's kernel runs as it starts (`--IPKernelApp.exec_lines=…`).

    Args:
        run_dir: the run folder.
        stage: the stage name.
    Returns:
        one line of Python calling `start`.
    """
    return f"from labkit.core.kernel import start; start({str(run_dir)!r}, {stage!r})"
