"""What `labkit check --data CARD` adds to the card's checks: stage 01's preparation in memory with the model's
tokenizer, and the card's method applied to the model's config on the meta device — one line each, nothing written.

`labkit run` applies the same method check before it creates a run (`labkit.cli.runner.load_all`); here it also says
what the method trains, so a card's reach is read before anything is spent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labkit.card.load import LoadedCard
from labkit.core.protocol import pin_card, pinned
from labkit.data.prepare import checked_splits
from labkit.data.sources import rule_text
from labkit.model.loading import load_tokenizer
from labkit.model.sources import resolve
from labkit.preflight.records import MethodCheck
from labkit.preflight.sizing import check_method


def data_line(loaded: LoadedCard, root: Path) -> str:
    """Stage 01's preparation in memory (model source resolved for its tokenizer); writes no run.

    Args:
        loaded: the loaded card.
        root: the runs root (the experiment's reference run pins a `resolve` revision).
    Returns:
        a line of split sizes, the rows cleaning and leakage removed with what removed them (and groups, with
            data.fields.group).
    """
    card = pinned(loaded.card, pin_card(loaded.card, root, loaded.card.experiment.id))  # revision: resolve → the experiment's commit (asked once), not recorded
    tokenizer = load_tokenizer(resolve(card.model.source, card.model.revision, base=loaded.path.parent), card)
    derived, _ = checked_splits(card, tokenizer)
    sizes = {"loaded": derived.rows_loaded, **{name: len(rows) for name, rows in derived.splits.items()}}
    line = ", ".join(f"{k} {v}" for k, v in sizes.items()) + " rows"
    if card.data.fields.group:
        shared = derived.leakage["groups_across_splits"]
        groups = len({r["group"] for rows in derived.splits.values() for r in rows})
        line += f" in {groups} groups ({len(shared) or 'none'} in more than one split"
        if shared:  # the policy is drop_from_train or report here: fail has raised
            rows = sum(g["rows"].get("train", 0) for g in shared)
            line += (f", their {rows} training rows dropped" if card.data.leakage.policy == "drop_from_train"
                     else ", kept: data.leakage.policy is report")
        line += ")"
    removed = derived.rows_loaded - sum(len(rows) for rows in derived.splits.values())
    if removed:  # a rule that removes most of the data shows here, before a run spends anything on what is left
        said = _removals(derived.cleaning, derived.leakage)
        line += f"; {removed} removed" + (f": {', '.join(said)}" if said else "")
    return line + "; every reference and encoding check passes"


def _removals(cleaning: list[dict[str, Any]], leakage: dict[str, Any]) -> list[str]:
    """What removed rows before and after splitting, as "N by RULE": each `data.cleaning` rule that removed any (as
    the card writes it), then the rows `data.leakage` dropped: near-duplicates within a split, and training rows near
    an evaluation row or in a group (data.fields.group) an evaluation split holds too."""
    said = [f"{step['removed']} by {rule_text(step['rule'])}" for step in cleaning if step["removed"]]
    shared = " or share a group with one" if leakage.get("groups_across_splits") else ""
    for key, what in (("dropped_within_split", "duplicates within a split"),
                      ("dropped_from_train", f"training rows that repeat an evaluation row{shared}")):
        if leakage.get(key):
            said.append(f"{len(leakage[key])} by data.leakage ({what})")
    return said


def _count(n: int) -> str:
    """A parameter count as people say it: 1.2B, 4.3M, 12.3k, 812."""
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def method_text(check: MethodCheck | None) -> str:
    """One line on what the method trains, from `check_method`'s record.

    Args:
        check: the record, or None when the method could not be applied here.
    Returns:
        e.g. "lora on llama: 12.3k of 1.2M parameters trainable (1.03 %), in k_proj, q_proj, v_proj".
    """
    if check is None:
        return ("not checked here (a .gguf file, a pypi: model not converted on this machine yet, or a hub model "
                "whose config is not here); stage 03 applies it")
    share = 100 * check["trainable"] / max(1, check["parameters"])
    line = (f"{check['kind']} on {check['architecture']}: {_count(check['trainable'])} of "
            f"{_count(check['parameters'])} parameters trainable ({share:.3g} %)")
    where = [f"{name} (fused)" if name == "experts" and check["experts_adapted"] else name for name in check["adapted"]]
    return line + (f", in {', '.join(where)}" if where and check["kind"] != "full" else "")


def method_line(loaded: LoadedCard) -> str:
    """`check_method` on the card (raises its one-line `MethodError` / `CardError`), as `method_text`'s line."""
    return method_text(check_method(loaded))
