"""Heartbeats: tell a run whose process died (SIGKILL, machine gone) from one that is still running.

Every stage kernel and `labkit run` touch `<run>/heartbeat` every 30 s; `labkit runs` marks a run recorded as
running as interrupted when its process is gone or its heartbeat is stale.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

HEARTBEAT_SECONDS = 30.0


STALE_SECONDS = 300.0  # no heartbeat for this long: the run's process is gone


def beat(run_dir: Path, **fields: Any) -> None:
    """Write the run's heartbeat (time, host, pid and any progress fields), atomically."""
    path = Path(run_dir) / "heartbeat"
    tmp = path.with_name(f".heartbeat.{os.getpid()}")
    tmp.write_text(json.dumps({"time": time.time(), "host": socket.gethostname(), "pid": os.getpid(), **fields}))
    os.replace(tmp, path)


def start_heartbeat(run_dir: Path) -> threading.Event:
    """Beat every HEARTBEAT_SECONDS from a daemon thread until the returned event is set."""
    stop = threading.Event()

    def _loop() -> None:
        while not stop.is_set():
            try:
                beat(run_dir)
            except OSError:
                pass
            stop.wait(HEARTBEAT_SECONDS)

    threading.Thread(target=_loop, daemon=True, name="labkit-heartbeat").start()
    return stop


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_dead(run_dir: Path, status: dict[str, Any]) -> str | None:
    """Why a run recorded as running has no live process, or None when it may be alive.

    Args:
        run_dir: the run folder.
        status: its status.json.
    Returns:
        a reason ("process 123 is gone", "no heartbeat for 12 min") or None.
    """
    path = Path(run_dir) / "heartbeat"
    beat_info = json.loads(path.read_text()) if path.exists() else {}
    last = beat_info.get("time") or status.get("heartbeat") or 0
    pid, host = status.get("pid"), status.get("host")
    if status.get("mode") == "batch" and pid and host == socket.gethostname() and not process_alive(int(pid)):
        return f"process {pid} is gone (killed, or the machine restarted)"
    age = time.time() - float(last)
    if status.get("mode") == "batch" and age > STALE_SECONDS:
        return f"no heartbeat for {age / 60:.0f} min"
    return None
