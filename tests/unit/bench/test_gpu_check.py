"""bench/gpu_check.py: without a GPU it says it needs CUDA and exits 0; its dry run exercises every part on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO


def test_without_a_gpu_it_says_so_and_exits_cleanly() -> None:
    out = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and json.loads(out.stdout) == {"benchmark": "gpu_check", "skipped": "needs a CUDA GPU"}
    assert "needs a CUDA (or ROCm) GPU" in out.stderr


@pytest.mark.slow
def test_cpu_dry_run_runs_every_part() -> None:
    out = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--cpu-dry-run"], capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert [m["method"] for m in got["memory"]] == ["lora", "qlora"] and got["packing_check"]["ok"]
    assert set(got["throughput"]["tokens_per_second"]) == {"labkit", "padded", "dynamic"}
