"""The checks a card passes before a run folder exists: one `check_card`, for `labkit check`, `run`, `stage` and a
notebook opened by hand (`labkit.stages.context.open_stage`).

It needs only the card and the runs root (the experiment's protocol): no network, no model, no torch — `labkit check
CARD` imports this module, and nothing here imports torch or transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labkit.card.load import LoadedCard
from labkit.core.protocol import check_protocol
from labkit.data.card_checks import check_card_data
from labkit.errors import ModelSourceError
from labkit.model.source_spec import check_source


def check_card(loaded: LoadedCard, root: Path) -> dict[str, Any]:
    """Every check that needs only the card, before a run folder exists.

    Args:
        loaded: the loaded card.
        root: the runs root (the experiment's protocol).
    Returns:
        the protocol changes against the experiment's reference run (empty when it follows the protocol).
    Raises:
        CardError, ModelSourceError: one line naming the file, line, key and the fix.
    """
    check_card_data(loaded)
    model = loaded.card.model
    try:
        check_source(model.source, model.revision)
    except ModelSourceError as exc:
        key = "model.revision" if str(exc).startswith("model.revision") else "model.source"
        raise ModelSourceError(f"{loaded.where(key)}: {exc}") from None
    return check_protocol(loaded.resolved, root, str(loaded.path))
