"""labkit: a notebook-centred lab workbook for fine-tuning open LLMs with the rigour of an experiment."""

import os

__version__ = "0.1.0"

# TRL's trainers report their use to the Hugging Face Hub when built (huggingface_hub's send_telemetry).
# A lab run makes no network call it was not asked for: off unless the user sets the variable themselves.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
