"""Save a model and its tokenizer as a plain safetensors folder (what every model source resolves to)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


def save_folder(model: Any, tokenizer: Any, out: Path) -> None:
    """save_pretrained model and tokenizer into `out` atomically (a temporary folder, then a rename).

    Args:
        model: a transformers model.
        tokenizer: its tokenizer.
        out: the target folder (replaced when it exists).
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if os.path.exists(out):
        shutil.rmtree(out)
    tmp.rename(out)
