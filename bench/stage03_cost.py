"""Benchmark: stage 03's wall time, the stage as it was at a base commit against the stage of this checkout, side by side.

For each card, stages 01–02 run once (this checkout's code, `labkit stage`); then stage 03 runs on copies of that run
folder, the base commit's code (`git archive BASE` into a temporary folder, run with PYTHONPATH pointing there) and
this checkout's, interleaved (old, new, old, new, … with --repeats). Prints one JSON object: per card the wall seconds
of each `labkit stage parameter_check` (process start included) and the stage's own `seconds` (summary.json), their
ratio (old / new, medians), and the findings side by side: update, accumulation and checkpointing verdicts, the
estimate's errors against the measurement, the fit verdict, the time plan.

Run: .venv/bin/python bench/stage03_cost.py [--cards params/quickstart.yaml params/examples/ticket-packed.yaml]
     [--base 51f0d56] [--repeats 1] [--prepared RUN …] [--base-prepared RUN …] [--base-cache DIR]

A base whose card schema rejects the card.yaml this checkout archives (keys added since) runs on run folders
prepared by its own code: `--base-prepared`, made with `prepare(card, runs, tree)` where tree is the base's
`checkout` (stages 01–02 are deterministic: the same splits and lengths).

The base commit reads its model cache in its own format: when this checkout has rewritten the shared cache's
records (e.g. the GGUF's .sha256 sidecar as JSON), give the base runs a cache of their own with --base-cache
(LABKIT_CACHE for the base runs only; a copy of the cache with the records as the base writes them).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CARDS = ["params/quickstart.yaml", "params/examples/ticket-packed.yaml"]
BASE = "51f0d56"  # stage 03 before issue 21: a fresh model and trainer per check


def checkout(commit: str, into: Path) -> Path:
    """The tree of `commit` (git archive), unpacked into `into`."""
    data = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def labkit(tree: Path, runs: Path, *args: str, cache: str | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """`python -m labkit ARGS` with `tree`'s labkit first on the path (and LABKIT_CACHE=`cache` when given);
    (wall seconds, process)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "LABKIT_RUNS": str(runs), "LABKIT_REPORT": "0",
           **({"LABKIT_CACHE": cache} if cache else {})}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "labkit", *args, "--notebooks", str(tree / "notebooks")], cwd=tree,
                          env=env, capture_output=True, text=True)
    return time.perf_counter() - start, proc


def prepare(card: str, runs: Path, tree: Path = REPO) -> Path:
    """Stages 01–02 of `card` (`tree`'s code: this checkout's by default) in a fresh run; the run folder."""
    for stage in ("baseline", "preprocessing"):
        found = [p for p in runs.glob("*/*") if (p / "card.yaml").exists()]
        _, proc = labkit(tree, runs, "stage", stage, card, *(["--run", str(found[0])] if found else []))
        if proc.returncode != 0:
            raise SystemExit(f"{card}: stage {stage} failed:\n{(proc.stderr or proc.stdout)[-2000:]}")
    (run,) = [p for p in runs.glob("*/*") if (p / "card.yaml").exists()]
    return run


def findings(run: Path) -> dict:
    """What stage 03 found, from its files."""
    folder = run / "parameter_check"
    read = lambda name: json.loads((folder / name).read_text())  # noqa: E731
    memory, fit, acc, ckpt = read("memory.json"), read("fit.json"), read("accumulation_check.json"), \
        read("checkpointing_check.json")
    summary = read("summary.json")
    return {"update_ok": read("update_check.json")["ok"], "accumulation_ok": acc["ok"],
            "accumulation_difference": acc["relative_difference"], "checkpointing_ok": ckpt["ok"],
            "checkpointing_difference": ckpt["relative_difference"], "checkpointing_memory_judged": ckpt["memory_judged"],
            "lengths": memory["lengths"], "step_error": [r.get("step_error") for r in memory["comparison"]],
            "peak_error": [r.get("peak_error") for r in memory["comparison"]],
            "fits": fit["verdict"]["fits"], "verdict": fit["verdict"]["message"],
            "plan_train_seconds": round(fit["plan"]["train_seconds"], 1),
            "plan_seconds_per_step": round(fit["plan"]["seconds_per_step"], 3),
            "plan_evaluation_seconds": round(fit["plan"]["evaluation_seconds"], 1),
            "stage_seconds": summary["seconds"], "check_seconds": summary.get("check_seconds")}


def stage03(tree: Path, card: str, prepared: Path, scratch: Path, label: str, cache: str | None = None) -> dict:
    """Stage 03 of `tree` on a copy of the prepared run; wall seconds and findings."""
    runs = scratch / label
    copy = runs / prepared.parent.name / prepared.name
    shutil.copytree(prepared.parent, copy.parent)  # the experiment folder: the run and its cached baseline
    load = os.getloadavg()[0]  # the machine's 1-minute load average as the stage starts (2 cores: >2 is contended)
    wall, proc = labkit(tree, runs, "stage", "parameter_check", card, "--run", str(copy), cache=cache)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout)[-1500:], "wall_seconds": round(wall, 1), "load_at_start": load}
    return {"wall_seconds": round(wall, 1), "load_at_start": round(load, 1),
            "load_at_end": round(os.getloadavg()[0], 1), **findings(copy)}


def same(old: dict, new: dict) -> dict:
    """The findings compared: the same verdicts, the estimate's errors and the time plan side by side."""
    keys = ("update_ok", "accumulation_ok", "checkpointing_ok", "checkpointing_memory_judged", "fits", "lengths")
    return {"same_verdicts": all(old.get(k) == new.get(k) for k in keys),
            "step_error": {"old": old.get("step_error"), "new": new.get("step_error")},
            "plan_train_seconds": {"old": old.get("plan_train_seconds"), "new": new.get("plan_train_seconds"),
                                   "relative": round(new["plan_train_seconds"] / old["plan_train_seconds"] - 1, 3)
                                   if old.get("plan_train_seconds") and new.get("plan_train_seconds") else None}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", nargs="+", default=CARDS)
    parser.add_argument("--base", default=BASE, help="the commit whose stage 03 is the 'old' one")
    parser.add_argument("--repeats", type=int, default=1, help="old/new pairs per card")
    parser.add_argument("--prepared", nargs="*", default=[], metavar="RUN",
                        help="run folders with stages 01-02 done, one per card in --cards order (skips preparing)")
    parser.add_argument("--base-cache", default=None, metavar="DIR", help="LABKIT_CACHE for the base commit's runs")
    parser.add_argument("--base-prepared", nargs="*", default=[], metavar="RUN",
                        help="run folders with stages 01-02 done by the base commit's code, one per card, for a base "
                             "whose card schema rejects the card.yaml this checkout archives (newer keys)")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    results = []
    with tempfile.TemporaryDirectory(prefix="labkit-stage03-") as tmp:
        base = checkout(args.base, Path(tmp) / "base")
        for i, card in enumerate(args.cards):
            prepared = Path(args.prepared[i]).resolve() if i < len(args.prepared) else \
                prepare(card, Path(tmp) / "prepared" / Path(card).stem)
            base_prepared = Path(args.base_prepared[i]).resolve() if i < len(args.base_prepared) else prepared
            pairs = []
            for r in range(args.repeats):
                old = stage03(base, card, base_prepared, Path(tmp) / "copies" / Path(card).stem, f"old-{r}",
                              args.base_cache)
                new = stage03(REPO, card, prepared, Path(tmp) / "copies" / Path(card).stem, f"new-{r}")
                pairs.append((old, new))
            ok = [(o, n) for o, n in pairs if "error" not in o and "error" not in n]
            entry = {"card": card, "runs": pairs}
            if ok:
                old_wall = statistics.median(o["wall_seconds"] for o, _ in ok)
                new_wall = statistics.median(n["wall_seconds"] for _, n in ok)
                old_stage = statistics.median(o["stage_seconds"] for o, _ in ok)
                new_stage = statistics.median(n["stage_seconds"] for _, n in ok)
                entry.update({"old_wall_seconds": old_wall, "new_wall_seconds": new_wall,
                              "wall_ratio": round(old_wall / new_wall, 2), "old_stage_seconds": old_stage,
                              "new_stage_seconds": new_stage, "stage_ratio": round(old_stage / new_stage, 2),
                              "findings": [same(o, n) for o, n in ok]})
            results.append(entry)
            print(json.dumps(entry), file=sys.stderr, flush=True)  # each card as it finishes (the run is long)
    print(json.dumps({"benchmark": "stage03_cost", "base": args.base, "commit": commit,
                      "date": time.strftime("%Y-%m-%d"), "target": "old / new wall time >= 1.5 on each card",
                      "results": results}, indent=1))


if __name__ == "__main__":
    main()
