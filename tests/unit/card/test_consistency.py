"""Cards that mean what they say: a setting the trainer or the data pipeline would silently ignore is refused when
the card loads (`labkit check` exits 2), one line naming the file, the line of the key and the fix
(`labkit.card.consistency`); the same keys at their defaults, or in the combination that reads them, load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from labkit.card.load import load_card
from labkit.errors import CardError


def _child(tmp_path: Path, body: str, name: str = "child.yaml", parent: str = "smoke.yaml") -> Path:
    card = tmp_path / name
    card.write_text(f"parent: {REPO / 'params' / parent}\n{body}")
    return card


def _labkit_check(card: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "LABKIT_RUNS": str(tmp_path / "runs")}
    return subprocess.run([sys.executable, "-m", "labkit", "check", str(card)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)


def test_a_warmup_with_a_constant_schedule_exits_2_with_the_fix(tmp_path: Path) -> None:
    card = _child(tmp_path, "train:\n  scheduler: constant\n  warmup_ratio: 0.03\n")
    done = _labkit_check(card, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "warmup_ratio" in line]
    assert len(lines) == 1 and f"{card}:4: train.warmup_ratio: 0.03" in lines[0], lines
    assert "constant_with_warmup" in lines[0]
    fixed = _child(tmp_path, "train:\n  scheduler: constant_with_warmup\n  warmup_ratio: 0.03\n", "fixed.yaml")
    assert _labkit_check(fixed, tmp_path).returncode == 0


def test_a_constant_card_that_never_mentions_warmup_loads_with_no_warmup(tmp_path: Path) -> None:
    raw = (REPO / "params" / "smoke.yaml").read_text().replace("\n        warmup_ratio: 0.0,", "\n       ")
    assert "warmup" not in raw
    card = tmp_path / "no-warmup.yaml"
    card.write_text(raw)
    train = load_card(card).card.train
    assert train.scheduler == "constant" and train.warmup_ratio == 0.0  # what the schedule does, recorded
    cosine = load_card(_child(tmp_path, "train: {scheduler: cosine}\n", "cosine.yaml")).card.train
    assert cosine.warmup_ratio == 0.0  # smoke sets 0.0; the default elsewhere stays 0.05:
    assert load_card(REPO / "params" / "quickstart.yaml").card.train.warmup_ratio == 0.05


def test_the_shipped_gpu_cards_warm_up_then_hold() -> None:
    for name in ("dialogsum-llama3-8b-qlora-sft.yaml", "dialogsum-phi2-qlora-sft.yaml"):
        train = load_card(REPO / "params" / "examples" / name).card.train
        assert (train.scheduler, train.warmup_ratio) == ("constant_with_warmup", 0.03)


NO_OPS = {  # body of a child of smoke.yaml → (the key faulted on its line, a word of the fix)
    "save_steps with early stopping": (
        "train: {eval_steps: 4, save_steps: 2, early_stopping: {metric: eval_loss, patience: 2}}\n",
        "train.save_steps", "remove train.save_steps"),
    "eval_steps past max_steps": ("train: {eval_steps: 20}\n", "train.eval_steps", "at most 8"),
    "fsdp_state_dict without fsdp": ("distributed: {fsdp_state_dict: sharded}\n", "distributed.fsdp_state_dict",
                                     "strategy: fsdp"),
    "main_process_port without a launcher": ("distributed: {main_process_port: 29500}\n",
                                             "distributed.main_process_port", "launcher: accelerate"),
    "system without {system}": ("data:\n  prompt:\n    format: plain\n    chat_template: model\n    template: "
                                "\"Q: {instruction}\\nA: \"\n    system: be brief\n", "data.prompt.system",
                                "add {system}"),
    "every answer with a preference trainer": ("train: {trainer: dpo}\ndata: {fields: {rejected: rejected}, prompt: "
                                               "{loss_on: every_answer}}\n", "data.prompt.loss_on",
                                               "train.trainer: sft"),
    "fractions with a split column": ("data: {split: {field: split}}\n", "data.split.validation",
                                      "remove data.split.validation"),
    "required_keys on a label target": ("data: {target_format: {required_keys: [label]}}\n",
                                        "data.target_format.required_keys", "remove it"),
    "category_key on a text target": ("data: {target_format: {category_key: topic}}\n",
                                      "data.target_format.category_key", "remove it"),
    "no category_key with per_category_f1": ("data: {target_format: {category_key: null}}\n",  # smoke's guardrail
                                             "data.target_format.category_key", "set category_key"),
}


PARENTS = {"required_keys on a label target": "examples/own-data.yaml",
           "every answer with a preference trainer": "examples/support-chat.yaml",
           "category_key on a text target": "examples/dialogue-summary-smollm2.yaml"}


@pytest.mark.parametrize("name", sorted(NO_OPS))
def test_each_silent_no_op_is_refused_on_its_line(tmp_path: Path, name: str) -> None:
    body, key, fix = NO_OPS[name]
    card = _child(tmp_path, body, parent=PARENTS.get(name, "smoke.yaml"))
    with pytest.raises(CardError) as err:
        load_card(card)
    message = str(err.value)
    assert f": {key}: " in message and fix in message, message
    path, line = message.split(": ", 1)[0].rsplit(":", 1)
    parent = REPO / "params" / PARENTS.get(name, "smoke.yaml")
    assert Path(path) in (card, parent), message  # the card that writes the key (the parent, when inherited)
    assert key.split(".")[-1] in Path(path).read_text().splitlines()[int(line) - 1], message  # on the key's line


def test_the_same_keys_where_they_are_read_load(tmp_path: Path) -> None:
    fine = {
        "early stopping with save_steps = eval_steps": "train: {eval_steps: 4, save_steps: 4, early_stopping: "
                                                       "{metric: eval_loss, patience: 2}}\n",
        "eval_steps within the run": "train: {eval_steps: 8}\n",
        "plain template with {system}": "data:\n  prompt:\n    format: plain\n    chat_template: model\n    template: "
                                        "\"{system}\\nQ: {instruction}\\nA: \"\n    system: be brief\n",
    }
    for name, body in fine.items():
        assert load_card(_child(tmp_path, body, f"{abs(hash(name))}.yaml")), name
    no_category = "data: {target_format: {category_key: null}}\nexperiment: {guardrails: [{metric: json_valid_rate, min: 0}]}\n"
    assert load_card(_child(tmp_path, no_category, "no-category.yaml")).card.data.target_format.category_key is None
    every = load_card(REPO / "params" / "examples" / "support-chat-every-answer.yaml").card  # with the sft trainer
    assert (every.data.prompt.loss_on, every.train.trainer) == ("every_answer", "sft")
    label = "data: {target_format: {kind: label, required_keys: [], category_key: category}}\n"  # the defaults
    assert load_card(_child(tmp_path, label, "label.yaml", "examples/own-data.yaml"))


def test_an_archived_resolved_card_with_given_splits_loads(tmp_path: Path) -> None:
    """Every key written out at its default (as a run archives its card) is never a no-op."""
    from labkit.card.load import dump_yaml

    loaded = load_card(REPO / "params" / "examples" / "dialogsum-mistral-7b-qlora-orpo.yaml")
    archived = tmp_path / "card.yaml"
    archived.write_text(dump_yaml(loaded.resolved))
    again = load_card(archived)
    assert again.card.data.split.from_source is not None and again.hash == loaded.hash


@pytest.mark.parametrize("body, key", [
    ("method: {kind: full, r: 8}\n", "method.r"),  # a LoRA setting on a full fine-tuning card
    ("method: {kind: lora, quantisation: {type: nf4}}\n", "method.quantisation"),  # 4-bit settings without qlora
    ("train: {beta: 0.2}\n", "train.beta"),  # a preference setting on an sft card
    ("train: {trainer: orpo, packing: true}\ndata: {fields: {rejected: rejected}}\n", "train.packing"),
])
def test_settings_of_another_method_or_trainer_are_refused_too(tmp_path: Path, body: str, key: str) -> None:
    """The schema already refuses these (strict sections, the trainer checks); listed so the set stays complete."""
    with pytest.raises(CardError, match=rf": {key}: "):
        load_card(_child(tmp_path, body))
