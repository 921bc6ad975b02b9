"""The experiment and data sections of a card (strict pydantic models); `labkit.card.schema` assembles the card.

Unknown keys, wrong types and missing required keys are errors (`Strict`); `labkit.card.load` turns them into
one line naming the file and the key.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Strict(BaseModel):
    """Base of every card section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=False)


# --------------------------------------------------------------------------- experiment
class Target(Strict):
    behaviour: Literal["classification", "extraction", "format", "summarisation", "generation"]
    primary_metric: str = Field(description="metric name of labkit.scoring.metrics.METRICS, e.g. field_accuracy, or a "
                                "run metric (train_seconds, tokens_per_second, peak_memory_gib, cost)")
    against: str = Field(default="baseline", description="the reference the hypothesis is judged against: baseline (the "
                         "base model) or the variant name of another card of the same experiment (its latest completed run)")
    min_improvement: float | None = Field(
        default=None, description="gain over the reference that confirms the hypothesis (in the metric's good "
        "direction; may be negative: 'at most 0.01 worse')")
    max_ratio: float | None = Field(default=None, gt=0, description="value / reference value must be at most this")
    min_ratio: float | None = Field(default=None, gt=0, description="value / reference value must be at least this")

    @model_validator(mode="after")
    def _one_rule(self) -> "Target":
        if self.min_improvement is None and self.max_ratio is None and self.min_ratio is None:
            raise ValueError("the target needs min_improvement, max_ratio or min_ratio")
        return self


class Guardrail(Strict):
    metric: str
    min: float | None = Field(default=None, description="the tuned value must be at least this")
    max: float | None = Field(default=None, description="the tuned value must be at most this")
    max_drop: float | None = Field(default=None, description="largest allowed drop below the reference")
    max_ratio: float | None = Field(default=None, gt=0, description="value / reference value must be at most this")
    min_ratio: float | None = Field(default=None, gt=0, description="value / reference value must be at least this")

    @model_validator(mode="after")
    def _one_bound(self) -> "Guardrail":
        if all(v is None for v in (self.min, self.max, self.max_drop, self.max_ratio, self.min_ratio)):
            raise ValueError("a guardrail needs one of min, max, max_drop, max_ratio or min_ratio")
        return self


class Experiment(Strict):
    id: str = Field(description="groups variants; folder name under runs/")
    variant: str = Field(description="this card's name")
    hypothesis: str = Field(min_length=10, description="what you expect, written before compute")
    target: Target
    guardrails: list[Guardrail] = Field(description="what must not get worse (may be an empty list, said explicitly)")
    protocol_change: str | None = Field(
        default=None, description="why this variant changes a protocol-fixed key of its experiment (eval, train.seed, "
        "data, budget); without it such a variant is refused, with it it runs and is flagged not comparable")

    @field_validator("id", "variant")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", value):
            raise ValueError("use letters, digits, '.', '_' or '-' (it becomes a folder name)")
        return value


# --------------------------------------------------------------------------- data
class BuiltinSource(Strict):
    builtin: Literal["tickets"]
    rows: int = Field(default=400, ge=20, le=20_000)
    seed: int = 7


class PathSource(Strict):
    path: str = Field(description="a .jsonl, .json, .csv or .parquet file, relative to the card")
    format: Literal["auto", "jsonl", "json", "csv", "parquet"] = "auto"


class HubSource(Strict):
    hf: str = Field(description="dataset name for datasets.load_dataset")
    revision: str = Field(description="exact revision (commit hash) of the dataset")
    config: str | None = None
    split: str = "train"


DataSource = Union[BuiltinSource, PathSource, HubSource]


class Fields(Strict):
    input: str = "text"
    target: str = "answer"
    category: str | None = "category"
    id: str | None = "id"
    rejected: str | None = Field(
        default=None, description="column of the rejected answer: preference pairs for train.trainer dpo/orpo (the "
        "target is the chosen answer, which evaluation still compares against)")


class TargetFormat(Strict):
    kind: Literal["json", "label", "text"] = Field(
        description="json: a JSON object with required keys; label: the category name; text: free text"
    )
    required_keys: list[str] = Field(default_factory=list, description="json: keys every reference holds")
    optional_keys: list[str] = Field(default_factory=list, description="json: keys a reference may leave out (a "
                                     "reference without one expects no value for it: a perfect answer still scores 1.0)")
    category_key: str | None = Field(default="category", description="JSON key that holds the category")
    labels: list[str] | None = Field(
        default=None, description="kind label: the known label set (default: the labels seen in the training split)")

    @model_validator(mode="after")
    def _keys(self) -> "TargetFormat":
        if self.kind == "json" and not self.required_keys:
            raise ValueError("kind json needs required_keys")
        if self.kind != "json" and self.optional_keys:
            raise ValueError("optional_keys applies to kind json only; remove it")
        both = sorted(set(self.required_keys) & set(self.optional_keys))
        if both:
            raise ValueError(f"{', '.join(both)} listed as both required and optional: keep each key in one list")
        return self


class RegexRule(Strict):
    field: Literal["input", "target"] = "input"
    pattern: str = Field(description="a Python regular expression, searched anywhere in the field")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression ({exc})") from None
        return value


CleaningRule = Union[
    Literal["normalise_whitespace", "strip", "drop_empty", "drop_exact_duplicates"],
    dict[Literal["drop_longer_than_tokens", "drop_longer_than_chars"], int],
    dict[Literal["drop_matching", "keep_matching"], RegexRule],
    dict[Literal["drop_target_failing_schema"], dict[str, Any]],
]


class Split(Strict):
    validation: float = Field(default=0.15, gt=0, lt=0.5)
    test: float = Field(default=0.15, ge=0, lt=0.5)
    seed: int = 13
    stratify: str | None = Field(default="category", description="column to stratify by, or null")
    field: str | None = Field(default=None, description="a column that already says train/validation/test (fractions are then ignored)")


class Leakage(Strict):
    near_duplicate_threshold: float = Field(default=0.85, gt=0, le=1)
    policy: Literal["report", "drop_from_train", "fail"] = Field(
        default="drop_from_train", description="what to do with pairs across splits")
    within_split: Literal["report", "drop"] = Field(
        default="report", description="duplicates inside one split: report them, or keep the first (by id) only")


class Prompt(Strict):
    chat_template: Literal["model"] = Field(default="model", description="use the tokenizer's own chat template")
    system: str | None = None
    instruction: str = Field(default="{input}", description="user message; {input} is replaced by the row's input")

    @field_validator("instruction")
    @classmethod
    def _has_input(cls, value: str) -> str:
        if "{input}" not in value:
            raise ValueError("the instruction must contain {input}")
        return value


class Data(Strict):
    source: DataSource
    fields: Fields = Field(default_factory=Fields)
    target_format: TargetFormat
    cleaning: list[CleaningRule] = Field(default_factory=lambda: ["normalise_whitespace", "drop_empty"])
    split: Split = Field(default_factory=Split)
    leakage: Leakage = Field(default_factory=Leakage)
    prompt: Prompt = Field(default_factory=Prompt)
    max_length: int = Field(default=512, ge=16)

    @field_validator("cleaning")
    @classmethod
    def _schemas(cls, rules: list[Any]) -> list[Any]:
        for rule in rules:
            if isinstance(rule, dict) and "drop_target_failing_schema" in rule:
                import jsonschema  # a second to import: only cards with a schema rule pay it

                try:
                    jsonschema.validators.validator_for(rule["drop_target_failing_schema"]).check_schema(
                        rule["drop_target_failing_schema"])
                except jsonschema.SchemaError as exc:
                    raise ValueError(f"drop_target_failing_schema is not a valid JSON Schema ({exc.message})") from None
        return rules


# --------------------------------------------------------------------------- tracking
class MlflowTracking(Strict):
    uri: str = Field(min_length=1, description="the MLflow tracking URI: a local store (sqlite:///mlflow.db, a folder "
                     "path) or a server (http://host:5000); a relative path is taken from the runs folder")


class Tracking(Strict):
    """Where runs are also reported (off by default); not protocol-fixed: tracking never changes a result."""

    mlflow: MlflowTracking | None = Field(default=None, description="mirror every run into MLflow (one MLflow "
                                          "experiment per experiment.id): card, data version, metrics, status, notebooks")
    tensorboard: bool = Field(default=False, description="stage 04 writes TensorBoard event files to training/tensorboard")
