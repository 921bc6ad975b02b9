"""Benchmark: torch's threads per process when two processes share the cores (how `make test` runs: two
pytest-xdist workers, each starting kernels and `labkit` processes).

Two processes train the tiny Llama of the tests (`tiny:llama`, built offline) side by side, a full step each time
(forward, backward, AdamW) at micro-batch 4 × 199 tokens (the smoke card's longest row), first with every core's
worth of threads each (torch's default: the cores are oversubscribed twice), then with half the cores each (what
`tests/conftest.py` sets under pytest-xdist); one process alone with every core is the reference. The settings run
interleaved `--rounds` times in one run; medians of each process's mean step time are reported. Prints one JSON
object.

Run: .venv/bin/python bench/threads.py [--steps 40] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEP = """
import json, sys, time
import torch
from transformers import AutoModelForCausalLM
from labkit.model.sources import resolve
model = AutoModelForCausalLM.from_pretrained(resolve("tiny:llama").location)
ids = torch.randint(0, model.config.vocab_size, (4, 199), generator=torch.Generator().manual_seed(0))
optimiser = torch.optim.AdamW(model.parameters())
def step():
    model(input_ids=ids, labels=ids).loss.backward()
    optimiser.step()
    optimiser.zero_grad()
for _ in range(3):
    step()
start = time.perf_counter()
for _ in range(int(sys.argv[1])):
    step()
print(json.dumps({"threads": torch.get_num_threads(), "seconds_per_step": (time.perf_counter() - start) / int(sys.argv[1])}))
"""


def _side_by_side(processes: int, threads: int, steps: int) -> list[dict]:
    """`processes` copies of the step loop started together, each with `threads` OpenMP threads."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    procs = [subprocess.Popen([sys.executable, "-c", STEP, str(steps)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(processes)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=1800)
        if proc.returncode:
            raise SystemExit(f"bench/threads.py: a step loop failed: {err.strip().splitlines()[-1:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="timed steps per process")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the three settings")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    settings = {"alone_all_cores": (1, cores), "two_all_cores_each": (2, cores),
                "two_half_cores_each": (2, max(1, cores // 2))}
    _side_by_side(1, cores, 1)  # builds the tiny model into the cache before anything is timed
    seconds: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(args.rounds):
        for name, (processes, threads) in settings.items():
            seconds[name] += [r["seconds_per_step"] for r in _side_by_side(processes, threads, args.steps)]
    median = {name: statistics.median(values) for name, values in seconds.items()}
    print(json.dumps({
        "cores": cores, "steps": args.steps, "rounds": args.rounds,
        "threads": {name: threads for name, (_, threads) in settings.items()},
        "seconds_per_step": {name: round(value, 4) for name, value in median.items()},
        "seconds_per_step_all": {name: [round(v, 4) for v in values] for name, values in seconds.items()},
        "oversubscribed_over_shared": round(median["two_all_cores_each"] / median["two_half_cores_each"], 2),
        "shared_over_alone": round(median["two_half_cores_each"] / median["alone_all_cores"], 2),
    }, indent=1))


if __name__ == "__main__":
    main()
