"""The first-GPU acceptance check: labkit's single-GPU path, end to end, on one CUDA GPU in under 6 minutes.

No model hub: tiny:phi, tiny:mistral (labkit/model/tiny.py) and a random Llama 3.2-1B-shaped model (128,256-row
vocabulary) built from a config on the fly (bench/gpu_checks/models.py). Every arm trains the DialogSum cards' QLoRA
recipe (NF4, `paged_adamw_8bit`) on labkit's built-in dialogues:

- arms: both tiny models in bf16 and forced fp16, the Llama in bf16 with and without activation checkpointing and in
  fp16; on each, the fit verdict (`labkit.preflight.sizing.fit_verdict`) against `torch.cuda.mem_get_info`, a
  measured step (`labkit.preflight.timing.measure_step`: `max_memory_allocated`) against the estimate
  (`labkit.preflight.memory.estimate_step`) and `max_memory_reserved` against the verdict's need, tokens/s after
  warm-up steps, and stage 03's update, accumulation and checkpointing checks (`labkit.preflight.stepchecks`);
- generation: one batch of the evaluation procedure on the Llama loaded in 4 bits (bitsandbytes), logits finite;
- export: a small completed run, exported with merged/, its reload check on the first evaluation batch;
- packing: the packed-vs-alone check on the path the placement chooses for a packed card.

Targets (a miss exits 1): every part runs; on the Llama arms the estimated peak within 10 % of the measured
`max_memory_allocated` peak and `max_memory_reserved` within the fit verdict's need; the verdict says the step fits;
every stage 03 check passes (a one-line refusal of a configuration, e.g. Phi in fp16, counts as an answer); generation
answers every row and its logits are finite (a random model's answers may be blank: it repeats a token); the export's
reload check passes; no loss, gradient norm or logit checked is non-finite. Tiny models' steps are a few MiB, below
what fixed allocations let an estimate resolve: their memory is reported, not judged. Prints one JSON object on
stdout (progress and library output go to stderr).

Without CUDA it prints one line and exits 2, before anything heavy. `--cpu-dry-run` runs the same list on the CPU,
sized down (the Llama keeps its structure and vocabulary, 2 narrow layers): float32 in place of bf16, the fp16 arms
skipped and named (labkit refuses fp16 and bf16 training precision on the CPU); memory is measured as stage 03 does
on the CPU (peak resident memory) and reported, not judged. It checks the script, not a GPU (the suite runs it).

Run: python bench/gpu_check.py [--cpu-dry-run] [--only NAME ...] [--skip NAME ...]   (bench/gpu_setup.sh installs)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
MEMORY_TOLERANCE = 0.10  # the estimated peak against max_memory_allocated's
NO_CUDA = 2  # exit status without a CUDA GPU (and without --cpu-dry-run); 1: a target missed


def _run(name: str, results: dict[str, Any], part: Any, *args: Any) -> None:
    """Run one part; a crash (out of memory included) is recorded as the part's error, and the next part runs."""
    print(f"gpu_check: {name} …", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        results[name] = part(*args)
    except Exception as exc:  # noqa: BLE001 — every failure is a finding of the check, reported in the JSON
        traceback.print_exc(file=sys.stderr)
        results[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                         "seconds": round(time.perf_counter() - start, 1)}
    finally:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def arm_misses(arm: dict[str, Any], judged: bool) -> list[str]:
    """What an arm's JSON misses (see the module docstring's targets).

    Args:
        arm: one arm's result.
        judged: the memory targets apply (the Llama arms on a GPU).
    Returns:
        one line per miss.
    """
    name = arm.get("arm", "?")
    if "error" in arm:
        return [f"{name}: {arm['error']}"]
    if "refused" in arm:
        return [] if any(w in arm["refused"] for w in ("bf16", "bfloat16", "fp32", "float32")) else [
            f"{name}: refused without naming bf16 or fp32: {arm['refused']}"]
    out, fit = [], arm["fit_and_memory"]
    if not fit["verdict"]["fits"]:
        out.append(f"{name}: the fit verdict says it does not fit: {fit['verdict']['message']}")
    if judged:
        if fit["peak_error"] is None or abs(fit["peak_error"]) > MEMORY_TOLERANCE:
            out.append(f"{name}: estimated peak off by {fit['peak_error']} of max_memory_allocated's (tolerance "
                       f"{MEMORY_TOLERANCE:.0%})")
        if not fit.get("reserved_within_verdict", True):
            out.append(f"{name}: max_memory_reserved {fit['reserved_peak_bytes'] / 2**30:.2f} GiB above the "
                       f"verdict's need {fit['verdict']['needed_bytes'] / 2**30:.2f} GiB")
    for check, found in arm.get("stage03", {}).items():
        if not found.get("ok"):
            out.append(f"{name}: stage 03 {check} check failed: {found.get('problems') or found}")
        elif found.get("nonfinite"):
            out.append(f"{name}: stage 03 {check} check found non-finite values: {found['nonfinite']}")
        elif found.get("skipped") and judged:  # an H100/H200 has the memory for every arm of these models
            out.append(f"{name}: stage 03 {check} check not measured: {found['skipped']}")
    if arm.get("nonfinite"):
        out.append(f"{name}: {arm['nonfinite']} non-finite losses or gradient norms")
    if not (arm["speed"].get("tokens_per_second") or 0) > 0:
        out.append(f"{name}: no tokens/s measured")
    return out


def misses(results: dict[str, Any], cuda: bool) -> list[str]:
    """Every target the results miss (one line each)."""
    out = []
    for arm in results.get("arms", []):
        out += arm_misses(arm, cuda and arm.get("memory_target", False))
    for name in ("generation", "export", "packing"):
        part = results.get(name)
        if part is None:
            continue
        if "error" in part:
            out.append(f"{name}: {part['error']}")
        elif name == "generation" and not (part["logits_finite"] and part["answers"] == part["rows"]):
            out.append(f"generation: logits finite {part['logits_finite']}, {part['answers']} answers for "
                       f"{part['rows']} rows")
        elif name == "export" and not (part["ok"] and not part["nonfinite"]):
            out.append(f"export: {part['export_error'] or 'reload check failed'} ({part['nonfinite']} non-finite)")
        elif name == "packing" and not part["ok"]:
            out.append(f"packing: packed and alone losses differ by {part['max_difference']:.2e} "
                       f"(tolerance {part['tolerance']:.0e})")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="the same list on the CPU, sized down (checks the "
                        "script, not a GPU)")
    parser.add_argument("--only", nargs="*", default=None, help="run only these parts (arm names, generation, export, "
                        "packing)")
    parser.add_argument("--skip", nargs="*", default=[], help="parts to leave out")
    args = parser.parse_args()
    import torch

    cuda = torch.cuda.is_available() and not args.cpu_dry_run
    if not cuda and not args.cpu_dry_run:
        print(f"gpu_check: no CUDA GPU is visible (torch {torch.__version__}, CUDA {torch.version.cuda}): run it on a "
              "CUDA machine after bench/gpu_setup.sh, or --cpu-dry-run to check the script on the CPU", file=sys.stderr)
        return NO_CUDA
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):  # no model hub, ever
        os.environ[key] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, str(BENCH))
    from gpu_checks.export import export_check
    from gpu_checks.inference import generation, packing
    from gpu_checks.models import arms, build_llama, sources
    from gpu_checks.training import run_arm

    from labkit.core.device import capture

    start = time.perf_counter()
    device = "cuda" if cuda else "cpu"
    wanted = (lambda name: (args.only is None or name in args.only) and name not in args.skip)
    listed, skipped = arms(cuda)
    llama = build_llama(Path(tempfile.mkdtemp(prefix="labkit-gpu-llama-")) / "model", cuda)
    where = sources(Path(llama["folder"]))
    results: dict[str, Any] = {"arms": []}
    for arm in (a for a in listed if wanted(a.name)):
        found: dict[str, Any] = {}
        _run(arm.name, found, run_arm, arm, where[arm.model], device)
        results["arms"].append({"arm": arm.name, "memory_target": arm.memory_target, **found[arm.name]})
    wide = "bf16" if cuda else "fp32"
    for name, part in (("generation", generation), ("export", export_check), ("packing", packing)):
        if wanted(name):
            _run(name, results, part, where["llama"], device, wide)
    found_misses = misses(results, cuda)
    report = {"benchmark": "gpu_check", "ok": not found_misses, "misses": found_misses, "cpu_dry_run": not cuda,
              "device": capture(device).as_dict(), "torch": torch.__version__, "llama": llama, **results,
              "skipped": skipped + [{"part": n, "reason": "--only / --skip"} for n in
                                    [a.name for a in listed] + ["generation", "export", "packing"] if not wanted(n)],
              "targets": {"memory": f"Llama arms on CUDA: estimated peak within {MEMORY_TOLERANCE:.0%} of "
                                    "max_memory_allocated's, max_memory_reserved within the fit verdict's need",
                          "checks": "fit verdict fits; stage 03 update, accumulation, checkpointing pass; generation, "
                                    "export reload check and packing check pass", "finite": "no non-finite value"},
              "seconds": round(time.perf_counter() - start, 1)}
    print(json.dumps(report, indent=1, default=str))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
