"""`labkit export` for every prompt format and for QLoRA: the model card's snippet reproduces the evaluation's answer
in a fresh process, a QLoRA adapter is merged into its dequantised 4-bit weights in 16 bits and the merged model is
scored, a float32 run merges in the dtype `--dtype` names, and an export that would not fit is refused with the
number.

Real components throughout: the smoke run (tiny offline Llama, its own ChatML chat template) and a QLoRA smoke
variant with the plain prompt format, both through `labkit run`; the snippets and the reload checks run as their own
processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, labkit

from transformers import AutoTokenizer

from labkit.card.load import load_card
from labkit.cli.main import main as cli_main
from labkit.core import io
from labkit.core import runs as R
from labkit.data.prompting import prompt_ids
from labkit.errors import ExportRefused
from labkit.export.deliver import export

QLORA_PLAIN = """parent: {smoke}
experiment:
  variant: tiny-qlora-plain
  hypothesis: >-
    A tiny random Llama with QLoRA (4-bit NF4 base, bfloat16 compute) and the plain prompt format, trained for a
    few steps, raises field accuracy by at least 0.05 (a plumbing check of the export, not a research claim).
data:
  prompt: {{format: plain}}
model: {{source: "tiny:llama", dtype: bfloat16}}  # the 16-bit base of a GPU run (auto is float32 on the CPU)
method:
  kind: qlora
  r: 4
  alpha: 8
  dropout: 0.0
  target_modules: all-linear
  quantisation: {{type: nf4, double_quant: true, compute_dtype: bfloat16}}
"""


def _copy_root(run_dir: Path, dest: Path) -> Path:
    shutil.copytree(run_dir.parent.parent, dest)
    return dest / run_dir.parent.name / run_dir.name


@pytest.fixture(scope="module")
def chatml_export(smoke_run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke run (chat format, the tiny model's ChatML template) exported; returns the run folder."""
    run = _copy_root(smoke_run[0], tmp_path_factory.mktemp("chatml") / "runs")
    assert export(run.name, run.parent.parent)["ok"]
    return run


@pytest.fixture(scope="module")
def qlora_plain_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A QLoRA run with the plain prompt format through `labkit run`, exported with merged/; returns the run folder."""
    base = tmp_path_factory.mktemp("qlora")
    card = base / "qlora-plain.yaml"
    card.write_text(QLORA_PLAIN.format(smoke=REPO / "params" / "smoke.yaml"), encoding="utf-8")
    proc = labkit("run", str(card), runs=base / "runs", timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = [p for p in (base / "runs" / "smoke").iterdir() if not p.name.startswith("_")]
    assert export(run.name, run.parent.parent, merged=True)["ok"]
    return run


def _snippet(run: Path) -> str:
    text = (run / "export" / "README.md").read_text(encoding="utf-8")
    return text.split("## How to load it")[1].split("```python\n")[1].split("```")[0]


def _first_validation_row(run: Path) -> tuple[dict, str]:
    from labkit.data.prepare import load_split

    card = load_card(run / "card.yaml").card
    row = load_split(R.Run(run), card.eval.split)[0]
    predictions = {r["id"]: r["prediction"] for r in io.read_jsonl(run / "comparison" / "tuned_predictions.jsonl")}
    return row, predictions[row["id"]]


def _run_snippet(run: Path) -> tuple[str, str]:
    """The model card's snippet with the first validation row's input, in a fresh process; (its answer, the run's)."""
    code = _snippet(run)
    row, expected = _first_validation_row(run)
    assert code.count("text = 'your input here'") == 1
    code = code.replace("text = 'your input here'", f"text = {row['input']!r}") + "print('@@ids@@', ids)\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=run / "export", capture_output=True, text=True, env=dict(os.environ),
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer, ids = proc.stdout.rsplit("@@ids@@", 1)
    tokenizer = AutoTokenizer.from_pretrained(run / "export" / "adapter")
    card = load_card(run / "card.yaml").card
    assert json.loads(ids) == prompt_ids(tokenizer, card, row["input"])  # the training prompt, token for token
    return answer.strip(), expected


def test_chatml_snippet_gives_the_evaluations_answer(chatml_export) -> None:
    code = _snippet(chatml_export)
    assert "apply_chat_template" in code and "eos_token_id=stop" in code
    answer, expected = _run_snippet(chatml_export)
    assert answer == expected


def test_plain_snippet_gives_the_evaluations_answer_without_a_chat_template(qlora_plain_export) -> None:
    code = _snippet(qlora_plain_export)
    assert "apply_chat_template" not in code and "### Instruction:" in code and "BitsAndBytesConfig" in code
    answer, expected = _run_snippet(qlora_plain_export)
    assert answer == expected


def test_generation_config_carries_the_evaluations_stop_list(chatml_export, qlora_plain_export) -> None:
    from transformers import GenerationConfig

    from labkit.evaluate.generation import stop_ids
    from labkit.model.sources import resolve

    base = GenerationConfig.from_pretrained(resolve("tiny:llama").location)
    for run in (chatml_export, qlora_plain_export):
        adapter = run / "export" / "adapter"
        generation = GenerationConfig.from_pretrained(adapter)
        tokenizer = AutoTokenizer.from_pretrained(adapter)
        expected = stop_ids(type("M", (), {"generation_config": base})(), tokenizer)  # what the evaluation stopped on
        assert isinstance(generation.eos_token_id, list) and generation.eos_token_id == expected
        assert f"stop = {expected!r}" in _snippet(run)


def test_qlora_is_merged_from_the_dequantised_weights_in_16_bit(qlora_plain_export) -> None:
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    from labkit.model.loading import load_model
    from labkit.model.sources import resolve

    run = qlora_plain_export
    merged = run / "export" / "merged"
    with safe_open(str(merged / "model.safetensors"), framework="pt") as handle:
        dtypes = {handle.get_slice(n).get_dtype() for n in handle.keys()}
        name = "model.layers.1.mlp.down_proj.weight"
        saved = handle.get_tensor(name).float()
    assert dtypes == {"BF16"}  # the 4-bit compute dtype, not the float32 base
    assert io.read_json(merged / "config.json").get("quantization_config") is None  # plain weights, no bnb needed
    card = load_card(run / "card.yaml").card
    quantised = load_model(resolve("tiny:llama"), card, "cpu")
    dequantised = quantised.dequantize(dtype=torch.bfloat16).state_dict()[name].float()
    original = load_file(str(Path(resolve("tiny:llama").location) / "model.safetensors"))[name].float()
    adapter = load_file(str(run / "export" / "adapter" / "adapter_model.safetensors"))
    prefix = "base_model.model." + name.removesuffix(".weight")
    delta = adapter[f"{prefix}.lora_B.weight"].float() @ adapter[f"{prefix}.lora_A.weight"].float() * (8 / 4)
    from_dequantised = (saved - (dequantised + delta)).abs().max().item()
    from_original = (saved - (original + delta)).abs().max().item()
    assert from_dequantised <= 2 * torch.finfo(torch.bfloat16).eps * (dequantised + delta).abs().max().item()
    assert from_original > 10 * from_dequantised  # the 4-bit quantisation error shows: merged into what it learned against


def test_qlora_merged_model_is_scored_beside_the_adapter(qlora_plain_export) -> None:
    out = qlora_plain_export / "export"
    report = io.read_json(out / "reload_check.json")
    assert report["ok"], report
    assert report["memory"]["dtype"] == "bfloat16" and report["memory"]["peak_bytes"] < report["memory"]["available_bytes"]
    assert "bfloat16" in report["tolerance_rule"] and report["merged_weights"]["ok"]
    scores = io.read_json(out / "merged_vs_adapter.json")
    assert scores == json.loads(json.dumps(report["merged_scores"]))
    assert scores["split"] == "validation" and scores["rows"] == report["total"] and scores["dtype"] == "bfloat16"
    tuned = io.read_json(qlora_plain_export / "comparison" / "tuned_metrics.json")["overall"]
    assert scores["adapter"]["field_accuracy"] == pytest.approx(tuned["field_accuracy"])  # the run's own answers
    assert scores["difference"]["field_accuracy"] == pytest.approx(
        scores["merged"]["field_accuracy"] - scores["adapter"]["field_accuracy"])
    text = (out / "README.md").read_text(encoding="utf-8")
    assert "## Merged model" in text and "| `field_accuracy` |" in text.split("## Merged model")[1]
    assert "dequantised 4-bit weights" in text


def test_export_refuses_with_the_number_when_memory_is_short(smoke_run, tmp_path: Path, capsys) -> None:
    run = _copy_root(smoke_run[0], tmp_path / "runs")
    root = run.parent.parent
    with pytest.raises(ExportRefused, match=r"the export needs \d+\.\d\d GiB on cpu .*0\.00 GiB are free"):
        export(run.name, root, memory_gib=0.001)
    assert not (run / "export").exists() and not list(run.glob(".export.tmp-*"))  # nothing half-built left
    assert cli_main(["--runs", str(root), "export", run.name, "--memory", "0.001"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "GiB are free" in err[-1] and "needs" in err[-1]


def test_reload_check_refuses_with_the_number_before_loading(chatml_export) -> None:
    from labkit.export.reload_check import check

    with pytest.raises(ExportRefused, match=r"^the reload check needs \d+\.\d\d GiB on cpu .* but 0\.00 GiB are free"):
        check(chatml_export / "export", chatml_export, available=1024)
    report = io.read_json(chatml_export / "export" / "reload_check.json")  # the export's own check, untouched
    assert report["ok"] and report["memory"]["available_bytes"] > report["memory"]["peak_bytes"] > 0


def test_a_float32_run_exports_merged_in_the_dtype_asked_for(smoke_run, tmp_path: Path, capsys) -> None:
    """`labkit export --merged --dtype bfloat16` on a float32 LoRA run: the adapter reloads in float32 and reproduces
    every answer; the merge, merged/ and the merged model's scores are bfloat16, checked at the 16-bit tolerance."""
    from safetensors import safe_open

    run = _copy_root(smoke_run[0], tmp_path / "runs")
    assert cli_main(["--runs", str(run.parent.parent), "export", run.name, "--merged", "--dtype", "bfloat16"]) == 0
    out = run / "export"
    manifest, report = io.read_json(out / "export.json"), io.read_json(out / "reload_check.json")
    assert manifest["export_dtype"] == manifest["merged_dtype"] == "bfloat16"
    assert report["ok"] and report["identical"] and report["memory"]["dtype"] == "bfloat16", report
    assert report["tolerance_rule"].endswith("bfloat16") and report["merged_weights"]["ok"]
    assert report["merged_scores"]["dtype"] == "bfloat16"
    with safe_open(str(out / "merged" / "model.safetensors"), framework="pt") as handle:
        assert {handle.get_slice(n).get_dtype() for n in handle.keys()} == {"BF16"}
    with safe_open(str(out / "adapter" / "adapter_model.safetensors"), framework="pt") as handle:
        assert {handle.get_slice(n).get_dtype() for n in handle.keys()} == {"F32"}  # the run's adapter, untouched
    assert "export on cpu in bfloat16" in capsys.readouterr().err
