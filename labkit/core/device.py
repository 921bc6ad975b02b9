"""The device profile: what the machine a run trains on offers (type, name, count, capability, memory, versions).

Every GPU decision (`labkit.model.placement`) reads a profile, never torch directly, so the decisions for a T4, a
2×T4 box, an A100, an H100 or an MI300X are tested on a CPU by feeding them recorded profiles
(tests/unit/core/profiles/*.json, the same shape as `DeviceProfile.as_dict`).

Native bf16 is decided from the hardware, not from `torch.cuda.is_bf16_supported()`, which also counts emulation
(torch 2.x returns True on a T4, compute capability 7.5, where bf16 is emulated and slow): CUDA compute capability
≥ 8.0 (Ampere and later); on ROCm the CDNA2/CDNA3 architectures (gfx90a = MI200, gfx94x = MI300, gfx95x = MI350).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch


ROCM_BF16_ARCHS = ("gfx90a", "gfx940", "gfx941", "gfx942", "gfx950")


@dataclass(frozen=True)
class DeviceProfile:
    """The accelerators of one machine as the decisions need them.

    Attributes:
        type: "cuda" (NVIDIA), "rocm" (AMD through torch's HIP build), "mps" or "cpu".
        name: the device name as torch reports it ("Tesla T4", "AMD Instinct MI300X", "cpu").
        count: devices visible to this process.
        capability: CUDA compute capability "major.minor" (ROCm builds report one too; not used for decisions).
        arch: the GPU architecture ("sm_75", "gfx942"), None on the CPU.
        memory_gib: memory of one device (GiB), None on the CPU / MPS.
        torch, cuda, hip, nccl: versions (nccl is RCCL's on ROCm).
        uuids: per-device UUIDs where torch reports them; mig: whether a device is a MIG slice.
    """

    type: str
    name: str
    count: int = 1
    capability: str | None = None
    arch: str | None = None
    memory_gib: float | None = None
    torch: str | None = None
    cuda: str | None = None
    hip: str | None = None
    nccl: str | None = None
    uuids: list[str] = field(default_factory=list)
    mig: bool = False

    @property
    def device(self) -> str:
        """The torch device type ("cuda" for NVIDIA and ROCm alike: torch's HIP build uses the cuda namespace)."""
        return "cuda" if self.type in ("cuda", "rocm") else self.type

    @property
    def is_gpu(self) -> bool:
        return self.type in ("cuda", "rocm")

    @property
    def native_bf16(self) -> bool:
        """Whether bf16 runs natively (not emulated): CUDA capability ≥ 8.0, or an MI200/MI300-class ROCm arch."""
        if self.type == "cuda":
            return self.capability is not None and int(self.capability.split(".")[0]) >= 8
        if self.type == "rocm":
            return (self.arch or "").split(":")[0] in ROCM_BF16_ARCHS
        return False

    def describe(self) -> str:
        """One line: "2 × Tesla T4 (cuda, sm_75, 14.6 GiB each)"."""
        if not self.is_gpu:
            return self.name
        each = f", {self.memory_gib:g} GiB each" if self.memory_gib else ""
        return f"{self.count} × {self.name} ({self.type}, {self.arch}{each})"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "native_bf16": self.native_bf16}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DeviceProfile":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def device_kind(device: str | DeviceProfile) -> str:
    """The kind of a device string ("cuda:1" → "cuda", "cpu", "mps") or of a device profile."""
    return device.device if isinstance(device, DeviceProfile) else device.split(":")[0]


def on_cuda(device: str | DeviceProfile) -> bool:
    """Whether `device` is a CUDA (or ROCm) GPU."""
    return device_kind(device) == "cuda"


def load_profile(path: str | Path) -> DeviceProfile:
    """A recorded profile (JSON written from `DeviceProfile.as_dict`)."""
    return DeviceProfile.from_dict(json.loads(Path(path).read_text()))


def cpu_profile() -> DeviceProfile:
    """The profile of a machine that trains on its CPU."""
    return DeviceProfile(type="cpu", name="cpu", count=1, torch=torch.__version__)


def _nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def capture(device: str | None = None) -> DeviceProfile:
    """The profile of this machine (CUDA / ROCm GPU, else Apple MPS, else CPU).

    Args:
        device: "cpu" to profile the CPU even where a GPU is present; None to pick the best device.
    Returns:
        the device profile.
    """
    if device == "cpu" or (device is None and not torch.cuda.is_available()):
        mps = getattr(torch.backends, "mps", None)
        if device is None and mps is not None and mps.is_available():
            return DeviceProfile(type="mps", name="mps", count=1, torch=torch.__version__)
        return cpu_profile()
    if device == "mps":
        return DeviceProfile(type="mps", name="mps", count=1, torch=torch.__version__)
    hip = getattr(torch.version, "hip", None)
    props = torch.cuda.get_device_properties(0)
    uuids = []
    for i in range(torch.cuda.device_count()):
        uuid = getattr(torch.cuda.get_device_properties(i), "uuid", None)
        if uuid is not None:
            uuids.append(str(uuid))
    arch = getattr(props, "gcnArchName", None) if hip else f"sm_{props.major}{props.minor}"
    return DeviceProfile(
        type="rocm" if hip else "cuda", name=props.name, count=torch.cuda.device_count(),
        capability=f"{props.major}.{props.minor}", arch=arch, memory_gib=round(props.total_memory / 2**30, 2),
        torch=torch.__version__, cuda=torch.version.cuda, hip=hip, nccl=_nccl_version(), uuids=uuids,
        mig="MIG" in props.name or any(u.startswith("MIG-") for u in uuids))


def gpu_driver(profile: DeviceProfile) -> dict[str, Any]:
    """The driver as the vendor's tool reports it: nvidia-smi on CUDA, amd-smi (else rocm-smi) on ROCm.

    Returns:
        {"tool", "driver", "mig_mode"} (values None where the tool is missing or says nothing).
    """
    tools = {"cuda": [["nvidia-smi", "--query-gpu=driver_version,mig.mode.current", "--format=csv,noheader"]],
             "rocm": [["amd-smi", "version"], ["rocm-smi", "--showdriverversion"]]}.get(profile.type, [])
    for command in tools:
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode != 0 or not out.stdout.strip():
            continue
        first = out.stdout.strip().splitlines()[0]
        if profile.type == "cuda":
            driver, _, mig = first.partition(",")
            return {"tool": command[0], "driver": driver.strip(), "mig_mode": mig.strip() or None}
        return {"tool": command[0], "driver": " ".join(out.stdout.split())[:200], "mig_mode": None}
    return {"tool": None, "driver": None, "mig_mode": None}
