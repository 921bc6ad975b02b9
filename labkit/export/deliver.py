"""`labkit export RUN_ID`: deliver a completed run's adapter (or model), tied to its exact base, and check it.

Writes `<run>/export/` (or `--out DIR`):
  adapter/       adapter_model.safetensors, adapter_config.json (base_model_name_or_path: the hub id + revision of
                 the base, or of the Hub file a GGUF is a copy of; else labkit's source string: never a local
                 folder, labkit.export.publish),
                 labkit_base_model.json, the tokenizer (chat template, EOS/pad), generation_config.json
                 (the evaluation's greedy decoding and stop list: labkit.export.snippet); `model/` instead for
                 method full
  merged/        with --merged: the adapter merged into the base it learned against (the dequantised 4-bit weights
                 for qlora), in the export dtype (16-bit on a GPU; --dtype another), on the training device
                 (labkit.export.merge)
  README.md      the model card (labkit.export.model_card); results.json, limits.json, card.yaml, export.json
  reload_check.json   the reload check run in a fresh process (labkit.export.reload_check)
  merged_vs_adapter.json   the merged model's scores on the checked validation rows beside the adapter's

Before any model is loaded, the export's memory (labkit.preflight.export_memory) is stated and compared with the
device's free memory; an export that would not fit is refused with both numbers (ExportRefused), naming the
16-bit --dtype that would fit when a float32 merge does not.

The export is built in a temporary folder and renamed into place, then checked; a failed check
leaves it on disk, marked failed in reload_check.json, and raises ExportCheckFailed. Nothing exported names a path
of this machine: export.json's run and card folders serve the reload check and are removed after it, and every
file is scanned (labkit.export.publish); the export ends with one line: the `hf upload` commands when
adapter_config.json names a Hub id with a revision and no file names a machine path, else why it cannot be
published as is.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from labkit.card.load import load_card
from labkit.core import io
from labkit.core import runs as R
from labkit.core.run_card import resolved_card
from labkit.errors import ExportCheckFailed, ExportRefused
from labkit.export import model_card as modelcard
from labkit.export.hub_card import describe_base
from labkit.export.merge import ensure_fits, merge_to
from labkit.export.publish import hub_base, machine_roots, portable_base_fields, publish_advice, publishability, scan_paths
from labkit.export.reload_check import longest_prompt, run_device, summary
from labkit.export.snippet import load_snippet, save_tokenizer_and_generation
from labkit.model.loading import decisions
from labkit.model.source_spec import parse_source
from labkit.model.sources import resolve, sha256_file


SKIP = {"training_args.bin", "README.md"}  # trainer pickles and peft's template card are not delivered
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json")


def exportable(run: R.Run) -> dict[str, Any]:
    """Refuse a run that is not completed, is invalid, or has no trained weights or evaluation.

    Args:
        run: the run.
    Returns:
        its status.json.
    Raises:
        ExportRefused: one line naming the run, its status and what to do.
    """
    status = run.status()
    name = f"{run.experiment}/{run.run_id}"
    state = status.get("status")
    if state == "invalid":
        raise ExportRefused(f"cannot export {name}: the run is invalid ({status.get('invalid_reason')}); "
                            "invalid runs stay in the registry but are not delivered — export a valid run")
    if state != "completed":
        raise ExportRefused(f"cannot export {name}: its status is {state!r}, not completed — finish it first "
                            f"(`labkit run --resume {run.run_id}`), or export a completed run (`labkit runs`)")
    weights = run.dir / "training" / "adapter"
    if not weights.is_dir() or not any(weights.glob("*.safetensors")):
        raise ExportRefused(f"cannot export {name}: {weights} holds no safetensors weights — rerun its training "
                            f"stage (`labkit stage training CARD --run {run.dir}`)")
    if not (run.dir / "comparison" / "tuned_predictions.jsonl").exists():
        raise ExportRefused(f"cannot export {name}: comparison/tuned_predictions.jsonl is missing — run its "
                            "comparison stage first (the reload check compares against it)")
    return status


def base_model_info(resolved: Any, card_hash: str, run_id: str, card_dir: Path | None = None) -> dict[str, Any]:
    """The base model an export is tied to: source, exact revision, sha256 of the local weight files, what is known
    of it (hub id, name, license, language: labkit.export.hub_card.describe_base), its Hub origin
    (labkit.export.publish.hub_base); no path of this machine.

    Args:
        resolved: the resolved model source (labkit.model.sources.ResolvedModel).
        card_hash: the run's card hash.
        run_id: the run id.
        card_dir: the card's folder (relative `.gguf` paths).
    Returns:
        the content of labkit_base_model.json.
    """
    info: dict[str, Any] = {"source": resolved.source, "kind": resolved.kind, "revision": resolved.revision,
                            "weights_sha256": {}, "details": resolved.details, "card_hash": card_hash, "run_id": run_id,
                            "described": describe_base(resolved, card_dir)}
    if resolved.kind == "hf":
        info["hf_repo"] = parse_source(resolved.source)["repo"]
    else:
        folder = Path(resolved.location)
        for path in sorted([*folder.glob("*.safetensors"), *folder.glob("*.bin")]):
            info["weights_sha256"][path.name] = sha256_file(path)
    info["hub_origin"] = hub_base(info)
    return info


def _copy_weights(run: R.Run, dest: Path, base: dict[str, Any], method: str) -> None:
    src = run.dir / "training" / "adapter"
    dest.mkdir(parents=True)
    for path in src.iterdir():
        if path.is_file() and path.name not in SKIP and path.name not in TOKENIZER_FILES and path.name != "labkit_base_model.json":
            shutil.copy2(path, dest / path.name)
    if method != "full":
        config = io.read_json(dest / "adapter_config.json")
        config.update(portable_base_fields(base))  # a Hub id at its revision, else labkit's source: no local folder
        (dest / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    io.write_json(dest / "labkit_base_model.json", base)


def run_reload_check(export_dir: Path, run_dir: Path, sample: int | None = None, device: str | None = None) -> dict[str, Any]:
    """Run labkit.export.reload_check on an export in a fresh Python process and return its report.

    Args:
        export_dir: the export folder.
        run_dir: the run folder.
        sample: check only the first N evaluation batches (None: all).
        device: cpu / cuda / mps (None: the check's default).
    Returns:
        reload_check.json as written by the check (an error report when the process died without one).
    """
    (export_dir / "reload_check.json").unlink(missing_ok=True)
    command = [sys.executable, "-m", "labkit.cli.worker", "reload-check", str(export_dir), "--run", str(run_dir)]
    command += ["--sample", str(sample)] if sample else []
    command += ["--device", device] if device else []
    proc = subprocess.run(command, stdout=subprocess.PIPE, text=True, env={**os.environ, "LABKIT_BATCH": "1"})
    path = export_dir / "reload_check.json"
    if not path.exists():
        io.write_json(path, {"ok": False, "identical": False, "error": f"the check process exited with {proc.returncode} "
                            f"and wrote no report: {proc.stdout.strip()[-300:]}", "time": io.utc_now()})
    return io.read_json(path)


def export(run_id_or_dir: str | Path, root: Path, merged: bool = False, out: Path | None = None,
           sample: int | None = None, device: str | None = None, memory_gib: float | None = None,
           dtype: str | None = None) -> dict[str, Any]:
    """Export a completed run and check the export in a fresh process.

    Args:
        run_id_or_dir: a run id under `root`, or a run folder.
        root: the runs root.
        merged: also write merged/ (base + adapter merged).
        out: the export folder (default `<run>/export`); an existing labkit export there is replaced.
        sample: reload check on the first N evaluation batches only (None: all).
        device: device of the merge and the reload check (None: cpu unless the run used CUDA).
        memory_gib: memory available to the export (None: the device's free memory, read before it starts).
        dtype: the dtype of the merge and merged/ ("bfloat16", "float16", "float32"; None: the run's 4-bit compute
            dtype for qlora, else its weights' dtype: `labkit.preflight.export_memory.export_dtype`).
    Returns:
        {"export_dir", "run_id", "ok", "reload_check", "merged", "method", "publishable" (`check_publishable`: "ok",
        "why", "base", "revision", "paths")}; the publish line (labkit.export.publish.publish_advice) went to stderr.
    Raises:
        ExportRefused: the run cannot be exported (not completed, invalid, no weights, no evaluation), or the 16-bit
            merge and reload check would not fit in the device's free memory (one line with both numbers, and a
            16-bit `dtype` that would fit), or float16 asked for an architecture that overflows it.
        ExportCheckFailed: the reload check failed (the export stays on disk, marked failed).
    """
    run = R.find_run(str(run_id_or_dir), Path(root))
    status = exportable(run)
    loaded = load_card(run.card_path)
    card = loaded.card
    recorded = io.read_json(run.dir / "model_source.json") if (run.dir / "model_source.json").exists() else {}
    card_dir = Path(status["card_source"]).parent if status.get("card_source") else run.dir
    resolved = resolve(recorded.get("source", card.model.source), recorded.get("revision") or card.model.revision, base=card_dir)
    base = base_model_info(resolved, status.get("card_hash", loaded.hash), run.run_id, card_dir)
    method = card.method.kind
    weights = "model" if method == "full" else "adapter"
    if (merged or dtype) and method == "full":
        print("labkit: --merged and --dtype ignored: method full exports the whole trained model (model/), as trained",
              file=sys.stderr)
        merged, dtype = False, None
    out = Path(out).resolve() if out else run.dir / "export"
    if out.exists() and any(out.iterdir()) and not (out / "export.json").exists():
        raise ExportRefused(f"cannot export {run.run_id} into {out}: the folder exists and is not a labkit export — choose another --out")
    device = device or run_device(run.dir)
    max_new = resolved_card(card, run.dir).eval.max_new_tokens
    made = decisions(card, device)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _copy_weights(run, tmp / weights, base, method)
        tokenizer, generation = save_tokenizer_and_generation(run.dir / "training" / "adapter", card, resolved,
                                                              tmp / weights, max_new)
        need = ensure_fits(resolved, resolved_card(card, run.dir), longest_prompt(run, card, tokenizer), device,
                           None if memory_gib is None else memory_gib * 1024**3, dtype=dtype, run_id=run.run_id)
        print(f"labkit: export on {device} in {need['dtype']}: needs {need['peak_bytes'] / 1024**3:.2f} GiB "
              f"({need['phase']} phase) of {need['available_bytes'] / 1024**3:.2f} GiB free", file=sys.stderr)
        merged_dtype = merge_to(tmp / weights, tmp / "merged", resolved, card, tokenizer, base, device,
                                dtype) if merged else None
        results = modelcard.collect_results(run.dir)
        limits = modelcard.observed_limits(run.dir, card, results, tokenizer)
        io.write_json(tmp / "results.json", results)
        io.write_json(tmp / "limits.json", limits)
        shutil.copyfile(run.card_path, tmp / "card.yaml")
        files = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        io.write_json(tmp / "export.json", {"run_id": run.run_id, "experiment": run.experiment, "run_dir": str(run.dir),
                                           "time": io.utc_now(), "method": method, "weights_dir": weights, "merged": merged,
                                           "merged_dtype": merged_dtype, "export_dtype": need["dtype"],
                                           "base_model": {**base, "card_dir": str(card_dir)},
                                           "files_sha256": files})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing half-built is left behind
        raise
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)

    report = run_reload_check(out, run.dir, sample, device)
    report = _portable_after_check(out, report)
    if report.get("merged_scores"):
        io.write_json(out / "merged_vs_adapter.json", report["merged_scores"])
    info = {"run_id": run.run_id, "experiment": run.experiment, "card": card, "card_yaml": run.card_path.read_text(encoding="utf-8"),
            "base": base, "manifest": io.read_json(run.dir / "data_manifest.json"), "env": modelcard.environment(run.dir),
            "results": results, "limits": limits, "reload": report, "reload_summary": summary(report),
            "weights_dir": weights, "merged": merged, "method": method,
            "load_snippet": load_snippet(weights, base, card, made.weight_dtype, generation.eos_token_id, made.compute_dtype)}
    io.write_atomic(out / "README.md", modelcard.render(info))
    if not report.get("ok"):
        R.record(run, "export_failed", export_dir=str(out), why=summary(report))
        raise ExportCheckFailed(f"export of {run.experiment}/{run.run_id}: reload check failed — {summary(report)}; "
                                f"the export is kept in {out} for inspection (see reload_check.json)")
    published = check_publishable(out, weights, base, run.dir, card_dir)
    io.write_json(out / "export.json", {**io.read_json(out / "export.json"), "publishable": published["ok"]})
    print(f"labkit: {publish_advice(published, out, weights)}", file=sys.stderr)
    R.record(run, "exported", export_dir=str(out), merged=merged, reload_check=summary(report), publishable=published["ok"])
    return {"export_dir": str(out), "run_id": run.run_id, "ok": True, "reload_check": report, "merged": merged, "method": method,
            "publishable": published}


def _portable_after_check(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    """Remove the folders of this machine the reload check needed: export.json's run and card folders, the check
    report's export folder (the export itself: ".").

    Args:
        out: the export folder.
        report: reload_check.json's content.
    Returns:
        the report as rewritten.
    """
    manifest = io.read_json(out / "export.json")
    manifest.pop("run_dir", None)
    manifest["base_model"].pop("card_dir", None)
    io.write_json(out / "export.json", manifest)
    if "export_dir" in report:
        report = {**report, "export_dir": "."}
        io.write_json(out / "reload_check.json", report)
    return report


def check_publishable(out: Path, weights: str, base: dict[str, Any], run_dir: Path, card_dir: Path) -> dict[str, Any]:
    """Scan every exported file for this machine's paths and judge whether the export can be published as is.

    Args:
        out: the export folder.
        weights: "adapter" or "model".
        base: labkit_base_model.json's content.
        run_dir: the run folder (its runs folder is one of the paths looked for).
        card_dir: the card's folder.
    Returns:
        `labkit.export.publish.publishability`.
    """
    roots = machine_roots(run_dir.parent.parent, card_dir, out)
    config = out / weights / "adapter_config.json"
    return publishability(io.read_json(config) if config.exists() else None, base, scan_paths(out, roots))
