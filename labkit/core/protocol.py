"""The experiment's protocol: the keys every variant of one experiment must share to be comparable.

A variant is comparable with the experiment when its protocol-fixed keys (evaluation procedure, seed, data
version, budget) equal the experiment's reference protocol — the one most of its completed runs share. The
commands that start a run (`labkit run`, `labkit stage`, a notebook opened by hand) call `check_protocol`
before `labkit.core.runs.new_run` creates anything.

Hub commits are fixed too: every run records the commits of its `hf:` model and data set in `pins.json`
(`pin_card`); `revision: resolve` is looked up once, at the experiment's first run, and every later variant
takes the recorded commit, and a variant that names another commit of the same repository changes the protocol.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import yaml

from labkit.card.experiment_and_data import Prompt
from labkit.card.load import card_diff
from labkit.card.schema import Card
from labkit.card.update import updated
from labkit.core import hub, io
from labkit.core import runs as R
from labkit.errors import CardError, DataError, LabkitError, ModelSourceError

PROTOCOL_KEYS = ("eval", "train.seed", "budget", "data")


def card_protocol(card: dict[str, Any]) -> dict[str, Any]:
    """The protocol-fixed keys of a resolved card (a dict as archived in card.yaml), read through this labkit's schema:
    a key added since the card was archived takes its default on both sides, so a newer labkit does not see every
    earlier run of an experiment as a protocol change (as `LoadedCard.hash` leaves defaults out)."""
    try:
        card = Card.model_validate(card).model_dump(mode="json")
    except ValueError:  # a card this schema no longer reads (a key since removed): compared as archived
        pass
    return {"eval": card.get("eval"), "train.seed": (card.get("train") or {}).get("seed"),
            "budget": card.get("budget"), "data": card.get("data"), "base_model": base_model(card)}


def base_model(card: dict[str, Any]) -> str | None:
    """The base model a resolved card names: its model.source, an `hf:` source without its `@commit` (the commit is
    pinned and compared on its own, `pins.json`); None when the card names none."""
    source = (card.get("model") or {}).get("source")
    return (source.partition("@")[0] if source.startswith("hf:") else source) if isinstance(source, str) else None


def rows_version(split_sha256: dict[str, str]) -> str:
    """The version of the rows alone (each split's sha256, no tokens): what variants of different base models share.

    Args:
        split_sha256: {split: sha256 of its rows}, as the data manifest records them.
    Returns:
        12 hex digits.
    """
    return hashlib.sha256(json.dumps(split_sha256, sort_keys=True).encode()).hexdigest()[:12]


def run_protocol(run_dir: Path) -> dict[str, Any]:
    """The protocol of a run: its card's fixed keys, the data version it actually prepared, the version of its rows
    alone with the revision of the model that tokenised them (`other_model`), the version of preference pairs'
    rejected answers (None for an sft run: not compared, see `protocol_changes`) and its hub commits."""
    card = yaml.safe_load((run_dir / "card.yaml").read_text(encoding="utf-8"))
    manifest = run_dir / "data_manifest.json"
    data = io.read_json(manifest) if manifest.exists() else {}
    split = (data.get("split") or {}).get("sha256")
    return {**card_protocol(card), "data_version": data.get("data_version"),
            "rows_version": rows_version(split) if split else None,
            "model_revision": (data.get("tokenizer") or {}).get("model_revision"),
            "preference_version": (data.get("preference") or {}).get("version"), "pins": read_pins(run_dir)}


def other_model(reference: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two runs are of different base models: the revisions of the models that tokenised their data differ
    (when both are known), else their cards name different models (`base_model`: a card checked before its run
    prepared anything). Their data versions differ by the tokens alone, so their rows versions are compared instead,
    and the prompt keys that fit a template (`Prompt.TEMPLATE_FIT`) are not compared."""
    ours, theirs = reference.get("model_revision"), other.get("model_revision")
    if ours and theirs:
        return ours != theirs
    ours, theirs = reference.get("base_model"), other.get("base_model")
    return bool(ours and theirs and ours != theirs)


# where a data file lives is not part of the protocol (another checkout, another path); its content is, through
# the data version that stage 01 records. The rejected answers of preference pairs are the method's extra training
# signal, like the method itself: a dpo/orpo variant evaluates on the same rows as its sft siblings (their data
# version leaves the rejected answers out), and two preference runs are compared on their preference_version. Where a
# conversation's loss falls (data.prompt.loss_on) is a training choice too: the rows and prompts evaluated are the same.
NOT_PROTOCOL = ("data.source.path", "data.fields.rejected", "data.source.revision",  # the commit: see pins
                *(f"data.prompt.{key}" for key in sorted(Prompt.TRAINING_ONLY)))
# where a template takes the system text and the variables it needs (Gemma 2's `system_in: user`, Qwen3's
# `enable_thinking`) fit the same prompt to one model's template, as `chat_template: model` itself does
TEMPLATE_FIT = tuple(f"data.prompt.{key}" for key in sorted(Prompt.TEMPLATE_FIT))


def protocol_changes(reference: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Flat {key: {"reference": a, "run": b}} of the protocol keys that differ (None values are not yet known).

    A variant of another base model (`other_model`) tokenises the same rows its own way: its rows version is compared,
    not its data version, and the prompt keys that fit its template (`TEMPLATE_FIT`) are its own; for the same model
    the data version (rows and tokens) and those keys are compared. Hub commits are compared per repository
    (`_commit_changes`).
    """
    out = {}
    another = other_model(reference, other)
    skip = {"model_revision", "base_model", "pins", "data_version" if another else "rows_version"}
    for key in reference:
        if key in skip or reference[key] is None or other.get(key) is None:
            continue
        for sub, change in card_diff(reference[key], other[key], f"{key}.").items():
            fit = another and any(sub == k or sub.startswith(k + ".") for k in TEMPLATE_FIT)
            if fit or sub in NOT_PROTOCOL or sub.startswith(("data.source.files.", "data.rejected")):
                continue
            out[sub] = {"reference": change["parent"], "run": change["card"]}
    return {**out, **_commit_changes(reference.get("pins"), other.get("pins"))}


def _commit_changes(reference: dict[str, Any] | None, pins: dict[str, Any] | None) -> dict[str, Any]:
    """{"pins.KEY": {"reference", "run"}} where two runs pinned other commits of the same repository; another
    repository (another base model or data set) and how a commit was found (`resolved`) are not compared."""
    out = {}
    for key, pin in (pins or {}).items():
        ref = (reference or {}).get(key)
        if ref and ref["repo"] == pin["repo"] and ref["commit"] != pin["commit"]:
            out[f"pins.{key}"] = {"reference": ref["commit"], "run": pin["commit"]}
    return out


def check_protocol(resolved: dict[str, Any], root: Path, where: str) -> dict[str, Any]:
    """Refuse a new run whose protocol-fixed keys differ from its experiment's reference, unless the card says why.

    Args:
        resolved: the resolved card (LoadedCard.resolved).
        root: the runs root.
        where: the card's path (named in the error).
    Returns:
        the protocol changes (empty when the run follows the protocol, or is the experiment's first).
    Raises:
        CardError: a change without experiment.protocol_change.
    """

    experiment = resolved["experiment"]["id"]
    done = [r for r in experiment_runs(root, experiment) if r["status"] == "completed" and r["has_results"]]
    reference = _reference({r["run_id"]: run_protocol(r["dir"]) for r in done})
    if reference is None:
        return {}
    ref_card = yaml.safe_load((root / experiment / reference / "card.yaml").read_text(encoding="utf-8"))
    changes = protocol_changes(card_protocol(ref_card), card_protocol(resolved))
    changes.update(_pin_changes(read_pins(root / experiment / reference), Card.model_validate(resolved)))
    if changes and not resolved["experiment"].get("protocol_change"):
        listed = "; ".join(f"{k}: {v['reference']} → {v['run']}" for k, v in changes.items())
        raise CardError(f"{where}: changes protocol-fixed key(s) of experiment {experiment!r} against its reference run "
                        f"{reference} ({listed}); its results would not be comparable. Keep them, or set "
                        "experiment.protocol_change: \"why\" to run it anyway (it is then flagged not comparable)")
    return changes


def check_data_version(run: R.Run, version: str, protocol_change: str | None,
                       split_sha256: dict[str, str] | None = None, model_revision: str | None = None) -> None:
    """Refuse data whose version differs from the experiment's reference run, before anything is evaluated on it.

    The card check (`check_protocol`) sees the card only: the same card over a data file with one row changed passes
    it. Stage 01 calls this once the data version is known, before the baseline and before any file is written. A
    variant of another base model than the reference's is held to the same rows (`rows_version`), not the same tokens.

    Args:
        run: the run preparing its data.
        version: the data version it prepared.
        protocol_change: the card's experiment.protocol_change (a stated reason lets the run go on, flagged).
        split_sha256: the sha256 of each split's rows it prepared (None: the data version alone is compared).
        model_revision: the revision of the base model whose tokenizer encoded them.
    Raises:
        DataError: one line with both versions, the reference run and the fix.
    """
    done = [r for r in experiment_runs(run.root, run.experiment)
            if r["status"] == "completed" and r["has_results"] and r["run_id"] != run.run_id]
    protocols = {r["run_id"]: run_protocol(r["dir"]) for r in done}
    reference = _reference(protocols)
    if reference is None or protocol_change:
        return
    ref = protocols[reference]  # read once: the reference is one of the completed runs
    if split_sha256 is not None and other_model(ref, {"model_revision": model_revision}):
        rows = rows_version(split_sha256)
        if ref["rows_version"] and ref["rows_version"] != rows:
            raise DataError(f"{run.card_path}: the rows of the splits ({rows}) differ from {ref['rows_version']}, those "
                            f"of experiment {run.experiment!r}'s reference run {reference} (a row, a cleaning rule or "
                            "the split changed, or a length limit counted in this model's tokens dropped other rows); "
                            "its results would not be comparable: restore the data, or set experiment.protocol_change: "
                            "\"why\" to run it anyway (it is then flagged not comparable)")
        return
    theirs = ref["data_version"]
    if theirs and theirs != version:
        raise DataError(f"{run.card_path}: data version {version} differs from {theirs}, the data of experiment "
                        f"{run.experiment!r}'s reference run {reference} (a row, a cleaning rule, the split or the "
                        "tokenizer changed); its results would not be comparable: restore the data, or set "
                        "experiment.protocol_change: \"why\" to run it anyway (it is then flagged not comparable)")


def _reference(protocols: dict[str, dict[str, Any]]) -> str | None:
    """The run whose protocol most completed runs share (ties: the earliest); variants of different base models share
    one when their rows do (`protocol_changes`)."""
    if not protocols:
        return None
    keys = {rid: json.dumps(_shared_part(p), sort_keys=True, default=str) for rid, p in protocols.items()}
    common = Counter(keys.values()).most_common()
    best = max(count for _, count in common)
    chosen = next(k for k, c in common if c == best) if sum(c == best for _, c in common) == 1 else None
    for rid, key in keys.items():  # insertion order is start order
        if chosen is None or key == chosen:
            return rid
    return None


def _shared_part(protocol: dict[str, Any]) -> dict[str, Any]:
    """A run's protocol without what depends on its base model (its data version, model and revision), its hub
    commits by repository alone (`_commit_changes`)."""
    kept = {k: v for k, v in protocol.items() if k not in ("data_version", "model_revision", "base_model")}
    if kept.get("pins"):
        kept["pins"] = {key: [pin["repo"], pin["commit"]] for key, pin in kept["pins"].items()}
    return kept


def experiment_runs(root: Path, experiment: str, current: str | None = None) -> list[dict[str, Any]]:
    """Every run of an experiment from the registry, oldest first, with its folder, status and reason.

    Args:
        root: the runs root.
        experiment: the experiment id.
        current: a run being finished now (its comparison stage wrote a verdict): counted as completed.
    Returns:
        rows {"run_id", "variant", "status", "reason", "dir", "started", "has_results"}.
    """
    rows = []
    for row in R.summarise(R.read_registry(root)):
        if row.get("experiment") != experiment:
            continue
        folder = root / experiment / row["run_id"]
        status = row.get("status", "?")
        has_results = (folder / "comparison" / "verdict.json").exists()
        if row["run_id"] == current and has_results and status == "running":
            status = "completed"
        rows.append({"run_id": row["run_id"], "variant": row.get("variant"), "status": status,
                     "reason": row.get("error") or "", "dir": folder, "started": row.get("started"),
                     "has_results": has_results, "stage": row.get("stage", "")})
    return rows


# --------------------------------------------------------------------------- hub commits (pins.json)
PINS = "pins.json"


def hub_revisions(card: Card) -> dict[str, dict[str, str]]:
    """The card's `hf:` model and data set: {card key: {"kind", "repo", "given"}} (given: a commit or resolve)."""
    out = {}
    source = card.model.source
    if source.startswith("hf:"):
        repo, _, rev = source[3:].partition("@")
        out["model.revision"] = {"kind": "model", "repo": repo, "given": rev or card.model.revision or ""}
    data = card.data.source
    if hasattr(data, "hf"):
        out["data.source.revision"] = {"kind": "dataset", "repo": data.hf, "given": data.revision}
    return out


def read_pins(run_dir: Path) -> dict[str, Any] | None:
    """A run's recorded hub commits ({card key: {"repo", "commit", "resolved"}}), or None when it has none."""
    path = Path(run_dir) / PINS
    return io.read_json(path) if path.exists() else None


def pin_card(card: Card, root: Path, experiment: str, run_dir: Path | None = None,
             resolver: Callable[[str, str, type[LabkitError], str], str] = hub.resolve_commit) -> dict[str, Any]:
    """The exact hub commits of a card: the run's recorded ones, else the experiment's, else looked up once.

    `revision: resolve` takes the commit an earlier run of the experiment recorded for the same repository; only the
    experiment's first run asks the hub (`resolver`). With `run_dir` the commits are written to its `pins.json`
    (once), so every later stage, `labkit final` and export use the same commit (`pinned` puts them into the card).

    Args:
        card: the card (left as it is: cards are frozen).
        root: the runs root.
        experiment: the experiment id.
        run_dir: the run folder (None: pin without recording, e.g. `labkit check --data`).
        resolver: (kind, repo, error, key) -> commit; the hub by default (a seam for tests).
    Returns:
        {card key: {"repo", "commit", "resolved"}} ({} when the card names no hub source).
    """
    wanted = hub_revisions(card)
    pins = read_pins(run_dir) if run_dir is not None else None
    if pins is None:
        pins = {}
        earlier = _experiment_pins(root, experiment)
        for key, item in wanted.items():
            given, repo = item["given"], item["repo"]
            if given != hub.RESOLVE:
                pins[key] = {"repo": repo, "commit": given, "resolved": False}
                continue
            commit = earlier.get((key, repo))
            if commit is None:
                error = ModelSourceError if item["kind"] == "model" else DataError
                commit = resolver(item["kind"], repo, error, key)
            pins[key] = {"repo": repo, "commit": commit, "resolved": True}
        if run_dir is not None and pins:
            io.write_json(Path(run_dir) / PINS, pins)
    return pins


def pinned(card: Card, pins: dict[str, Any] | None) -> Card:
    """The card with the pinned hub commits as its model.revision and data.source.revision.

    Args:
        card: the card.
        pins: what `pin_card` or `read_pins` returns (None or {}: the card as it is).
    Returns:
        a copy with the commits, or the card itself when there are none.
    """
    changes = {key: pin["commit"] for key, pin in (pins or {}).items() if key in ("model.revision", "data.source.revision")}
    return updated(card, changes) if changes else card


def _experiment_pins(root: Path, experiment: str) -> dict[tuple[str, str], str]:
    """(card key, repo) -> the commit the experiment's earliest run recorded for it."""
    out: dict[tuple[str, str], str] = {}
    folder = Path(root) / experiment
    runs = sorted(folder.glob(f"*/{PINS}"), key=lambda p: (p.stat().st_mtime, p.parent.name)) if folder.exists() else []
    for path in runs:
        for key, pin in io.read_json(path).items():
            out.setdefault((key, pin["repo"]), pin["commit"])
    return out


def _pin_changes(reference: dict[str, Any] | None, card: Card) -> dict[str, Any]:
    """A named commit that differs from the reference run's commit for the same repository (resolve takes it): the
    rule `labkit compare` applies to two runs' pins (`_commit_changes`)."""
    named = {key: {"repo": item["repo"], "commit": item["given"]} for key, item in hub_revisions(card).items()
             if item["given"] != hub.RESOLVE}
    return {key.removeprefix("pins."): change for key, change in _commit_changes(reference, named).items()}
