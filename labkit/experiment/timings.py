"""What earlier runs measured, for the rental plan: stage seconds, seconds per step, process starts, loads.

`measured_timings` reads the registry (`stage_done` seconds), each run's `<stage>/summary.json`, stage
04's `training/outcome.json` or log history and stage 03's measured step, and returns medians with the
runs they come from. Runs of the same experiment are preferred, then runs of the same model source,
method and max_length; of those, one machine's (`_one_machine`).
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from typing import Any

import yaml

from labkit.core import io
from labkit.core import runs as R
from labkit.errors import MissingInput
from labkit.stages import records
from labkit.stages.records import LOG_HISTORY, OUTCOME

INITIAL = ("baseline", "preprocessing", "parameter_check")
NOTHING = ("nothing measured for {what} under {root}: run `labkit stage parameter_check {card}` first "
           "(stages 01–03), or `labkit run {card}`")


def _read(path: Path) -> dict[str, Any]:
    """A JSON object from a file; {} when it is missing or unreadable."""
    try:
        data = io.read_json(path)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _device(env: dict[str, Any]) -> str:
    """The machine of an env.json in words: its GPUs, else its CPU."""
    devices = (env.get("accelerators") or {}).get("devices")
    if devices:
        names = [f"{d.get('name')} ({d.get('memory_gib')} GiB)" for d in devices]
        return ", ".join(f"{names.count(n)} × {n}" for n in dict.fromkeys(names))
    if not env:
        return "unknown machine (no env.json)"
    return f"CPU {env.get('machine', '?')}, {env.get('cpu_count', '?')} cores, {env.get('memory_gib', '?')} GiB, no GPU"


def _trained(run_dir: Path) -> tuple[float, int, str] | None:
    """(training runtime in s, optimiser steps trained in that session, file read) of a run's stage 04, if measured:
    from training/outcome.json as training wrote it, else from its log history."""
    outcome = _read(run_dir / "training" / OUTCOME)
    history = run_dir / "training" / LOG_HISTORY
    runtime, steps, resumed, how = None, 0, outcome.get("resumed_from"), f"training/{OUTCOME}"
    if (outcome.get("metrics") or {}).get("train_runtime") and outcome.get("steps"):
        runtime, steps = outcome["metrics"]["train_runtime"], outcome["steps"]
    elif history.exists():
        rows = io.read_jsonl(history)
        runtime = next((r["train_runtime"] for r in reversed(rows) if "train_runtime" in r), None)
        steps, how = max((r.get("step", 0) for r in rows), default=0), f"training/{LOG_HISTORY}"
    match = re.search(r"checkpoint-(\d+)", str(resumed or ""))  # a resumed session trained only the steps after it
    trained = steps - (int(match.group(1)) if match else 0)
    return (float(runtime), trained, how) if runtime and trained > 0 else None


def _run_measures(run_dir: Path, events: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's measured seconds: the registry's events first, the stages' summary.json files second."""
    done = {e["stage"]: e["seconds"] for e in events if e.get("event") == "stage_done" and e.get("seconds") is not None}
    wall = next((e["timings"] for e in reversed(events) if e.get("timings")), {})  # completed, failed or interrupted
    summaries = {s: _read(run_dir / s / "summary.json") for s in R.STAGES}
    m: dict[str, Any] = {}
    for stage in R.STAGES:
        seconds = done.get(stage, summaries[stage].get("seconds"))
        if seconds is not None:
            m[stage] = float(seconds)
    starts = [wall[s] - m[s] for s in wall if s in m and wall[s] >= m[s]]
    if starts:  # papermill's wall time of a stage minus the stage's own seconds: kernel start and imports
        m["process_start"] = statistics.median(starts)
    m["baseline_cached"] = bool(summaries["baseline"].get("cached"))
    if "baseline" in m:  # one prompt's pass (eval.baseline_prompts measures the base model under several)
        m["baseline_pass"] = m["baseline"] / max(1, records.strongest_baseline(run_dir)["measured"])
    trained = _trained(run_dir)
    if trained:
        m["train_step"] = trained[0] / trained[1]
        m["world_size"] = int(_read(run_dir / "training" / OUTCOME).get("world_size") or 1)  # processes that trained
        m["train_how"] = f"{trained[2]}: {trained[0]:.1f} s / {trained[1]} steps"
        if "training" in m:
            m["train_setup"] = max(0.0, m["training"] - trained[0])
    opened = {e.get("opening"): io.utc_seconds(e["time"]) for e in events if e.get("event") == "test_opened"}
    finals = [io.utc_seconds(e["time"]) - opened[e.get("opening")] for e in events
              if e.get("event") == "test_evaluated" and e.get("opening") in opened]
    if finals:  # labkit final: test split opened → base and tuned model evaluated on it
        m["final"] = statistics.median(finals)
    export_check = _read(run_dir / "export" / "reload_check.json").get("seconds")
    if export_check is not None:
        m["export_check"] = float(export_check)
    fit = _read(run_dir / "parameter_check" / records.FIT).get("plan") or {}
    check = summaries["parameter_check"].get("seconds_per_step") or fit.get("seconds_per_step")
    if check:
        m["check_step"] = float(check)
    m["sizes"] = summaries["preprocessing"].get("sizes") or \
        (_read(run_dir / "data_manifest.json").get("split") or {}).get("sizes")
    m["device"] = _device(_read(run_dir / "env.json"))
    return m


def _tiers(loaded: Any, root: Path) -> list[tuple[str, list[Path]]]:
    """Candidate run folders, most relevant first: same experiment, then same model source + method + max_length."""
    card = loaded.card
    want = (card.model.source, card.method.kind, card.data.max_length)
    keyed = []
    for path in sorted(root.glob("*/*/card.yaml")) if root.is_dir() else []:
        if path.parent.name.startswith("_") or path.parent.parent.name.startswith("_"):
            continue
        try:
            c = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError):
            continue
        key = ((c.get("model") or {}).get("source"), (c.get("method") or {}).get("kind"),
               (c.get("data") or {}).get("max_length"))
        keyed.append((path.parent, key))
    same = [(p, k) for p, k in keyed if p.parent.name == card.experiment.id]
    other = [p for p, k in keyed if k == want and p.parent.name != card.experiment.id]
    return [("same experiment, model source, method and max_length", [p for p, k in same if k == want]),
            ("same experiment; other model source, method or max_length: the timings may not transfer",
             [p for p, _ in same]),
            ("same model source, method and max_length, in " + ", ".join(sorted({p.parent.name for p in other})),
             other)]


def _one_machine(measures: dict[str, dict[str, Any]], events: list[dict[str, Any]]
                 ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The runs of one machine (`env.json`): a median of a CPU's and a GPU's seconds per step plans neither.

    The machine most runs were measured on is kept; on a tie, the one with the latest run (registry time).

    Returns:
        (the kept runs' measures, the notes: [] when every run was measured on one machine, else one naming the
        machine kept and each run left out with its machine).
    """
    machines: dict[str, list[str]] = {}
    for run, m in sorted(measures.items()):
        machines.setdefault(m["device"], []).append(run)
    if len(machines) < 2:
        return measures, []
    latest: dict[str, float] = {}
    for e in events:
        if e.get("run_id") in measures:
            latest[e["run_id"]] = max(latest.get(e["run_id"], 0.0), io.utc_seconds(e["time"]))
    kept = max(machines, key=lambda d: (len(machines[d]), max(latest.get(r, 0.0) for r in machines[d])))
    left = [f"{r} ({d})" for d, runs in machines.items() if d != kept for r in runs]
    note = (f"the runs were measured on {len(machines)} machines: the plan uses the {len(machines[kept])} run(s) on "
            f"{kept} (the machine with the most runs, then the latest); left out: {', '.join(left)}")
    return {r: measures[r] for r in machines[kept]}, [note]


def measured_timings(loaded: Any, root: Path) -> dict[str, Any]:
    """The durations of earlier runs that a plan for this card can rest on (medians, with the runs named).

    Args:
        loaded: the card (`labkit.card.load.LoadedCard`).
        root: the runs root.
    Returns:
        {"seconds": {baseline, preprocessing, parameter_check, seconds_per_step, process_start, train_setup,
        evaluation, and when measured final, export_check}, "sources": {key: where it came from},
        "card": {steps, save_steps, save_steps_set, validation_rows, test_rows, price_per_hour, gpus}, "runs",
        "step_processes" (seconds_per_step's runs trained with this many processes: the card's when such a run
        exists, else one),
        "matched_by", "device", "notes", …}.
    Raises:
        FileNotFoundError: no run measured a training step (stage 03 or 04), or stages 01–03 are unmeasured.
    """
    card, events = loaded.card, R.read_registry(root)
    missing_all = NOTHING.format(what=f"{card.experiment.id} (or {card.model.source} + {card.method.kind} + max_length "
                                 f"{card.data.max_length})", root=root, card=loaded.path)
    for matched_by, folders in _tiers(loaded, root):
        measures = {p.name: _run_measures(p, [e for e in events if e.get("run_id") == p.name]) for p in folders}
        measures = {k: v for k, v in measures.items() if "train_step" in v or "check_step" in v}
        if measures:
            break
    else:
        raise MissingInput(missing_all)
    measures, notes = _one_machine(measures, events)
    seconds: dict[str, float] = {}
    sources: dict[str, str] = {}

    def median(key: str, name: str, how: str, runs: dict[str, Any] | None = None) -> None:
        got = {r: m[key] for r, m in (runs or measures).items() if m.get(key) is not None}
        if got:
            seconds[name] = statistics.median(got.values())
            sources[name] = f"{how}; median of {len(got)} run(s): {', '.join(sorted(got))}"

    uncached = {r: m for r, m in measures.items() if not m["baseline_cached"]}
    median("baseline", "baseline", "stage 01 seconds" + ("" if uncached else " (cached baseline only: a fresh "
                                                         "machine measures the base model again)"), uncached)
    median("preprocessing", "preprocessing", "stage 02 seconds")
    median("parameter_check", "parameter_check", "stage 03 seconds")
    median("process_start", "process_start", "papermill wall time − stage seconds (kernel start, imports)")
    median("train_setup", "train_setup", "stage 04 seconds − training runtime (model load, setup, adapter save)")
    median("comparison", "evaluation", "stage 05 seconds (tuned model loaded, validation split evaluated)")
    median("final", "final", "labkit final: registry test_opened → test_evaluated (base and tuned on the test split)")
    median("export_check", "export_check", "labkit export's reload check in a fresh process (export/reload_check.json)")
    trained = {r: m for r, m in measures.items() if "train_step" in m}
    worlds = {m.get("world_size", 1) for m in trained.values()}
    world = next((w for w in (card.distributed.num_processes, 1) if w in worlds), min(worlds, default=1))
    trained = {r: m for r, m in trained.items() if m.get("world_size", 1) == world}  # runs at one process count
    if trained:
        median("train_step", "seconds_per_step", "stage 04 runtime / steps, validation passes and checkpoint saves "
               "included (" + "; ".join(f"{r} {m['train_how']}" for r, m in trained.items()) + ")", trained)
    else:
        median("check_step", "seconds_per_step", "stage 03's measured step at the p95 length")
        notes.append("s/step from stage 03 only (no validation passes, no checkpoint saves): an underestimate")
    if "evaluation" not in seconds and "baseline" in seconds:
        median("baseline_pass", "evaluation", "stage 01 seconds ÷ the baseline prompts it measured (no stage 05 "
               "measured)", uncached or measures)
    notes += [f"{k} not measured ({why}): counted as 0" for k, why in (
        ("process_start", "no `labkit run` stage timings"), ("train_setup", "no stage 04")) if k not in seconds]
    missing = [k for k in (*INITIAL, "seconds_per_step") if k not in seconds]
    if missing:
        raise MissingInput(NOTHING.format(what=", ".join(missing), root=root, card=loaded.path))
    sizes = next((m["sizes"] for m in measures.values() if m.get("sizes")), None) or {}
    t = card.train
    if t.max_steps:
        steps = t.max_steps
    elif sizes.get("train"):
        steps = math.ceil(math.ceil(sizes["train"] / t.micro_batch) / t.grad_accum * (t.epochs or 1))
    else:
        raise MissingInput(NOTHING.format(what="the training split's size", root=root, card=loaded.path))
    save = (t.eval_steps or max(1, steps // 4)) if t.early_stopping else (t.save_steps or max(1, steps // 4))
    devices = sorted({m["device"] for m in measures.values()})
    d = card.distributed
    gpus = d.num_processes if d.launcher == "accelerate" else 1
    return {"experiment": card.experiment.id, "variant": card.experiment.variant, "card_path": str(loaded.path),
            "step_processes": world if trained else 1,  # the processes seconds_per_step was measured at
            "card_hash": loaded.hash, "matched_by": matched_by, "runs": sorted(measures), "device": "; ".join(devices),
            "seconds": seconds, "sources": sources, "notes": notes,
            "card": {"steps": steps, "save_steps": save, "save_steps_set": bool(t.eval_steps if t.early_stopping else t.save_steps),
                     "validation_rows": sizes.get("validation"), "test_rows": sizes.get("test"),
                     "price_per_hour": card.budget.price_per_gpu_hour * gpus, "gpus": gpus,
                     "train_rows": sizes.get("train"),  # tokens per optimiser step, to time a grid's other cards:
                     "step_size": t.micro_batch * t.grad_accum * card.data.max_length}}
