"""Capture the environment of a run (env.json), with secrets kept out."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

import labkit

# torch takes seconds to import: imported inside the functions that use them, so `labkit` commands and card checks
# start fast

SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.I)
PACKAGES = ("torch", "transformers", "peft", "trl", "accelerate", "bitsandbytes", "datasets", "tokenizers",
            "papermill", "pydantic", "gguf", "numpy")
ENV_KEEP = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "HF_HUB_OFFLINE",
            "TRANSFORMERS_OFFLINE", "LABKIT_CACHE", "LABKIT_RUNS", "WORLD_SIZE", "LOCAL_RANK")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable name looks like it holds a secret."""
    return bool(SECRET.search(name))


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
    import torch

    info: dict[str, Any] = {"cuda_available": torch.cuda.is_available(), "cuda": torch.version.cuda,
                            "hip": getattr(torch.version, "hip", None),
                            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                            "devices": []}
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            info["devices"].append({"name": props.name, "memory_gib": round(props.total_memory / 2**30, 2),
                                    "capability": f"{props.major}.{props.minor}"})
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            info["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, IndexError):
            info["driver"] = None
    return info


def capture() -> dict[str, Any]:
    """The environment as data: python, platform, accelerators, library versions, pip freeze.

    Returns:
        a JSON-ready dict; environment variables whose names look secret are never included.
    """
    import torch

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
        "distributed": {"world_size": int(os.environ.get("WORLD_SIZE", "1")), "backend": None},
        "pip_freeze": freeze,
    }
