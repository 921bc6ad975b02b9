"""Benchmark: stage 03's predicted training time against stage 04's measured one, for a padded and a packed card.

Each card runs end to end through `labkit run` (a fresh runs folder, so nothing is cached); stage 03's time plan
(`parameter_check/fit.json`, `labkit.preflight.timeplan.time_plan`) is then set against the trainer's own
`train_runtime` (`training/outcome.json`), which like the plan includes the validation-loss passes. The target is
an error within 25 %. Prints one JSON object.

Run: .venv/bin/python bench/plan_accuracy.py [--cards params/quickstart.yaml params/examples/ticket-packed.yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CARDS = ["params/quickstart.yaml", "params/examples/ticket-packed.yaml"]


def measure(card: str, runs: Path) -> dict:
    """Run one card and set its predicted training time against the measured one."""
    env = {**os.environ, "LABKIT_RUNS": str(runs), "LABKIT_REPORT": "0"}
    proc = subprocess.run([sys.executable, "-m", "labkit", "run", card], cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"card": card, "error": (proc.stderr or proc.stdout)[-600:]}
    (run,) = [p for p in runs.glob("*/*") if (p / "card.yaml").exists()]  # a fresh runs folder: the one run
    plan = json.loads((run / "parameter_check" / "fit.json").read_text())["plan"]
    outcome = json.loads((run / "training" / "outcome.json").read_text())
    measured = outcome["metrics"]["train_runtime"]
    return {"card": card, "run": run.name, "packed": plan["packed"], "predicted_steps": plan["steps"],
            "measured_steps": outcome["steps"], "predicted_seconds": round(plan["train_seconds"], 1),
            "predicted_evaluation_seconds": round(plan["evaluation_seconds"], 1), "measured_seconds": round(measured, 1),
            "error": round((plan["train_seconds"] - measured) / measured, 3),
            "within_25_percent": abs(plan["train_seconds"] - measured) <= 0.25 * measured}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", nargs="+", default=CARDS)
    args = parser.parse_args()
    results = []
    for card in args.cards:
        with tempfile.TemporaryDirectory(prefix="labkit-plan-") as tmp:
            results.append(measure(card, Path(tmp)))
    print(json.dumps({"benchmark": "plan_accuracy", "target": "predicted within 25 % of measured",
                      "results": results}, indent=1))


if __name__ == "__main__":
    main()
