"""glibc's allocator settings a process measures or trains with, and returning freed pages to the OS.

Resident memory is what the CPU's memory measurement reads (`labkit.preflight.measure`): with glibc's default
thresholds freed tensors stay in its heap and resident memory overstates live data. These helpers need only ctypes,
so a stage that never trains can set them when it opens without importing the training stack.
"""

from __future__ import annotations

import ctypes
import gc


def trim() -> None:
    """Return freed heap pages to the OS (glibc), so resident memory reflects live data."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def release_promptly() -> bool:
    """Have glibc serve blocks of 64 KiB and more with mmap, so freed tensors leave the process at once.

    By default glibc raises its mmap threshold after the first large free and keeps later blocks in
    its heap, where freed memory stays resident; resident memory then overstates live tensors. Call it
    before the process allocates much (stage 03 does it when it opens): set after a training step, the
    heap that step left behind still inflates later measurements.

    Returns:
        whether the allocator accepted the settings (False off glibc).
    """
    return _thresholds(mmap=1 << 16, trim=1 << 16)


def fast_allocator() -> bool:
    """Undo `release_promptly` for timing: glibc's mmap and trim thresholds as its dynamic rule leaves them once a
    process has freed large blocks (32 MiB and 64 MiB), the setting a training process runs with.

    With the 64 KiB threshold every activation is a fresh mmap whose pages fault in zeroed: correct memory figures,
    but a step about 1.5 times slower on the CPU than in stage 04 (measured on the quickstart model).

    Returns:
        whether the allocator accepted the settings (False off glibc).
    """
    return _thresholds(mmap=32 << 20, trim=64 << 20)


def _thresholds(mmap: int, trim: int) -> bool:
    """Set glibc's M_MMAP_THRESHOLD and M_TRIM_THRESHOLD (bytes); False where there is no glibc or it refuses."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, mmap)) and bool(libc.mallopt(-1, trim))
    except (OSError, AttributeError):
        return False
