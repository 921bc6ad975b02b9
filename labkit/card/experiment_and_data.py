"""The `experiment` and `data` sections of a card (strict pydantic models) and `Strict`, the base of every section;
`labkit.card.schema` holds the other sections and assembles the `Card`.

Unknown keys, wrong types and missing required keys are errors (`Strict`); `labkit.card.load` turns them into
one line naming the file and the key.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Strict(BaseModel):
    """Base of every card section: unknown keys are errors; a validated card is frozen (`labkit.card.update.updated`
    gives a changed copy) and hashable, so what is computed from it can be cached (labkit.model.loading.decisions)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def __hash__(self) -> int:
        return hash((type(self), _hashable(self.model_dump())))


def _hashable(value: Any) -> Any:
    """A hashable twin of dumped card data (lists as tuples, mappings as sorted pairs); equal data, equal twins."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), _hashable(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


# --------------------------------------------------------------------------- experiment
class Target(Strict):
    behaviour: Literal["classification", "extraction", "format", "summarisation", "generation"]
    primary_metric: str = Field(description="metric name of labkit.scoring.names.METRICS, e.g. field_accuracy, or a "
                                "run metric (train_seconds, tokens_per_second, mfu, peak_memory_gib, cost)")
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


# what labkit (and a relative MLflow store) keeps in the runs root beside the experiments' folders — registry.jsonl,
# registry.torn/ and any registry.* — and W&B's offline files (wandb/), so no experiment may take these names
RESERVED_IN_RUNS_ROOT = ("registry", "mlruns", "mlartifacts", "mlflow.db", "wandb")


class Experiment(Strict):
    id: str = Field(description="groups variants; folder name under runs/")
    variant: str = Field(description="this card's name")
    hypothesis: str = Field(min_length=10, description="what you expect, written before compute")
    target: Target
    guardrails: list[Guardrail] = Field(description="what must not get worse (may be an empty list, said explicitly)")
    protocol_change: str | None = Field(
        default=None, description="why this variant changes a protocol-fixed key of its experiment (eval, train.seed, "
        "data, budget); without it such a variant is refused, with it it runs and is flagged not comparable")
    replicates: int = Field(
        default=1, ge=1, le=100, description="how many times `labkit run` trains this variant, each a run of its own "
        "with training seed train.seed + i (i = 0 … k-1; same data, split and evaluation): the comparison and the "
        "verdict then judge the variant across its seeds (docs/deciding.md#replicates)")

    @field_validator("id", "variant")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", value):
            raise ValueError("use letters, digits, '.', '_' or '-' (it becomes a folder name)")
        name = value.lower()
        if name in RESERVED_IN_RUNS_ROOT or name.startswith("registry."):
            raise ValueError(f"{value!r} is a name labkit uses in the runs folder (registry.jsonl and its kin): "
                             "choose another")
        return value


# --------------------------------------------------------------------------- data
class BuiltinSource(Strict):
    builtin: Literal["tickets", "dialogues"] = Field(description="tickets: support tickets with a JSON answer "
                                                     "(labkit.data.tickets); dialogues: two-speaker dialogues with a "
                                                     "reference summary (labkit.data.dialogues)")
    rows: int = Field(default=400, ge=20, le=20_000)
    seed: int = 7


class PathSource(Strict):
    path: str = Field(description="a .jsonl, .json, .csv or .parquet file, relative to the card")
    format: Literal["auto", "jsonl", "json", "csv", "parquet"] = "auto"


class HubSource(Strict):
    hf: str = Field(description="dataset name for datasets.load_dataset")
    revision: str = Field(description="exact revision (40-hex commit hash) of the dataset, or resolve: the hub's "
                          "current commit, looked up once at the experiment's first run and recorded")
    config: str | None = None
    split: str = Field(default="train", description="the one split read when data.split.from_source is not set")


class FilesSource(Strict):
    files: dict[str, str] = Field(description="one file per split of the source, {name: path}, relative to the card; "
                                  "data.split.from_source says which name is train, validation and test")
    format: Literal["auto", "jsonl", "json", "csv", "parquet"] = "auto"

    @field_validator("files")
    @classmethod
    def _some(cls, value: dict[str, str]) -> dict[str, str]:
        if not value:
            raise ValueError("name at least one file, e.g. {train: train.jsonl, validation: validation.jsonl}")
        return value


DataSource = Union[BuiltinSource, PathSource, HubSource, FilesSource]


class Fields(Strict):
    input: str = "text"
    target: str = "answer"
    category: str | None = "category"
    id: str | None = "id"
    group: str | None = Field(
        default=None, description="column of the source an example shares with others (a dialogue, a document id): "
        "the seeded split keeps each group on one side, a group in two given splits is leakage, and the verdict's "
        "bootstrap interval resamples whole groups (docs/cards.md#leakage); null: examples are independent")
    rejected: str | None = Field(
        default=None, description="column of the rejected answer: preference pairs for train.trainer dpo/orpo (the "
        "target is the chosen answer, which evaluation still compares against)")


class TargetFormat(Strict):
    # the keys only one kind takes (a child card that picks another kind drops the parent's: labkit.card.inherit)
    KIND_ONLY: ClassVar[dict[str, str]] = {"required_keys": "json", "optional_keys": "json", "category_key": "json",
                                           "labels": "label"}
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
    from_source: dict[Literal["train", "validation", "test"], str] | None = Field(
        default=None, description="the source's own splits kept as given: {train: <source split>, validation: …, test: …} "
        "(a hub data set's split names, or the names of data.source.files); test may be left out; fractions, seed and "
        "stratify are then ignored")

    @model_validator(mode="after")
    def _one_way(self) -> "Split":
        if self.field and self.from_source:
            raise ValueError("give either field (a column) or from_source (the source's splits), not both")
        if self.from_source is not None and not {"train", "validation"} <= set(self.from_source):
            raise ValueError("from_source needs at least train and validation, e.g. {train: train, validation: validation, "
                             "test: test}")
        return self


class Leakage(Strict):
    near_duplicate_threshold: float = Field(default=0.85, gt=0, le=1)
    policy: Literal["report", "drop_from_train", "fail"] = Field(
        default="drop_from_train", description="what to do with pairs across splits")
    within_split: Literal["report", "drop"] = Field(
        default="report", description="duplicates inside one split: report them, or keep the first (by id) only")


# apply_chat_template's own arguments: not variables a card may pass to the template
_RENDER_ARGUMENTS = {"conversation", "tools", "documents", "chat_template", "add_generation_prompt", "tokenize",
                     "continue_final_message", "padding", "truncation", "max_length", "return_tensors", "return_dict",
                     "return_assistant_tokens_mask", "tokenizer_kwargs", "kwargs"}
PLAIN_TEMPLATE = "### Instruction:\n{system}\n\n{instruction}\n\n### Response:\n"


class Prompt(Strict):
    # keys only training reads: left out of the keys of the base model's measurements, which do not depend on them
    TRAINING_ONLY: ClassVar[frozenset[str]] = frozenset({"loss_on"})
    # keys that fit the prompt to one model's chat template (where the system text goes, the template's variables):
    # protocol-fixed for one base model, free between base models (labkit.core.protocol.protocol_changes)
    TEMPLATE_FIT: ClassVar[frozenset[str]] = frozenset({"system_in", "chat_template_kwargs"})
    format: Literal["chat", "plain"] = Field(
        default="chat", description="chat: a chat template renders the messages; plain: `template` renders the text")
    chat_template: Literal["model", "chatml"] = Field(
        default="model", description="format chat: the tokenizer's own template, or ChatML added to a base model")
    template: str | None = Field(
        default=None, description="format plain: text with {system} and {instruction}, ending with the response marker")
    system: str | None = None
    system_in: Literal["system", "user"] = Field(
        default="system", description="format chat: where `system` goes: a system message, or the start of the user "
        "message (for chat templates without a system role, such as Gemma 2's)")
    instruction: str = Field(default="{input}", description="user message; {input} is replaced by the row's input")
    conversation: bool = Field(
        default=False, description="format chat: data.fields.input holds a conversation ({role, content} turns); its "
        "turns go through the chat template as they are, `instruction` wrapping the last user turn (docs/cards.md)")
    loss_on: Literal["last_answer", "every_answer"] = Field(
        default="last_answer", description="conversation: true: the loss on the last answer alone, or on every "
        "assistant turn of the conversation too (each with its end token); evaluation generates the last answer")
    chat_template_kwargs: dict[str, bool | int | float | str] = Field(
        default_factory=dict, description="format chat: variables every render of the chat template gets, e.g. "
        "{enable_thinking: false} for Qwen3 (its empty think block then ends the prompt instead of opening the answer)")

    @field_validator("instruction")
    @classmethod
    def _has_input(cls, value: str) -> str:
        if "{input}" not in value:
            raise ValueError("the instruction must contain {input}")
        return value

    @field_validator("template")
    @classmethod
    def _has_instruction(cls, value: str | None) -> str | None:
        if value is not None and "{instruction}" not in value:
            raise ValueError("the template must contain {instruction} (and may contain {system})")
        if value is not None and not value.rstrip():
            raise ValueError("the template is empty")
        return value

    @model_validator(mode="after")
    def _format_keys(self) -> "Prompt":
        if self.format == "plain" and self.chat_template != "model":
            raise ValueError(f"chat_template: {self.chat_template} is only for format: chat; remove it (format: plain "
                             "renders `template`)")
        if self.format == "chat" and self.template is not None:
            raise ValueError("template is only for format: plain; remove it or set format: plain")
        if self.chat_template_kwargs and self.format == "plain":
            raise ValueError("chat_template_kwargs is only for format: chat; remove it")
        if self.conversation and self.format == "plain":
            raise ValueError("conversation: true needs format: chat (a chat template renders the turns)")
        if self.loss_on == "every_answer" and not self.conversation:
            raise ValueError("loss_on: every_answer needs conversation: true (an input of one user turn has one answer, "
                             "the last); remove loss_on or set conversation: true")
        if bad := [k for k in self.chat_template_kwargs if not k.isidentifier() or k in _RENDER_ARGUMENTS]:
            raise ValueError(f"chat_template_kwargs: {bad[0]!r} is not a template variable (a Python name that is not "
                             "one of apply_chat_template's own arguments)")
        if self.system_in == "user" and self.format == "plain":
            raise ValueError("system_in is only for format: chat (the plain template places {system}); remove it")
        if self.system_in == "user" and not self.system and not self.conversation:  # or the conversations' system turn
            raise ValueError("system_in: user places `system`, which is not set; set system or remove system_in")
        return self

    @property
    def plain_template(self) -> str:
        """The plain format's template (the card's, or the default `### Instruction:` … `### Response:`)."""
        return self.template if self.template is not None else PLAIN_TEMPLATE


class RejectedFrom(Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)

    from_: Literal["base_model"] = Field(
        alias="from", description="base_model: the rejected answer of each training row the run reads (with "
        "train.max_steps, only those its steps read) and of each validation row is the base model's own greedy answer "
        "to its prompt (generated once with the eval settings, cached by model revision, data version and prompt format)")


class Data(Strict):
    source: DataSource
    fields: Fields = Field(default_factory=Fields)
    target_format: TargetFormat
    cleaning: list[CleaningRule] = Field(default_factory=lambda: ["normalise_whitespace", "drop_empty"])
    split: Split = Field(default_factory=Split)
    leakage: Leakage = Field(default_factory=Leakage)
    prompt: Prompt = Field(default_factory=Prompt)
    max_length: int = Field(default=512, ge=16)
    rejected: RejectedFrom | None = Field(
        default=None, description="preference pairs without a rejected column: {from: base_model} (train.trainer dpo / "
        "orpo); leave data.fields.rejected unset")

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
