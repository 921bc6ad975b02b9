"""Capture the environment of a run (env.json), with secrets kept out."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import torch

import labkit
from labkit.core.device import capture as device_capture
from labkit.core.device import gpu_driver
from labkit.core.secrets import is_secret_name


PACKAGES = ("torch", "transformers", "peft", "trl", "accelerate", "bitsandbytes", "datasets", "tokenizers",
            "papermill", "pydantic", "gguf", "numpy")
ENV_KEEP = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "HF_HUB_OFFLINE",
            "TRANSFORMERS_OFFLINE", "LABKIT_CACHE", "LABKIT_RUNS", "WORLD_SIZE", "LOCAL_RANK", "ROCR_VISIBLE_DEVICES",
            "NCCL_DEBUG", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")


def _version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _accelerators() -> dict[str, Any]:
    profile = device_capture()
    info: dict[str, Any] = {"cuda_available": torch.cuda.is_available(), "cuda": torch.version.cuda,
                            "hip": getattr(torch.version, "hip", None),
                            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                            "type": profile.type, "native_bf16": profile.native_bf16,
                            "nccl": profile.nccl, "devices": []}  # nccl: RCCL's version on ROCm
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            uuid = getattr(props, "uuid", None)
            info["devices"].append({
                "name": props.name, "memory_gib": round(props.total_memory / 2**30, 2),
                "capability": f"{props.major}.{props.minor}",
                "arch": getattr(props, "gcnArchName", None) if profile.type == "rocm" else f"sm_{props.major}{props.minor}",
                "uuid": str(uuid) if uuid is not None else None, "multiprocessors": props.multi_processor_count})
        driver = gpu_driver(profile)  # nvidia-smi on CUDA; amd-smi, else rocm-smi, on ROCm
        info.update(driver=driver["driver"], driver_tool=driver["tool"], mig_mode=driver["mig_mode"], mig=profile.mig)
    return info


def _distributed() -> dict[str, Any]:
    """World size and the process group's backend (the one in use, else the one a launch would use)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return {"world_size": dist.get_world_size(), "backend": str(dist.get_backend()), "initialized": True}
    planned = None if world == 1 else ("nccl" if torch.cuda.is_available() else "gloo")  # accelerate's defaults
    return {"world_size": world, "backend": planned, "initialized": False,
            "local_rank": int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else None}


def capture() -> dict[str, Any]:
    """The environment as data: python, platform, accelerators, library versions, pip freeze.

    Returns:
        a JSON-ready dict; environment variables whose names look secret are never included.
    """
    freeze = sorted(f"{d.metadata['Name']}=={d.version}" for d in md.distributions() if d.metadata.get("Name"))
    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 2),
        "accelerators": _accelerators(),
        "packages": {name: _version(name) for name in PACKAGES},
        "labkit": {"version": labkit.__version__, "git_commit": _git_commit()},
        "environment": {k: os.environ[k] for k in ENV_KEEP if k in os.environ and not is_secret_name(k)},
        "distributed": _distributed(),
        "pip_freeze": freeze,
    }
