"""labkit: a notebook-centred lab workbook for fine-tuning open LLMs with the rigour of an experiment.

The Python API for notebook cells (docs/python-api.md) — `labkit.run(card)`, `labkit.stage(name, card)`,
`labkit.runs()`, `labkit.compare(experiment)` — is loaded on first use, so `import labkit` stays cheap.
"""

import importlib
import os
from typing import Any

__version__ = "0.1.0"

# TRL's trainers report their use to the Hugging Face Hub when built (huggingface_hub's send_telemetry).
# A lab run makes no network call it was not asked for: off unless the user sets the variable themselves.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

# name -> the module of labkit.api that holds it (imported when the name is first used)
_API = {"run": "labkit.api.notebook", "stage": "labkit.api.notebook", "runs": "labkit.api.registry",
        "compare": "labkit.api.comparison", "Comparison": "labkit.api.comparison"}
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    """`labkit.run`, `labkit.stage`, `labkit.runs`, `labkit.compare`: imported from labkit.api on first use."""
    if name in _API:
        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
