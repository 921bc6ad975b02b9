"""Stage 02 (notebooks/02_preprocessing.ipynb): the data after the full preprocessing — lengths, checks, samples,
planted problems against found ones.

`inspect(stage)` computes and writes everything the notebook shows (category_counts.json, planted_check.json for
a built-in data set, checks.json, lengths.json, samples.html) and returns it as an `Inspection`; `decide(stage)`
stops the stage on a failed check, else records it done from those files. The cells only show and explain.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

from transformers import AutoConfig, GenerationConfig

from labkit.card.schema import Card
from labkit.data.checks import raise_on_failed, run_checks
from labkit.data.end_token import end_token_check
from labkit.data.lengths import LengthStats, length_stats
from labkit.data.prepare import DataManifest
from labkit.data.prompting import Encoded, encode_example, render
from labkit.evaluate.generation import stop_ids
from labkit.model.loading import chatml_ids
from labkit.show.tokens import render_page
from labkit.stages.context import Stage
from labkit.stages.records import (
    CATEGORY_COUNTS,
    CHECKS,
    CLEANING,
    LEAKAGE,
    LENGTHS,
    PLANTED,
    PLANTED_CHECK,
    SAMPLES,
    PreprocessingSummary,
)

__all__ = ["Inspection", "category_counts", "decide", "end_token_checks", "generation_stops", "inspect", "model_checks",
           "pick_samples", "planted_vs_found", "raise_on_failed", "run_checks"]


@dataclass
class Inspection:
    """What stage 02 found, as its files hold it.

    Attributes:
        manifest: the data manifest (data_manifest.json).
        splits: the prepared train and validation rows.
        counts: rows per category in each split (category_counts.json).
        leakage: the duplicate pairs and the policy applied (leakage.json, written by the preparation).
        planted: the built-in generator's planted problems against what was found (planted_check.json); None for
            other data.
        encoded: every row encoded as training encodes it, per split.
        checks: the encoding and model checks (checks.json), one row per split and check.
        lengths: token lengths per split (lengths.json).
        samples: the picked samples, (title, encoding), in display order.
        page: the samples rendered as HTML (samples.html).
    """

    manifest: DataManifest
    splits: dict[str, list[dict[str, Any]]]
    counts: dict[str, dict[str, int]]
    leakage: dict[str, Any]
    planted: dict[str, Any] | None
    encoded: dict[str, list[Encoded]]
    checks: list[dict[str, Any]]
    lengths: dict[str, LengthStats]
    samples: list[tuple[str, Encoded]]
    page: str


def inspect(stage: Stage, per_category: int = 2) -> Inspection:
    """Look at the prepared data and write what stage 02 shows (nothing is decided here: see `decide`).

    Args:
        stage: the open preprocessing Stage.
        per_category: samples rendered per category (plus the longest and the shortest training row).
    Returns:
        the Inspection; its files are in the stage's folder.
    """
    manifest = stage.prepare_data()
    splits = {name: stage.split(name) for name in ("train", "validation")}
    counts = category_counts(splits)
    stage.save_json(CATEGORY_COUNTS, counts)
    leaks = stage.read(stage.name, LEAKAGE)
    planted = None
    if stage.path(PLANTED).exists():  # the built-in data set knows what it planted
        planted = planted_vs_found(stage.read(stage.name, PLANTED), leaks, stage.read(stage.name, CLEANING))
        stage.save_json(PLANTED_CHECK, planted)
    encoded, checks = run_checks(stage.tokenizer, stage.card, splits)
    checks += end_token_checks(stage.tokenizer, stage.card, splits, encoded,
                               generation_stops(stage.model_source, stage.tokenizer, stage.card))
    checks += model_checks(stage.model_source, stage.tokenizer, stage.card)
    lengths = length_stats(stage.card, encoded)
    stage.save_json(CHECKS, checks)
    stage.save_json(LENGTHS, lengths)
    samples = pick_samples(splits, encoded, per_category=per_category)
    page = render_page(stage.tokenizer, samples)
    stage.save_text(SAMPLES, page)
    return Inspection(manifest=manifest, splits=splits, counts=counts, leakage=leaks, planted=planted, encoded=encoded,
                      checks=checks, lengths=lengths, samples=samples, page=page)


def decide(stage: Stage) -> PreprocessingSummary:
    """Stage 02's decision, from the files `inspect` wrote: stop on a failed check, else record the stage done.

    Args:
        stage: the open preprocessing Stage.
    Returns:
        the summary written to preprocessing/summary.json.
    Raises:
        PreprocessingCheckFailed: a check failed (naming the check and the offending rows).
    """
    checks = stage.read(stage.name, CHECKS)
    raise_on_failed(checks)
    manifest = stage.prepare_data()
    leaks = stage.read(stage.name, LEAKAGE)
    return cast(PreprocessingSummary, stage.done(
        data_version=manifest["data_version"], sizes=manifest["split"]["sizes"], duplicate_pairs=len(leaks["pairs"]),
        cross_split_pairs=leaks["cross_split_pairs"], checks_ok=all(c["ok"] for c in checks)))


def category_counts(splits: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, int]]:
    """Rows per category in each split."""
    return {name: dict(sorted(Counter(str(r.get("category")) for r in rows).items())) for name, rows in splits.items()}


def _eos_ids(value: Any) -> set[int]:
    if value is None:
        return set()
    return set(value) if isinstance(value, (list, tuple)) else {int(value)}


def model_checks(resolved: Any, tokenizer: Any, card: Card) -> list[dict[str, Any]]:
    """Checks that the tokenizer and the prompt format (chat template or plain) fit the model they are used with.

    Args:
        resolved: the resolved model source (its config is read, not its weights).
        tokenizer: the tokenizer used for training and evaluation.
        card: the card (prompt).
    Returns:
        check rows like `run_checks` (split "model", no row ids).
    """
    kwargs = {"trust_remote_code": card.model.trust_remote_code, **resolved.from_pretrained_kwargs()}
    config = AutoConfig.from_pretrained(resolved.location, **kwargs)
    try:
        generation = GenerationConfig.from_pretrained(resolved.location, **resolved.from_pretrained_kwargs())
    except OSError:
        generation = None
    declared = _eos_ids(getattr(config, "eos_token_id", None)) | _eos_ids(getattr(generation, "eos_token_id", None))
    vocab = getattr(config.get_text_config(), "vocab_size", None)
    added = bool(chatml_ids(card, tokenizer))
    if added:  # labkit.model.loading.resize_for_tokenizer: ChatML's rows and EOS are given to the model on load
        declared, vocab = declared | {tokenizer.eos_token_id}, max(vocab or 0, len(tokenizer))
    # what generation stops on (`labkit.evaluate.generation.stop_ids`): Gemma's and Phi-3's templates close the turn
    # with an end-of-turn token the model declares, not with the tokenizer's EOS
    stops = sorted(declared | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()))
    ends = [t for t in tokenizer.convert_ids_to_tokens(stops) if t]
    if card.data.prompt.format == "plain":
        probe = encode_example(tokenizer, card, "x", "ANSWER")
        tail = tokenizer.decode(probe.input_ids[-1:])
        closing = ("the plain format closes the answer with the EOS token", probe.input_ids[-1] == tokenizer.eos_token_id)
    else:
        rendered = render(tokenizer, card.data.prompt, [{"role": "user", "content": "x"},
                                                        {"role": "assistant", "content": "ANSWER"}], tokenize=False)
        tail = rendered.split("ANSWER", 1)[-1]
        closing = ("the chat template closes the answer with a token generation stops on", any(t in tail for t in ends))
    rows = [
        ("the tokenizer's EOS is an end token the model declares", not declared or tokenizer.eos_token_id in declared,
         f"tokenizer EOS {tokenizer.eos_token!r} (id {tokenizer.eos_token_id}) vs the model's {sorted(declared)}: "
         "generation would not stop where training taught it to"),
        ("every token id has an embedding row" + (" (ChatML rows added on load)" if added else ""),
         vocab is None or len(tokenizer) <= vocab,
         f"{len(tokenizer)} tokenizer entries vs {vocab} embedding rows: a tokenizer of another model?"),
        (*closing,
         f"after the answer the prompt format writes {tail!r}, none of the tokens generation stops on ({', '.join(ends)}): "
         "the model learns to stop with a token that generation does not stop on"),
    ]
    return [{"split": "model", "check": check, "ok": bool(ok), "failed": int(not ok), "failed_ids": [],
             "explanation": why} for check, ok, why in rows]


def generation_stops(resolved: Any, tokenizer: Any, card: Card) -> list[int]:
    """The token ids the evaluation's generation stops on (`labkit.evaluate.generation.stop_ids`), read from the
    model's files without its weights: its generation config (or, without one, its config, as transformers does), and
    the tokenizer's EOS; a `chat_template: chatml` card's model stops on the tokenizer's EOS (set on load).

    Args:
        resolved: the resolved model source.
        tokenizer: the tokenizer used for training and evaluation.
        card: the card (prompt, trust_remote_code).
    Returns:
        the stop ids, in stop_ids' order.
    """
    if chatml_ids(card, tokenizer):  # labkit.model.loading.resize_for_tokenizer: the tokenizer's EOS becomes the model's
        return [tokenizer.eos_token_id]
    try:
        generation = GenerationConfig.from_pretrained(resolved.location, **resolved.from_pretrained_kwargs())
    except OSError:
        kwargs = {"trust_remote_code": card.model.trust_remote_code, **resolved.from_pretrained_kwargs()}
        generation = GenerationConfig.from_model_config(AutoConfig.from_pretrained(resolved.location, **kwargs))
    return stop_ids(SimpleNamespace(generation_config=generation), tokenizer)


def end_token_checks(tokenizer: Any, card: Card, splits: dict[str, list[dict[str, Any]]], encoded: dict[str, list[Any]],
                     stops: list[int]) -> list[dict[str, Any]]:
    """Every rendered example of every split ends its answer with a token generation stops on, inside the loss mask
    (`labkit.data.end_token`); both sequences of a preference pair.

    Args:
        tokenizer: the tokenizer.
        card: the card (train.trainer).
        splits: the prepared rows per split.
        encoded: their encodings per split (`run_checks`).
        stops: the token ids generation stops on (`generation_stops`).
    Returns:
        check rows like `run_checks`'; a failed one names the first failing example's missing or masked token and
        the fix.
    """
    out = []
    for name, rows in splits.items():
        sides = [("", encoded[name])] if card.train.trainer == "sft" else [
            (f"{side}: ", [getattr(p, side) for p in encoded[name]]) for side in ("chosen", "rejected")]
        for prefix, items in sides:
            check = end_token_check(tokenizer, rows, items, stops)
            out.append({"split": name, **check, "check": prefix + check["check"], "failed": len(check["failed_ids"]),
                        "failed_ids": check["failed_ids"][:20]})
    return out


def pick_samples(splits: dict[str, list[dict[str, Any]]], encoded: dict[str, list[Encoded]],
                 per_category: int = 2) -> list[tuple[str, Encoded]]:
    """Representative training samples: `per_category` of each category, plus the longest and shortest.

    Returns:
        [(title, encoding)] in display order.
    """
    rows, encs = splits["train"], encoded["train"]
    by_cat: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_cat.setdefault(str(row.get("category")), []).append(i)
    chosen: list[tuple[str, int]] = []
    for cat in sorted(by_cat):
        for i in by_cat[cat][:per_category]:
            chosen.append((f"{rows[i]['id']} · category {cat}", i))
    order = sorted(range(len(rows)), key=lambda i: encs[i].full_len)
    chosen.append((f"{rows[order[-1]]['id']} · longest ({encs[order[-1]].full_len} tokens)", order[-1]))
    chosen.append((f"{rows[order[0]]['id']} · shortest ({encs[order[0]].full_len} tokens)", order[0]))
    return [(title, encs[i]) for title, i in chosen]


def planted_vs_found(planted: dict[str, Any], leakage_report: dict[str, Any], cleaning: list[dict[str, Any]]) -> dict[str, Any]:
    """Compare the built-in generator's planted problems with what preparation found.

    Returns:
        {"duplicates": {"planted", "found", "missed", "unexpected"}, "empty": {...}, "overlong": {...}, "ok": bool}.
    """
    want = {frozenset(p) for p in planted["exact_duplicates"] + planted["near_duplicates"]}
    got = {frozenset((p["a_id"], p["b_id"])) for p in leakage_report["pairs"]}
    removed = {rid for step in cleaning for rid in step["removed_ids"]}
    gone = {p for p in want if p & removed}  # a cleaning rule removed one side before the search
    dup = {"planted": len(want), "found": len(got & want), "removed_by_cleaning": len(gone),
           "missed": sorted("~".join(sorted(p)) for p in want - got - gone),
           "unexpected": sorted("~".join(sorted(p)) for p in got - want)}
    empty = {"planted": planted["empty"], "removed": sorted(set(planted["empty"]) & removed)}
    overlong = {"planted": planted["overlong"], "removed": sorted(set(planted["overlong"]) & removed)}
    ok = not dup["missed"] and not dup["unexpected"] and empty["planted"] == empty["removed"] and overlong["planted"] == overlong["removed"]
    return {"duplicates": dup, "empty": empty, "overlong": overlong, "ok": ok}
