"""The checks of a card's data section that need only the card: split fractions, stratification, hub pins, labels.

`labkit check`, `labkit run` and an interactive stage's first `open_stage` run them before a run folder exists. They
import neither the tokenizer's nor the data's libraries, so `labkit check` stays fast; the checks on prepared rows
are `labkit.data.checks`.
"""

from __future__ import annotations

from labkit.card.load import LoadedCard
from labkit.core import hub
from labkit.errors import CardError

MIN_TRAIN_FRACTION = 0.2  # validation + test may take at most 80 % of the rows


def check_card_data(loaded: LoadedCard) -> None:
    """The checks of the data section that need only the card.

    Args:
        loaded: the loaded card (its `where` names the line of a key).
    Raises:
        CardError: one line naming the file, line, key and the fix.
    """
    data = loaded.card.data
    spec, fields, fmt = data.split, data.fields, data.target_format
    if not spec.field and spec.from_source is None:
        left = 1 - spec.validation - spec.test
        if left < MIN_TRAIN_FRACTION - 1e-9:
            raise CardError(f"{loaded.where('data.split.validation')}: data.split: validation {spec.validation} + test "
                            f"{spec.test} leave {left:.2f} of the rows for training (at least {MIN_TRAIN_FRACTION} "
                            "needed); lower data.split.validation or data.split.test")
        if spec.stratify is not None and spec.stratify != "category":
            raise CardError(f"{loaded.where('data.split.stratify')}: data.split.stratify: {spec.stratify!r} is not a "
                            "mapped field: use 'category' (the column data.fields.category maps) or null")
        if spec.stratify == "category" and not fields.category:
            raise CardError(f"{loaded.where('data.split.stratify')}: data.split.stratify: 'category' but "
                            "data.fields.category is null (nothing to stratify by): map a category column or set "
                            "stratify: null")
    if hasattr(data.source, "hf"):
        hub.check_pin("data.source.revision", data.source.revision, CardError, loaded.where("data.source.revision"))
    if fmt.labels is not None and fmt.kind != "label":
        raise CardError(f"{loaded.where('data.target_format.labels')}: data.target_format.labels: only for kind: label "
                        f"(this card's kind is {fmt.kind}); remove it")
    if fmt.labels is not None and not fmt.labels:
        raise CardError(f"{loaded.where('data.target_format.labels')}: data.target_format.labels: empty; list the "
                        "labels, or remove the key to use the labels seen in the training split")
