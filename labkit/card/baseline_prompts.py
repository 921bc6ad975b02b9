"""The card's `eval.baseline_prompts`: the prompts stage 01 measures the base model under.

A base model never saw the training prompt; measured only under it, the baseline can be a straw man. Stage 01
measures every prompt listed here on the evaluation split and takes the strongest on the primary metric as the
reference of the hypothesis (`labkit.evaluate.baseline_prompts`). The tuned model is always evaluated with the
training prompt. Items:

- `training`: the training prompt (`data.prompt`), as the tuned model sees it.
- `chat_template`: the tokenizer's own chat template with the same messages (skipped, with the reason recorded,
  when the tokenizer has none or the training prompt already is it).
- `{template: "Instruct: {input}\\nOutput:", stop: ["\\nInstruct:"]}`: a card-given completion format, e.g. the one
  the model's documentation uses, with the strings generation stops on.
- `{few_shot: 3}`: k examples of the training split (never the evaluation split) before the question, in the
  training prompt or in `template` when given.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, TypeAdapter, field_validator

from labkit.card.experiment_and_data import Strict

INPUT = "{input}"
NAME = r"^[A-Za-z0-9_.-]{1,64}$"  # a file name part (prompts/<name>_predictions.jsonl)


def _check_template(value: str | None) -> str | None:
    if value is not None and INPUT not in value:
        raise ValueError(f"the template {value[:40]!r} lacks the input placeholder {INPUT}: write {INPUT} where the "
                         "row's input goes, e.g. \"Instruct: {input}\\nOutput:\"")
    return value


class TemplatePrompt(Strict):
    template: str = Field(description="the prompt text with {input} where the row's input goes, ending where the "
                          "answer starts (e.g. Phi-2's \"Instruct: {input}\\nOutput:\")")
    stop: list[str] = Field(default_factory=list, description="strings generation stops on (cut from the answer), "
                            "e.g. [\"\\nInstruct:\"]; the model's EOS always stops it")
    name: str | None = Field(default=None, pattern=NAME, description="the name in the records (default: template, "
                             "template_2, …)")

    @field_validator("template")
    @classmethod
    def _has_input(cls, value: str | None) -> str | None:
        return _check_template(value)


class FewShotPrompt(Strict):
    few_shot: int = Field(ge=1, le=32, description="k examples of the training split put before the question")
    template: str | None = Field(default=None, description="the format of each example and of the question (with "
                                 "{input}); default: the training prompt (chat turns for a chat prompt)")
    stop: list[str] = Field(default_factory=list, description="strings generation stops on (cut from the answer)")
    seed: int = Field(default=0, description="which training rows are drawn (the same k for every evaluated row)")
    name: str | None = Field(default=None, pattern=NAME, description="the name in the records (default: few_shot_<k>)")

    @field_validator("template")
    @classmethod
    def _has_input(cls, value: str | None) -> str | None:
        return _check_template(value)


def _kind(value: Any) -> str:
    """Which item a card value is, so an error names that item's keys (not every alternative's)."""
    if isinstance(value, (TemplatePrompt, FewShotPrompt)):
        return type(value).__name__
    if isinstance(value, dict):
        return "FewShotPrompt" if "few_shot" in value else "TemplatePrompt"
    return "named"


BaselinePrompt = Annotated[Union[Annotated[Literal["training", "chat_template"], Tag("named")],
                                 Annotated[TemplatePrompt, Tag("TemplatePrompt")],
                                 Annotated[FewShotPrompt, Tag("FewShotPrompt")]], Discriminator(_kind)]
DEFAULT: list[BaselinePrompt] = ["training"]
_ADAPTER: TypeAdapter[BaselinePrompt] = TypeAdapter(BaselinePrompt)


def prompt_names(prompts: list[BaselinePrompt]) -> list[str]:
    """The record name of each baseline prompt: training, chat_template, its `name`, else template[_i] / few_shot_<k>.

    Args:
        prompts: `eval.baseline_prompts`.
    Returns:
        one name per prompt, in order (a repeated default name gets _2, _3, …).
    """
    names: list[str] = []
    for item in prompts:
        if isinstance(item, str):
            base = item
        else:
            base = item.name or ("template" if isinstance(item, TemplatePrompt) else f"few_shot_{item.few_shot}")
        name, i = base, 2
        while name in names:
            name, i = f"{base}_{i}", i + 1
        names.append(name)
    return names


def check_prompts(prompts: list[BaselinePrompt]) -> list[BaselinePrompt]:
    """`eval.baseline_prompts` validation: not empty, no name twice (the records are keyed by name)."""
    if not prompts:
        raise ValueError("eval.baseline_prompts is empty: list at least `training` (the default)")
    given = [p.name for p in prompts if not isinstance(p, str) and p.name]
    fixed = [p for p in prompts if isinstance(p, str)]
    for seen in (given, fixed):
        dup = sorted({n for n in seen if seen.count(n) > 1})
        if dup:
            raise ValueError(f"eval.baseline_prompts names {dup[0]!r} twice: give each prompt once (a distinct `name`)")
    return prompts


def spec(item: BaselinePrompt) -> Any:
    """A baseline prompt as JSON (the record of stage 01), readable back with `parse`."""
    return item if isinstance(item, str) else item.model_dump(mode="json")


def parse(value: Any) -> BaselinePrompt:
    """A baseline prompt from its JSON record (`spec`)."""
    return _ADAPTER.validate_python(value)
