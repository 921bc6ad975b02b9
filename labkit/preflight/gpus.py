"""The GPUs people rent, by name: their memory and compute capability, for sizing a card before renting one.

`labkit estimate CARD --gpu L4` and `labkit launch … --gpu L4` name a GPU instead of giving its memory. The memory
is what `torch.cuda.get_device_properties(0).total_memory` reports on one (GiB, rounded down to 0.1): less than the
marketing figure (ECC and the driver's reservation), as commonly reported for each model; an unlisted GPU is sized
with `--gpu-memory GIB --capability X.Y`.
"""

from __future__ import annotations

from typing import NamedTuple

from labkit.errors import UsageError


class Gpu(NamedTuple):
    """One rentable GPU model: its name as clouds list it, memory of one device (GiB) and CUDA capability."""

    name: str
    memory_gib: float
    capability: str


GPUS = {g.name: g for g in (
    Gpu("T4", 14.7, "7.5"),
    Gpu("L4", 22.0, "8.9"),
    Gpu("A10G", 22.0, "8.6"),
    Gpu("L40S", 44.4, "8.9"),
    Gpu("A100", 39.4, "8.0"),  # the 40 GB A100
    Gpu("A100-80GB", 79.1, "8.0"),
    Gpu("H100", 79.1, "9.0"),
    Gpu("H200", 139.8, "9.0"),
    Gpu("B200", 178.4, "10.0"),
)}


def gpu_named(name: str) -> Gpu:
    """The catalogue entry of a GPU name, case-insensitively ("l4" → L4).

    Args:
        name: a GPU name (`GPUS`).
    Returns:
        the `Gpu`.
    Raises:
        UsageError: an unknown name (the message lists the known ones and the alternative flags).
    """
    found = {k.lower(): g for k, g in GPUS.items()}.get(name.strip().lower())
    if found is None:
        raise UsageError(f"--gpu {name}: not a GPU labkit knows ({', '.join(GPUS)}); give --gpu-memory GIB "
                        "--capability X.Y instead")
    return found
