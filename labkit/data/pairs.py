"""Preference pairs on labkit's own tokens: a prompt, the chosen answer and the rejected answer.

A preference pair is a prompt, the chosen answer (`data.fields.target`, still what evaluation compares
against) and the rejected answer (`data.fields.rejected`). Both answers are tokenised by the function SFT
uses (`labkit.data.prompting.encode_example`): the prompt is the chat-templated system + instruction ending
with the generation prompt, each answer its tokens up to and including EOS, cut at `data.max_length`. The
trainers (`labkit.train.preference`) receive these ids, never strings, so the tokens stage 02 shows are the
tokens trained on.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import datasets

from labkit.card.schema import Card
from labkit.data.prompting import IGNORE, Encoded, check_encoded, encode_example
from labkit.data.sources import rows_hash, sha256_text


PAIR_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")  # what DPOTrainer's collator reads


@dataclass
class EncodedPair:
    """A tokenised preference pair: the same prompt, then the chosen or the rejected answer.

    Attributes:
        chosen: prompt + chosen answer, encoded exactly as SFT encodes an example.
        rejected: prompt + rejected answer.
        trainer: "dpo" or "orpo" (they put loss on different positions, see `loss_positions`).
    """

    chosen: Encoded
    rejected: Encoded
    trainer: str

    @property
    def prompt_len(self) -> int:
        return self.chosen.prompt_len

    @property
    def prompt_ids(self) -> list[int]:
        return self.chosen.input_ids[: self.prompt_len]

    @property
    def chosen_ids(self) -> list[int]:
        return self.chosen.input_ids[self.prompt_len:]

    @property
    def rejected_ids(self) -> list[int]:
        return self.rejected.input_ids[self.prompt_len:]

    @property
    def full_len(self) -> int:
        """Length of the longer sequence before truncation (what max_length is compared with)."""
        return max(self.chosen.full_len, self.rejected.full_len)

    @property
    def truncated(self) -> bool:
        return self.chosen.truncated or self.rejected.truncated

    @property
    def loss_tokens(self) -> int:
        """Answer tokens of both sequences (the positions the preference term reads)."""
        return len(self.chosen_ids) + len(self.rejected_ids)


def encode_pair(tokenizer: Any, card: Card, text: str, chosen: str, rejected: str) -> EncodedPair:
    """Tokenise one preference pair as training does.

    Args:
        tokenizer: the model's tokenizer.
        card: the card (prompt, max_length, train.trainer).
        text: the input text.
        chosen: the chosen (reference) answer.
        rejected: the rejected answer.
    Returns:
        EncodedPair.
    """
    return EncodedPair(encode_example(tokenizer, card, text, chosen), encode_example(tokenizer, card, text, rejected),
                       card.train.trainer)


def encode_pairs(tokenizer: Any, card: Card, rows: list[dict[str, Any]]) -> list[EncodedPair]:
    """Encode prepared rows (each with `input`, `target` and `rejected`)."""
    return [encode_pair(tokenizer, card, r["input"], r["target"], r["rejected"]) for r in rows]


def to_dataset(tokenizer: Any, card: Card, rows: list[dict[str, Any]]) -> Any:
    """A datasets.Dataset of prompt_ids, chosen_ids and rejected_ids: labkit's tokens, as TRL's DPO collator reads them."""
    pairs = encode_pairs(tokenizer, card, rows)
    return datasets.Dataset.from_list([{"prompt_ids": p.prompt_ids, "chosen_ids": p.chosen_ids,
                                        "rejected_ids": p.rejected_ids} for p in pairs])


def orpo_row(example: dict[str, Any]) -> dict[str, Any]:
    """ORPOTrainer's row layout (what its `tokenize_row` returns) from a row of `to_dataset`.

    Returns:
        prompt_input_ids/attention_mask, and for chosen and rejected: input_ids (prompt + answer),
        attention_mask and labels (IGNORE on the prompt, the answer ids after it).
    """
    prompt = list(example["prompt_ids"])
    out = {"prompt_input_ids": prompt, "prompt_attention_mask": [1] * len(prompt)}
    for side in ("chosen", "rejected"):
        answer = list(example[f"{side}_ids"])
        out[f"{side}_input_ids"] = prompt + answer
        out[f"{side}_attention_mask"] = [1] * (len(prompt) + len(answer))
        out[f"{side}_labels"] = [IGNORE] * len(prompt) + answer
    return out


def loss_positions(pair: EncodedPair) -> dict[str, list[str]]:
    """Which term of the trainer's loss reads each token of the chosen and the rejected sequence.

    Returns:
        {"chosen": [...], "rejected": [...]}, one entry per token: "" (no loss), "answer" (the preference
        term: DPO's log-ratio, ORPO's odds ratio), "nll" (ORPO's NLL term only: the prompt after its first
        token) or "nll+answer" (ORPO's chosen answer: both terms). A token carries loss when the model is
        scored on predicting it, so the first token of a sequence never does.
    """
    out = {}
    for side in ("chosen", "rejected"):
        n = len(getattr(pair, side).input_ids)
        marks = [""] * min(pair.prompt_len, n) + ["answer"] * max(0, n - pair.prompt_len)
        if pair.trainer == "orpo" and side == "chosen":
            marks = ["nll+answer" if m else "nll" for m in marks]
            marks[0] = ""
        out[side] = marks
    return out


def check_pairs(tokenizer: Any, rows: list[dict[str, Any]], pairs: list[EncodedPair]) -> list[dict[str, Any]]:
    """Stage 02's template/mask checks on both sequences of every pair, and that the two answers differ.

    Returns:
        check rows like `labkit.data.prompting.check_encoded` (the sequence named in the check).
    """
    checks = []
    for side in ("chosen", "rejected"):
        for check in check_encoded(tokenizer, rows, [getattr(p, side) for p in pairs]):
            checks.append({**check, "check": f"{side}: {check['check']}"})
    same = [r["id"] for r, p in zip(rows, pairs, strict=True) if p.chosen_ids == p.rejected_ids]
    checks.append({"check": "chosen and rejected answers differ in tokens", "ok": not same, "failed_ids": same,
                   "explanation": "an identical pair teaches no preference (truncation cut the difference away?)"})
    return checks


def preference_manifest(tokenizer: Any, card: Card, splits: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The manifest's `preference` block: the rejected answers' hashes and their own version.

    The data version leaves the rejected answers out (`labkit.data.sources.split_sha256`); this block versions them.
    """
    sha = {name: rows_hash([{"id": r["id"], "rejected": r["rejected"]} for r in rows]) for name, rows in splits.items()
           if name != "test" or not card.data.rejected}  # the base model answers train and validation only
    tokenised = {name: rows_hash([{"ids": p.rejected.input_ids, "labels": p.rejected.labels}
                                  for p in encode_pairs(tokenizer, card, rows)])
                 for name, rows in splits.items() if name != "test"}
    version = sha256_text(json.dumps({"sha256": sha, "tokenised": tokenised}, sort_keys=True))[:12]
    return {"field": card.data.fields.rejected or ("base_model" if card.data.rejected else None),
            "trainer": card.train.trainer, "sha256": sha,
            "tokenised_sha256": tokenised, "version": version}


def rows_trained(card: Card, rows: int) -> int:
    """How many training rows the run reads: all of them, or what `train.max_steps` optimiser steps take.

    Args:
        card: the card (train.max_steps, micro_batch, grad_accum; distributed.num_processes).
        rows: rows in the training split.
    Returns:
        max_steps × micro_batch × grad_accum × processes when that is fewer than `rows`, else `rows` (an epoch-based
        card reads every row: the trainer sizes its epochs from the split).
    """
    t = card.train
    if t.max_steps is None:
        return rows
    return min(rows, t.max_steps * t.micro_batch * t.grad_accum * card.distributed.num_processes)


def rows_to_answer(card: Card, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The training rows whose rejected answer the base model writes (`data.rejected: {from: base_model}`): the rows
    the run trains on, `rows_trained` of them drawn in one seeded order (train.seed; a run with more steps takes the
    same rows and more, so the cached answers serve it), kept in split order; not the whole split.

    Args:
        card: the card.
        rows: the training split.
    Returns:
        the rows to answer (all of them when the run reads every row).
    """
    wanted = rows_trained(card, len(rows))
    if wanted >= len(rows):
        return list(rows)
    order = list(range(len(rows)))
    random.Random(f"rejected-rows:{card.train.seed}").shuffle(order)  # one order: a longer run's rows include these
    keep = set(order[:wanted])
    return [row for i, row in enumerate(rows) if i in keep]


def fixed_length_pairs(tokenizer: Any, card: Card, rows: list[dict[str, Any]], seq_len: int, count: int) -> Any:
    """Pairs whose chosen sequence has exactly `seq_len` tokens, from real rows (stage 03's measured steps).

    Each pair keeps a real row's answers (cut to at most half of `seq_len`); its prompt is filled to the
    length with real tokens. The rejected sequence is as long, one token shorter on every second pair,
    so batches carry padding as real ones do.

    Returns:
        a datasets.Dataset in `to_dataset`'s columns.
    """
    pairs = encode_pairs(tokenizer, card, rows)
    if not pairs:
        raise ValueError("fixed_length_pairs: no rows to build pairs from")
    stream = [t for p in pairs for t in p.chosen.input_ids]
    examples, at = [], 0
    for k in range(count):
        pair = pairs[k % len(pairs)]
        chosen = pair.chosen_ids[: max(1, seq_len // 2)]
        rejected = (pair.rejected_ids * seq_len)[: len(chosen) - (k % 2 if len(chosen) > 1 else 0)]
        need = seq_len - len(chosen)
        prompt = [stream[(at + i) % len(stream)] for i in range(need)]
        at += need
        examples.append({"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected})
    return datasets.Dataset.from_list(examples)
