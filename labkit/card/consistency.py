"""Cards that mean what they say: settings the trainer or the data pipeline would silently ignore in the card's
combination of keys are refused, each with its fix.

Every rule reads the validated card and returns the key it faults and why (with the fix), or None. `load_card`
runs them all (so `labkit check` and every stage refuse such a card) and reports the first problem as one line
naming the file and line of the key. A rule fires on a value that differs from what the ignoring code does anyway
(a key left at its default is never faulted), so a resolved card archived with a run (every key written out)
loads as it did.

The rules, read against transformers 5.24, TRL 1.16 and labkit's own trainer and data code:

- train.warmup_ratio with scheduler constant: transformers' `get_scheduler` returns the constant schedule without
  reading the warm-up (fix: `constant_with_warmup`). A card that leaves warmup_ratio out gets 0 with constant.
- train.save_steps with train.early_stopping: every evaluation is then the checkpoint (save_steps = eval_steps,
  so the best one can be restored); another save_steps is overridden.
- train.eval_steps beyond train.max_steps: no validation pass would run (nor early stopping).
- distributed.fsdp_state_dict other than full without strategy fsdp; distributed.num_machines with launcher none:
  read only by the launcher they belong to. distributed.machine_rank, main_process_ip and main_process_port: retired
  (the launcher's environment says them on each machine, labkit.core.machines); an archived card's defaults load.
- train.packing with DeepSpeed ZeRO-3: labkit checks, before training, that packed examples do not attend to each
  other (a forward pass of the whole model); ZeRO-3 partitions the weights when the model loads, so no process can
  run it (fix: zero_stage 2, strategy fsdp, whose rank 0 holds the whole model, or packing off). Unlike the others
  this rule refuses a combination labkit cannot check, not a no-op.
- data.prompt.system with a plain template that has no {system}: the text never reaches the prompt.
- data.prompt.loss_on: every_answer with train.trainer dpo or orpo: a preference pair compares the last answers (the
  earlier turns are the pair's shared prompt), so the earlier answers would carry no loss.
- data.split.validation / test / seed / stratify with data.split.field or from_source: the splits are given, the
  fractions unused.
- data.target_format.required_keys or category_key on a label or text target: only a JSON answer has keys.
- data.target_format.category_key: null on a json target judged by accuracy, macro_f1 or per_category_f1: those read
  the category from the answer's category key, so every answer would score as no category (stage 01 also refuses a
  key that no reference answer holds: `labkit.data.checks.check_category_key`).
"""

from __future__ import annotations

from typing import Callable

from labkit.card.experiment_and_data import Split, TargetFormat
from labkit.card.schema import Card, Distributed
from labkit.errors import CardError
from labkit.scoring.names import METRICS

Problem = tuple[str, str]  # (dotted key, what is wrong and the fix)


def warmup_with_constant(card: Card) -> Problem | None:
    """A warm-up with `scheduler: constant`, which has none."""
    t = card.train
    if t.scheduler == "constant" and t.warmup_ratio > 0:
        return ("train.warmup_ratio", f"{t.warmup_ratio:g} does nothing with train.scheduler: constant (transformers' "
                "constant schedule has no warm-up and ignores it); set train.scheduler: constant_with_warmup to warm "
                "up and then hold the learning rate, or train.warmup_ratio: 0")
    return None


def save_steps_with_early_stopping(card: Card) -> Problem | None:
    """A checkpoint interval that early stopping overrides (every evaluation is the checkpoint)."""
    t = card.train
    if t.early_stopping is not None and t.save_steps is not None and t.save_steps != t.eval_steps:
        return ("train.save_steps", f"{t.save_steps} is overridden by train.early_stopping (every evaluation is a "
                "checkpoint, so the best one can be restored: save_steps = eval_steps); remove train.save_steps and set "
                "train.eval_steps to choose the interval")
    return None


def eval_steps_past_the_end(card: Card) -> Problem | None:
    """A validation interval longer than the whole run."""
    t = card.train
    if t.max_steps is not None and t.eval_steps is not None and t.eval_steps > t.max_steps:
        return ("train.eval_steps", f"{t.eval_steps} is more than train.max_steps {t.max_steps}: no validation pass "
                f"would run{' (nor early stopping)' if t.early_stopping else ''}; set eval_steps to at most {t.max_steps}")
    return None


# the keys that left the card (issue 26) → what now says it, read by labkit.core.machines on every machine
RETIRED = {"machine_rank": "which machine this is", "main_process_ip": "the head machine's address",
           "main_process_port": "the head machine's port"}
ENVIRONMENT = ("SKYPILOT_NODE_RANK / SKYPILOT_NODE_IPS, or SLURM_NODEID / SLURM_JOB_NODELIST, or NODE_RANK / "
               "MASTER_ADDR / MASTER_PORT; LABKIT_MASTER_PORT sets the port")


def launcher_keys(card: Card) -> Problem | None:
    """Distributed keys that only another launcher or strategy reads."""
    d = card.distributed
    if d.fsdp_state_dict != "full" and d.strategy != "fsdp":
        return ("distributed.fsdp_state_dict", f"{d.fsdp_state_dict} applies to strategy fsdp only (this card: "
                f"{d.strategy}); remove it, or set distributed.strategy: fsdp")
    for key, variables in RETIRED.items():
        if getattr(card.distributed, key) != Distributed.model_fields[key].default:
            return (f"distributed.{key}", f"no longer a card key: every machine of a run shares the card, and "
                    f"{variables} comes from the environment its launcher sets on each machine ({ENVIRONMENT}); remove "
                    "it (a run on several machines sets distributed.num_machines with launcher: accelerate)")
    if d.launcher == "none" and d.num_machines != 1:
        return ("distributed.num_machines", "read only by `accelerate launch`, and this card trains in the stage's "
                "own process (launcher none); remove it, or set distributed.launcher: accelerate with a strategy")
    return None


def packing_under_zero3(card: Card) -> Problem | None:
    """Packing, whose isolation check needs the whole model in one process, with ZeRO-3's partitioned weights."""
    d = card.distributed
    if card.train.packing and d.strategy == "deepspeed" and d.zero_stage == 3:
        return ("train.packing", "true with distributed.strategy: deepspeed, zero_stage: 3: ZeRO-3 partitions the "
                "weights as the model loads, so no process holds the whole model to run labkit's packing isolation "
                "check before training; set distributed.zero_stage: 2, or distributed.strategy: fsdp (rank 0 loads "
                "the whole model and checks), or train.packing: false")
    return None


def system_without_placeholder(card: Card) -> Problem | None:
    """A system text the plain template never shows."""
    prompt = card.data.prompt
    if prompt.format == "plain" and prompt.system and "{system}" not in prompt.plain_template:
        return ("data.prompt.system", "data.prompt.template has no {system}, so this text never reaches the prompt; "
                "add {system} to the template, or remove data.prompt.system")
    return None


def every_answer_in_pairs(card: Card) -> Problem | None:
    """Loss on every answer of a conversation for a trainer that compares the last answers of a pair."""
    if card.data.prompt.loss_on == "every_answer" and card.train.trainer != "sft":
        return ("data.prompt.loss_on", f"every_answer with train.trainer {card.train.trainer}: a preference pair "
                "compares its two last answers, the earlier turns are the prompt they share, so the earlier answers "
                "would carry no loss; remove data.prompt.loss_on (or set train.trainer: sft to learn every answer)")
    return None


def fractions_with_given_splits(card: Card) -> Problem | None:
    """Split fractions, seed or stratification next to splits that are given (a column or the source's own)."""
    spec = card.data.split
    given = "data.split.field" if spec.field else "data.split.from_source" if spec.from_source is not None else None
    if given is None:
        return None
    for key in ("validation", "test", "seed", "stratify"):
        if getattr(spec, key) != Split.model_fields[key].default:
            return (f"data.split.{key}", f"ignored: {given} gives the splits, so fractions, seed and stratify are not "
                    f"used; remove data.split.{key}")
    return None


def keys_of_a_non_json_target(card: Card) -> Problem | None:
    """JSON keys declared for a label or text target."""
    fmt = card.data.target_format
    if fmt.kind == "json":
        return None
    if fmt.required_keys:
        return ("data.target_format.required_keys", f"only a kind json answer has keys (this card's kind is "
                f"{fmt.kind}); remove it")
    if fmt.category_key != TargetFormat.model_fields["category_key"].default:
        return ("data.target_format.category_key", f"only a kind json answer has a category key (this card's kind is "
                f"{fmt.kind}{': the answer is the label' if fmt.kind == 'label' else ''}); remove it")
    return None


def category_metrics(card: Card) -> list[tuple[str, str]]:
    """The metrics a card names that compare the answer's category with the category column.

    Args:
        card: a validated card (its metric names are known).
    Returns:
        (dotted key, metric name) per use (`Card.metric_uses`).
    """
    return [(key, name) for key, name in card.metric_uses() if METRICS[name][0] == "category"]


def category_metric_without_key(card: Card) -> Problem | None:
    """A category metric on a JSON target that names no key to read the answer's category from."""
    fmt, uses = card.data.target_format, category_metrics(card)
    if fmt.kind == "json" and not fmt.category_key and uses:
        return ("data.target_format.category_key", f"null, but {uses[0][0]} is {uses[0][1]}, which compares the "
                "answer's category (this key of its JSON) with data.fields.category: every answer would score as no "
                "category; set category_key to the JSON key that holds the category, or judge field_accuracy")
    return None


RULES: tuple[Callable[[Card], Problem | None], ...] = (
    warmup_with_constant, save_steps_with_early_stopping, eval_steps_past_the_end, launcher_keys, packing_under_zero3,
    system_without_placeholder, every_answer_in_pairs, fractions_with_given_splits, keys_of_a_non_json_target,
    category_metric_without_key)


def problems(card: Card) -> list[Problem]:
    """Every silent no-op in a card.

    Args:
        card: a validated card.
    Returns:
        (key, message with the fix) per rule that fires, in RULES order.
    """
    return [found for rule in RULES if (found := rule(card)) is not None]


def check_consistency(card: Card, where: Callable[[str], str]) -> None:
    """Refuse a card with a setting that would silently do nothing.

    Args:
        card: the validated card.
        where: `file:line` of a dotted key (`LoadedCard.where`).
    Raises:
        CardError: one line naming the file, line, key and the fix (the first problem; more are counted).
    """
    found = problems(card)
    if found:
        key, message = found[0]
        more = f" (+{len(found) - 1} more problem{'s' if len(found) > 2 else ''})" if len(found) > 1 else ""
        raise CardError(f"{where(key)}: {key}: {message}{more}")
