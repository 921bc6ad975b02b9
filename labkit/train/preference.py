"""Preference training — DPO and ORPO through TRL — on labkit's own tokens.

The pairs are encoded by `labkit.data.pairs` with the function SFT uses; the trainers receive those ids,
never strings, so the tokens stage 02 shows are the tokens trained on.

- **DPO** (`trl.DPOTrainer`) raises the log-probability of the chosen answer over the rejected one relative
  to a frozen reference model; β (`train.beta`) sets how far the policy may move from it. The loss reads
  the answer tokens of both sequences (summed log-probabilities); the prompt is masked. With LoRA/QLoRA the
  reference is the base model with the adapter switched off (no second copy in memory); with full
  fine-tuning it is a frozen copy of the starting model.
- **ORPO** (`trl.experimental.orpo.ORPOTrainer`) needs no reference: an NLL term on the chosen sequence plus
  λ (`train.beta`) times an odds-ratio term on the mean log-probabilities of the two answers. TRL computes
  the NLL term over prompt *and* answer (as the ORPO authors' code does; trl#1516, trl#2527), so there the
  prompt tokens carry loss too — stage 02 shows it.

TRL 1.16's DPOTrainer re-tokenises whatever dataset it gets and ORPOTrainer tokenises strings row by row;
the two subclasses below replace only that step (`_prepare_dataset`, `tokenize_row`). Collators, losses,
the reference model, logging and checkpoints are TRL's and transformers' own.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from typing import Any

from trl import DPOConfig, DPOTrainer

from labkit.card.schema import Card
from labkit.data.pairs import PAIR_COLUMNS, orpo_row, to_dataset
from labkit.model.placement import one_gpu
from labkit.train.token_count import CountedBatches

with warnings.catch_warnings():  # TRL warns on importing trl.experimental; labkit uses it only for train.trainer: orpo
    warnings.filterwarnings("ignore", message=".*trl.experimental")
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

DEFAULT_BETA = 0.1  # TRL's default for DPOConfig.beta and ORPOConfig.beta


class LabkitDPOTrainer(CountedBatches, DPOTrainer):
    """TRL's DPOTrainer taking labkit's tokenised pairs as they are (TRL 1.16 would re-tokenise them)."""

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):  # noqa: ANN001, ANN202
        if set(PAIR_COLUMNS) <= set(dataset.column_names):
            return dataset
        return super()._prepare_dataset(dataset, processing_class, args, dataset_name)


class LabkitORPOTrainer(CountedBatches, ORPOTrainer):
    """TRL's ORPOTrainer on rows already in its layout (`orpo_row`), instead of tokenising strings."""

    def tokenize_row(self, feature, model=None):  # noqa: ANN001, ANN201
        if "chosen_labels" not in feature:
            raise ValueError("labkit's ORPO rows come from labkit.data.pairs.orpo_row (prompt strings are not "
                             "tokenised here)")
        return feature


def preference_trainer(card: Card, model: Any, tokenizer: Any, train_rows: Any, eval_rows: list[dict[str, Any]] | None,
                       config: dict[str, Any], callbacks: list[Any]) -> Any:
    """The DPO or ORPO trainer of `labkit.train.trainer.build_trainer`, with the arguments and callbacks it built for SFT.

    Args:
        card: the card (train.trainer, train.beta).
        model: the model after `labkit.model.method.apply_method`.
        tokenizer: the tokenizer.
        train_rows: prepared training rows, or a Dataset from `to_dataset` / `fixed_length_pairs`.
        eval_rows: validation rows (the validation loss during training is the preference loss), or None.
        config: build_trainer's TrainingArguments (SFT-only fields are left out).
        callbacks: build_trainer's callbacks (budget, interruption, early stopping).
    Returns:
        a trl.DPOTrainer or trl.experimental.orpo.ORPOTrainer subclass instance.
    """
    kind = card.train.trainer
    Config = DPOConfig if kind == "dpo" else ORPOConfig  # noqa: N806 - a class
    names = {f.name for f in dataclasses.fields(Config)}
    # TRL's preference configs disable dropout by default; labkit keeps the card's (method.dropout), as for SFT
    kwargs = {k: v for k, v in config.items() if k in names}
    if kind == "orpo":
        kwargs["remove_unused_columns"] = False  # its collator passes the prompt columns through (TRL sets it anyway)
    args = Config(**kwargs, beta=card.train.beta or DEFAULT_BETA, disable_dropout=False)
    # several GPUs visible without a launcher: train on cuda:0 (DPOTrainer refuses DataParallel, as SFTTrainer does)
    one_gpu(args, getattr(model, "labkit_decisions", None))
    train = train_rows if hasattr(train_rows, "column_names") else to_dataset(tokenizer, card, train_rows)
    evals = to_dataset(tokenizer, card, eval_rows) if eval_rows else None
    if kind == "orpo":
        train = train.map(orpo_row, remove_columns=list(PAIR_COLUMNS))
        evals = evals.map(orpo_row, remove_columns=list(PAIR_COLUMNS)) if evals is not None else None
        return LabkitORPOTrainer(model=model, args=args, train_dataset=train, eval_dataset=evals, processing_class=tokenizer,
                             callbacks=callbacks)
    peft = hasattr(model, "peft_config")
    reference = None if peft else _frozen_copy(model)
    trainer = LabkitDPOTrainer(model=model, ref_model=reference, args=args, train_dataset=train, eval_dataset=evals,
                           processing_class=tokenizer, callbacks=callbacks)
    if peft and "ref" in trainer.model.peft_config:
        # TRL copies a PeftModel's adapter into a frozen "ref" adapter. labkit's adapter is freshly initialised
        # (B = 0), so the base model with the adapter switched off is the same reference: drop the copy (no second
        # adapter in memory, checkpoints or the saved adapter); TRL then disables the adapter for reference passes.
        trainer.model.delete_adapter("ref")
    return trainer


def _frozen_copy(model: Any) -> Any:
    """The DPO reference for full fine-tuning: a frozen copy of the starting model (no reload from disk)."""
    reference = copy.deepcopy(model).eval()
    for param in reference.parameters():
        param.requires_grad_(False)
    return reference
