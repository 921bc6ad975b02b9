"""bench/gpu_check.py: without CUDA it refuses in one line and exits non-zero; its CPU dry run runs the whole list.

The dry run is the real script in a subprocess (the suite's machines have no GPU): every part runs on the CPU, sized
down, and the JSON names what the CPU cannot run. bench/gpu_setup.sh is checked for the packages it installs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

SCRIPT = REPO / "bench" / "gpu_check.py"


def test_without_cuda_it_exits_non_zero_with_one_line() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, also on a machine that has one
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0] and "--cpu-dry-run" in lines[0]


@pytest.fixture(scope="module")
def dry_run() -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, str(SCRIPT), "--cpu-dry-run"], capture_output=True, text=True, timeout=1200,
                         env=env)
    assert out.returncode == 0, _why(out)
    return json.loads(out.stdout)


def _why(out: subprocess.CompletedProcess) -> str:
    """What a failed dry run missed, first (the JSON's "misses"), then its first traceback, then its last output."""
    try:
        missed = json.loads(out.stdout).get("misses")
    except ValueError:
        missed = out.stdout[-3000:]
    first = out.stderr.find("Traceback")
    return (f"misses: {missed}\n" + (out.stderr[first:first + 3000] + "\n…\n" if first >= 0 else "")
            + out.stderr[-2000:])


def test_cpu_dry_run_passes_every_part(dry_run: dict) -> None:
    got = dry_run
    assert got["benchmark"] == "gpu_check" and got["ok"] and got["misses"] == [] and got["cpu_dry_run"]
    assert got["device"]["type"] == "cpu" and got["llama"]["config"]["vocab_size"] > 600
    names = [a["arm"] for a in got["arms"]]
    assert names == ["phi-fp32", "mistral-fp32", "llama-fp32-checkpointing", "llama-fp32-plain"]
    for arm in got["arms"]:
        fit = arm["fit_and_memory"]
        assert fit["verdict"]["fits"] and fit["measured_by"] in ("VmHWM", "sampled RSS")
        assert fit["measured_step_bytes"] > 0 and fit["estimate_step_bytes"] > 0
        assert fit["timed_by"] == "timed pass" and fit["seconds_per_step"] > 0  # the CPU times after measuring
        assert arm["stage03_step_vs_steady"] > 0
        assert arm["speed"]["tokens_per_second"] > 0 and arm["speed"]["warmup_steps"] >= 1
        assert len(arm["speed"]["step_seconds"]) == arm["speed"]["warmup_steps"] + arm["speed"]["timed_steps"]
        assert arm["optimizer"] == "paged_adamw_8bit" and arm["nonfinite"] == 0 and arm["finite_values_checked"] > 0
    checked = [a for a in got["arms"] if "stage03" in a]
    assert [a["arm"] for a in checked] == names[:3]
    assert all(a["stage03"][c]["ok"] for a in checked for c in ("update", "accumulation", "checkpointing"))
    assert {a["arm"]: a["checkpointing"] for a in got["arms"]}["llama-fp32-plain"] is False


def test_cpu_dry_run_names_what_the_cpu_cannot_run(dry_run: dict) -> None:
    skipped = {s.get("arm") or s.get("part"): s["reason"] for s in dry_run["skipped"]}
    assert {"phi-fp16", "mistral-fp16", "llama-fp16-checkpointing"} <= set(skipped)
    assert all("fp16" in skipped[n] for n in ("phi-fp16", "mistral-fp16", "llama-fp16-checkpointing"))


def test_cpu_dry_run_generates_in_4_bits_exports_and_packs(dry_run: dict) -> None:
    gen, export, packed = dry_run["generation"], dry_run["export"], dry_run["packing"]
    assert gen["linear_4bit_layers"] > 0 and gen["logits_finite"] and gen["rows"] == gen["answers"] == 8
    assert export["ok"] and export["reload_check"]["ok"] and export["reload_check"]["identical"]
    assert export["reload_check"]["sample_batches"] == 1 and export["nonfinite"] == 0 and export["run"]["steps"] == 2
    assert any(name.endswith(".safetensors") for name in export["merged_files"])
    assert packed["ok"] and packed["max_difference"] <= packed["tolerance"]


def test_setup_installs_the_pinned_minimum() -> None:
    script = (REPO / "bench" / "gpu_setup.sh").read_text()
    pinned = {line.split("==")[0].lower() for line in (REPO / "requirements.txt").read_text().splitlines()
              if re.match(r"^[A-Za-z]", line)}
    names = set(re.search(r"for name in (.*?); do", script, re.S).group(1).replace("\\", " ").lower().split())
    assert {"transformers", "peft", "trl", "accelerate", "bitsandbytes", "datasets", "rouge_score"} <= names <= pinned
    assert not names & {"jupyterlab", "mlflow", "playwright", "papermill"}
    assert "--no-deps" in script
    assert subprocess.run(["bash", "-n", str(REPO / "bench" / "gpu_setup.sh")]).returncode == 0
