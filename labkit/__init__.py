"""labkit: a notebook-centred lab workbook for fine-tuning open LLMs with the rigour of an experiment."""

__version__ = "0.1.0"
