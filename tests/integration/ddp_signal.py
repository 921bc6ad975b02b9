"""Worker of test_distributed's signal test, run on every process of `accelerate launch` (2 CPU processes, gloo): a
SIGTERM reaches process 0 while it waits in the stop agreement's all-reduce at step 1; each process writes the stop
decisions `InterruptStop` made at steps 1 and 2 to OUT/rank<N>.json.

Usage: accelerate launch --config_file CONFIG tests/integration/ddp_signal.py OUT
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from accelerate import PartialState
from transformers import TrainerControl, TrainerState

from labkit.train.callbacks import InterruptStop
from labkit.train.resilience import Interruption


def _signal_inside_the_all_reduce(marker: Path) -> None:
    """Process 0: SIGTERM to itself once its main thread is inside torch.distributed's all_reduce, then the marker
    that lets process 1 enter it (so the all-reduce cannot finish before the signal is there)."""
    main = threading.main_thread().ident
    while (frame := sys._current_frames().get(main)) is None or frame.f_code.co_name != "all_reduce":
        time.sleep(0.002)
    os.kill(os.getpid(), signal.SIGTERM)
    marker.touch()


def main(out: Path) -> None:
    rank = PartialState(cpu=True).process_index  # the process group: gloo, as labkit's CPU workers get it
    interruption = Interruption()
    stop = InterruptStop(interruption)
    marker = out / "signalled"
    decisions = []
    with interruption.held():
        if rank == 0:
            threading.Thread(target=_signal_inside_the_all_reduce, args=(marker,), daemon=True).start()
        else:
            while not marker.exists():
                time.sleep(0.01)
        for step in (1, 2):
            control = stop.on_step_end(None, TrainerState(global_step=step, max_steps=10), TrainerControl())
            decisions.append(control.should_training_stop)
    (out / f"rank{rank}.json").write_text(json.dumps({"decisions": decisions, "signal": interruption.signal,
                                                      "report": interruption.report(out, "RUN")}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
