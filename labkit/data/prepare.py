"""Prepare a run's data once: load, clean, split, find leakage, write splits and the manifest.

Writes (atomically, so a failure leaves nothing half-written):
  data/train.jsonl data/validation.jsonl   the prepared splits (the test split is never written)
  preprocessing/leakage.json              duplicate pairs within/across splits
  data_manifest.json                      hashes, rules, counts: the data version

Before anything is written, every split's references are checked against `data.target_format`, and stage 02's
encoding checks (truncation, loss positions, EOS) run on train and validation (`labkit.data.checks`).

The test split's rows are not kept anywhere: the manifest holds its size and sha256, and only
`labkit final` (labkit.experiment.final.open_test_split) re-derives them from the card's source with the same
pipeline (`derive_splits`) and checks them against that hash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypedDict

import labkit
from labkit.card.schema import Card
from labkit.card.experiment_and_data import Leakage
from labkit.core import io
from labkit.core.io import read_json, write_atomic, write_json
from labkit.core.progress import task
from labkit.core.protocol import check_data_version
from labkit.core.runs import Run
from labkit.data import conversations, leakage
from labkit.data import sources as D
from labkit.data.checks import (check_category_key, check_references, check_special_tokens, raise_on_failed,
                                run_checks)
from labkit.data.pairs import preference_manifest, rows_to_answer
from labkit.data.prompting import encode_example, encode_rows
from labkit.errors import LeakageError, MissingInput, SplitLocked, UsageError


class SplitRecord(TypedDict):
    """The manifest's `split`: how the rows were split, and each split's size and content hash."""

    spec: dict[str, Any]  # the card's data.split
    sizes: dict[str, int]  # train, validation, test
    sha256: dict[str, str]  # per split (test included: `labkit final` checks the re-derived rows against it)
    groups: dict[str, int]  # per split, its distinct data.fields.group values (empty without a group field)


# the manifest's `tokenizer`: which tokenizer encoded the data ("class" is not an identifier: the functional form)
TokenizerIdentity = TypedDict("TokenizerIdentity", {
    "name_or_path": str, "model_revision": str, "class": str, "vocab_size": int, "eos_token": str | None,
    "pad_token": str | None, "chat_template_sha256": str})


class _ManifestRequired(TypedDict):
    data_version: str  # the short hash of the splits and their tokenisation
    source: dict[str, Any]  # what was read: its hash or revision
    fields: dict[str, Any]
    rows_loaded: int
    cleaning: list[dict[str, Any]]  # one report per rule (removed ids cut to 50)
    split: SplitRecord
    leakage: dict[str, Any]  # the leakage report without its pairs (preprocessing/leakage.json has them)
    references: dict[str, Any]
    tokenizer: TokenizerIdentity
    tokenised_sha256: dict[str, str]
    prompt: dict[str, Any]
    labkit_version: str
    max_length: int


class DataManifest(_ManifestRequired, total=False):
    """data_manifest.json: the data version of a run and everything it was derived from."""

    preference: dict[str, Any]  # preference pairs only: the rejected answers' hashes and version


def _tokenizer_identity(tokenizer: Any, revision: str) -> TokenizerIdentity:
    template = tokenizer.chat_template or ""
    return {"name_or_path": str(getattr(tokenizer, "name_or_path", "")), "model_revision": revision,
            "class": type(tokenizer).__name__, "vocab_size": len(tokenizer),
            "eos_token": tokenizer.eos_token, "pad_token": tokenizer.pad_token,
            "chat_template_sha256": D.sha256_text(template)}


def _apply_leakage(spec: Leakage, splits: dict[str, list[dict[str, Any]]],
                   said: Callable[[str], str] = str) -> tuple[dict, list[dict[str, Any]]]:
    """Find duplicate pairs within and across the splits (inputs compared as `said` gives them), and groups
    (data.fields.group) in more than one split, and apply `data.leakage` (`spec`) to them, in place (drop_from_train
    drops the training rows of such a group)."""
    pairs = leakage.find_duplicates({name: [(r["id"], said(r["input"])) for r in rows] for name, rows in splits.items()},
                                    threshold=spec.near_duplicate_threshold)
    cross = [p for p in pairs if p["a_split"] != p["b_split"]]
    dropped: list[str] = []
    within_dropped: list[str] = []
    if spec.within_split == "drop":  # keep the first of each pair (by id), drop the other
        for p in pairs:
            if p["a_split"] == p["b_split"]:
                within_dropped.append(max(p["a_id"], p["b_id"]))
        gone_within = set(within_dropped)
        for name in splits:
            splits[name] = [r for r in splits[name] if r["id"] not in gone_within]
    if cross and spec.policy == "fail":
        first = cross[0]
        raise LeakageError(f"data.leakage: {len(cross)} train/eval duplicate pair(s), e.g. {first['a_split']}:{first['a_id']} ~ "
                           f"{first['b_split']}:{first['b_id']} ({first['similarity']}); policy is fail "
                           "(fix the data or set data.leakage.policy: drop_from_train)")
    shared = D.groups_across_splits(splits)  # only given splits can share a group: split_rows keeps groups whole
    if shared and spec.policy == "fail":
        first = shared[0]
        raise LeakageError(f"data.leakage: {len(shared)} group(s) of data.fields.group in more than one split, e.g. "
                           f"{first['group']!r} ({', '.join(f'{k} {v}' for k, v in first['rows'].items())} rows); policy "
                           "is fail (keep each group in one split or set data.leakage.policy: drop_from_train)")
    if spec.policy == "drop_from_train":
        by_pair = {p[f"{side}_id"] for p in cross for side in "ab" if p[f"{side}_split"] == "train"}
        shared_ids = {g["group"] for g in shared}  # each is in validation or test too
        by_group = {r["id"] for r in splits["train"] if r.get("group") in shared_ids} - by_pair
        dropped, before = [*by_pair, *by_group], len(splits["train"])
        splits["train"] = [r for r in splits["train"] if r["id"] not in by_pair | by_group]
        if not splits["train"]:
            raise D.DataError(leakage.emptied_train(spec.near_duplicate_threshold, cross, before, len(by_group)))
    report = {"threshold": spec.near_duplicate_threshold, "policy": spec.policy, "pairs": pairs,
              "summary": leakage.summarise(pairs, split_order=D.SPLITS), "cross_split_pairs": len(cross),
              "dropped_from_train": sorted(set(dropped)), "dropped_within_split": sorted(set(within_dropped)),
              "groups_across_splits": shared}
    return report, pairs


@dataclass
class DerivedSplits:
    """What the splitting pipeline produced (all three splits, the test split included).

    Attributes:
        splits: {"train", "validation", "test"} -> rows sorted by id.
        rows_loaded: rows read from the source.
        source: the source's identity (what was read, its hash or revision).
        planted: what the built-in dataset planted on purpose (None for other sources).
        cleaning: one report per cleaning rule (removed ids, changed rows).
        leakage: the leakage report (pairs, summary, dropped ids).
        references: rows whose reference was checked against data.target_format, per split (counts only).
        rejected: how the base model's answers filled the rejected answers (`data.rejected`), else None.
    """

    splits: dict[str, list[dict[str, Any]]]
    rows_loaded: int
    source: dict[str, Any]
    planted: dict[str, Any] | None
    cleaning: list[dict[str, Any]]
    leakage: dict[str, Any]
    references: dict[str, int]
    rejected: dict[str, Any] | None = None


# answer(splits, data_version) -> {"answers": {split: {row id: text}}, "cache": {...}}: labkit.evaluate.base_answers
BaseAnswers = Callable[[dict[str, list[dict[str, Any]]], str], dict[str, Any]]


def derive_splits(card: Card, tokenizer: Any) -> DerivedSplits:
    """The splitting pipeline: load the source, map the fields, clean, split, apply the leakage policy.

    Deterministic for a given card, source and tokenizer. It returns the test rows too, so only
    `prepare` (which writes train and validation only) and `labkit.experiment.final.open_test_split` call it.

    Args:
        card: the card (data section).
        tokenizer: the model's tokenizer (token-length cleaning rules).
    Returns:
        the DerivedSplits.
    Raises:
        DataError: bad data, a bad reference in any split (one line naming the file, line, row id and the fix);
            LeakageError under the `fail` policy.
    """
    with task("data: reading the source"):
        raw, identity = D.load_source(card.data)
    where: dict[str, str] = {}
    rows = D.map_fields(card.data, raw, where)
    lengths: dict[str, int] = {}

    def token_length(row: dict[str, Any]) -> int:  # a preference pair is as long as its longer answer
        if row["id"] not in lengths:
            answers = [row["target"]] + ([row["rejected"]] if "rejected" in row else [])
            lengths[row["id"]] = max(encode_example(tokenizer, card, row["input"], a).full_len for a in answers)
        return lengths[row["id"]]

    with task(f"data: cleaning, splitting and checking {len(rows)} rows (references, leakage)"):
        rows, cleaning = D.apply_cleaning(card.data, rows, token_length)
        splits = D.split_rows(card.data, rows)
        references = check_references(card.data, splits, where)  # every split, before anything is evaluated
        check_category_key(card, splits)
        check_special_tokens(tokenizer, splits, where)
        leak_report, _ = _apply_leakage(card.data.leakage, splits,
                                        conversations.spoken if card.data.prompt.conversation else str)
    planted = identity.pop("planted", None)
    return DerivedSplits(splits=splits, rows_loaded=len(raw), source=identity, planted=planted, cleaning=cleaning,
                         leakage=leak_report, references=references)


def checked_splits(card: Card, tokenizer: Any,
                   base_answers: BaseAnswers | None = None) -> tuple[DerivedSplits, dict[str, list[Any]]]:
    """The splits with every check that needs only the data and the tokenizer passed; writes nothing.

    The references of every split are checked by `derive_splits`; then stage 02's encoding checks (truncation,
    loss positions, EOS) run on train and validation, so that they fail here, with stage 02's message, before
    the baseline spends compute. `prepare` and `labkit check --data` call it. With `data.rejected: {from:
    base_model}` the base model's answers fill the rejected answers first (`base_answers`); without an answerer
    (`labkit check --data`) the chosen answers are checked alone.

    Args:
        card: the card.
        tokenizer: the model's tokenizer.
        base_answers: the base model's answerer (`labkit.evaluate.base_answers.base_model_answers`).
    Returns:
        (the DerivedSplits, the encodings of train and validation).
    Raises:
        DataError: bad data or a bad reference; PreprocessingCheckFailed: an encoding check failed.
    """
    derived = derive_splits(card, tokenizer)
    checked = card
    if card.data.rejected is not None:
        if base_answers is None:
            checked = card.model_copy(update={"train": card.train.model_copy(update={"trainer": "sft", "beta": None})})
        else:
            derived.rejected = _fill_from_base(card, tokenizer, derived.splits, base_answers)
    with task("data: encoding checks on train and validation (truncation, loss positions, EOS)"):
        encoded, checks = run_checks(tokenizer, checked, {n: rows for n, rows in derived.splits.items() if n != "test"})
    raise_on_failed(checks)
    return derived, encoded


def _version(tokenizer: Any, card: Card, splits: dict[str, list[dict[str, Any]]]) -> tuple[str, dict, dict]:
    """(data version, split sha256s, tokenised sha256s): the chosen answers only, and the loss on the last answer, so
    sft and preference variants of the same rows, and a `loss_on: every_answer` variant (which trains on more of the
    same tokens: its own labels are in the tokenised sha256s), share one version."""
    encoded = {name: encode_rows(tokenizer, card, rows) for name, rows in splits.items() if name != "test"}
    tokenised = {name: D.rows_hash([{"ids": e.input_ids, "labels": e.labels} for e in encs])
                 for name, encs in encoded.items()}
    last = {name: D.rows_hash([{"ids": e.input_ids, "labels": e.last_answer_labels} for e in encs])
            for name, encs in encoded.items()}
    split_hashes = {name: D.split_sha256(rows_) for name, rows_ in splits.items()}
    return D.sha256_text(json.dumps({"splits": split_hashes, "tokenised": last}, sort_keys=True))[:12], split_hashes, tokenised


def _fill_from_base(card: Card, tokenizer: Any, splits: dict[str, list[dict[str, Any]]],
                    base_answers: BaseAnswers) -> dict[str, Any]:
    """Set the rejected answer of each training row the run reads and each validation row to the base model's answer
    (cached by the answerer); the training split becomes those rows.

    With train.max_steps the run reads max_steps x micro_batch x grad_accum x processes rows, a seeded sample of the
    split (`labkit.data.pairs.rows_to_answer`): only they are answered, not the whole split. A training row whose
    base answer already equals its reference teaches no preference: it is left out of training (listed);
    validation rows are all kept (evaluation reads them). The data version stays that of the whole split.
    """
    version = _version(tokenizer, card, splits)[0]
    available = len(splits["train"])
    splits["train"] = rows_to_answer(card, splits["train"])
    got = base_answers({name: splits[name] for name in ("train", "validation")}, version)
    same: list[str] = []
    for name in ("train", "validation"):
        for row in splits[name]:
            row["rejected"] = got["answers"][name][row["id"]]
            if name == "train" and row["rejected"].strip() == row["target"].strip():
                same.append(row["id"])
    answered = {"train": len(splits["train"]), "validation": len(splits["validation"])}
    splits["train"] = [r for r in splits["train"] if r["id"] not in set(same)]
    return {"from": "base_model", **got["cache"], "data_version": version, "train_rows_in_split": available,
            "rows_answered": answered, "same_as_reference_left_out": same}


def prepare(card: Card, run: Run, tokenizer: Any, model_revision: str,
            base_answers: BaseAnswers | None = None) -> DataManifest:
    """Prepare the run's data (or return the existing manifest when it is already prepared).

    Writes data/train.jsonl and data/validation.jsonl; the test rows are written nowhere (the
    manifest keeps their count and sha256 for `labkit final`).

    Args:
        card: the card.
        run: the run folder.
        tokenizer: the model's tokenizer (token-length rules, tokenised hash).
        model_revision: the base model's revision (recorded with the tokenizer identity).
        base_answers: fills the rejected answers for `data.rejected: {from: base_model}` (see `checked_splits`).
    Returns:
        the data manifest.
    """
    manifest_path = run.dir / "data_manifest.json"
    if manifest_path.exists():
        return read_json(manifest_path)
    if card.data.rejected is not None and base_answers is None:
        raise UsageError("data.rejected: {from: base_model} needs the base model's answers: prepare the data from a stage "
                         "(labkit run), which passes them")
    derived, _ = checked_splits(card, tokenizer, base_answers)
    splits, cleaning, leak_report = derived.splits, derived.cleaning, derived.leakage
    version, split_hashes, tokenised = _version(tokenizer, card, splits)  # the chosen answers: see _version
    if derived.rejected:  # the whole split's version: a preference run trains on the rows its steps read
        version = derived.rejected["data_version"]
    rows = None if derived.rejected else split_hashes  # a preference run's answered rows: its data version alone
    check_data_version(run, version, card.experiment.protocol_change, rows, model_revision)  # before anything written
    manifest: DataManifest = {
        "data_version": version,
        "source": derived.source,
        "fields": card.data.fields.model_dump(),
        "rows_loaded": derived.rows_loaded,
        "cleaning": [{k: v for k, v in step.items() if k != "removed_ids"} | {"removed_ids": step["removed_ids"][:50]}
                     for step in cleaning],
        "split": {"spec": card.data.split.model_dump(), "sizes": {k: len(v) for k, v in splits.items()},
                  "sha256": split_hashes,
                  "groups": {k: len({r["group"] for r in v}) for k, v in splits.items()} if card.data.fields.group else {}},
        "leakage": {k: v for k, v in leak_report.items() if k != "pairs"},
        "references": {"kind": card.data.target_format.kind, "checked": derived.references},
        "tokenizer": _tokenizer_identity(tokenizer, model_revision),
        "tokenised_sha256": tokenised,
        "prompt": card.data.prompt.model_dump(),
        "labkit_version": labkit.__version__,
        "max_length": card.data.max_length,
    }
    if card.data.fields.rejected or derived.rejected:  # preference pairs: rejected answers, versioned apart
        manifest["preference"] = preference_manifest(tokenizer, card, splits)
        if derived.rejected:
            manifest["preference"]["from_base_model"] = derived.rejected
    for name, rows_ in splits.items():
        if name == "test":
            continue  # locked: re-derived and checked against split.sha256.test by `labkit final` only
        write_atomic(run.dir / "data" / f"{name}.jsonl",
                     "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows_))
    stage = run.stage_dir("preprocessing")
    write_json(stage / "leakage.json", leak_report)
    write_json(stage / "cleaning.json", cleaning)
    if derived.planted is not None:
        write_json(stage / "planted.json", derived.planted)
    write_json(manifest_path, manifest)  # last: its presence means the data is complete
    return manifest


def load_split(run: Run, name: str) -> list[dict[str, Any]]:
    """Read a prepared split. The test split is locked: it is not written, only `labkit final` re-derives it.

    Args:
        run: the run.
        name: "train" or "validation".
    Returns:
        the rows.
    """
    if name == "test":
        raise SplitLocked("the test split is locked until the final decision (`labkit final RUN_ID` opens it once)")
    if name not in D.SPLITS:
        raise UsageError(f"unknown split {name!r} (expected train or validation)")
    path = Path(run.dir) / "data" / f"{name}.jsonl"
    if not (run.dir / "data_manifest.json").exists():
        raise MissingInput(f"{run.dir}: data not prepared yet (run stage 01_baseline first)")
    return io.read_jsonl(path)
