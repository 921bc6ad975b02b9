"""glibc's thresholds as `labkit.core.allocator` sets them, seen in a fresh process's resident memory."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")

PROBE = """
import json, os, sys
from labkit.core import allocator

accepted = getattr(allocator, sys.argv[1])()
page = os.sysconf("SC_PAGE_SIZE")
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
blocks = [bytearray(100 << 10) for _ in range(400)]  # 40 MiB in 100 KiB blocks, every page touched
before = resident()
del blocks[::2]  # every other block freed: a heap cannot give these back, an mmap'd block leaves at once
print(json.dumps({"accepted": accepted, "released_mib": (before - resident()) / 2**20}))
"""


def released(setting: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, setting], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_release_promptly_returns_freed_blocks_and_fast_allocator_keeps_them():
    prompt, fast = released("release_promptly"), released("fast_allocator")
    assert prompt["accepted"] and fast["accepted"]
    assert prompt["released_mib"] > 15, prompt  # 200 blocks of 100 KiB unmapped as they are freed
    assert fast["released_mib"] < 5, fast  # the same blocks kept in the heap, as a training process keeps them
