"""The command line starts fast: `import labkit.cli.main` and `labkit check CARD` load none of the libraries that take
seconds to import (torch, transformers, datasets, peft, trl, accelerate); the stages that never train (01, 02) start
without the training stack (peft with bitsandbytes, trl, wandb: seconds of each of their kernels' start).

Each probe runs in a fresh interpreter (this test process has imported them long ago) and reports which of them are
in `sys.modules` when it ends. The last test shows the probe sees such an import when one happens, so an empty report
means what it says.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "transformers", "datasets", "peft", "trl", "accelerate")
TRAINING = ("peft", "bitsandbytes", "trl", "wandb")


def _loaded(code: str, tmp_path: Path, watched: tuple[str, ...] = HEAVY) -> tuple[list[str], str]:
    """Run `code` in a fresh interpreter (this checkout first on the path); the `watched` libraries it left imported,
    and what it printed."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {watched!r} if m in sys.modules)))\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "LABKIT_RUNS": str(tmp_path / "runs")}
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    *printed, last = proc.stdout.strip().splitlines()
    return json.loads(last), "\n".join(printed)


def test_importing_the_command_line_loads_no_heavy_library(tmp_path: Path) -> None:
    loaded, _ = _loaded("import labkit.cli.main", tmp_path)
    assert loaded == []


@pytest.mark.parametrize("card", ["params/smoke.yaml", "params/quickstart.yaml"])
def test_labkit_check_loads_no_heavy_library(card: str, tmp_path: Path) -> None:
    code = f"from labkit.cli.main import main\nassert main(['check', {card!r}]) == 0"
    loaded, printed = _loaded(code, tmp_path)
    assert f"{card}: ok (" in printed  # the check ran and passed
    assert "protocol:" in printed
    assert loaded == []


def _notebook_imports(name: str) -> str:
    """The import statements of a notebook's code cells (its kernel's imports), one per line: bench/stage_start.py's
    reading, the one its timings rest on."""
    spec = importlib.util.spec_from_file_location("stage_start", REPO / "bench" / "stage_start.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.notebook_imports(REPO / "notebooks" / f"{name}.ipynb")


@pytest.mark.parametrize("notebook", ["01_baseline", "02_preprocessing"])
def test_a_stage_that_never_trains_starts_without_the_training_stack(notebook: str, tmp_path: Path) -> None:
    imports = _notebook_imports(notebook)
    assert "labkit.stages.context" in imports and "labkit.show" in imports
    loaded, _ = _loaded(imports, tmp_path, TRAINING)
    assert loaded == []


@pytest.mark.parametrize("code, library", [("import labkit.model.loading", "torch"),
                                           ("import labkit.data.reading", "datasets"),
                                           ("notebook 04_training", "trl")])
def test_the_probe_sees_a_heavy_import(code: str, library: str, tmp_path: Path) -> None:
    if code.startswith("notebook "):  # read when the test runs, not when the suite is collected
        code = _notebook_imports(code.removeprefix("notebook "))
    loaded, _ = _loaded(code, tmp_path, HEAVY + TRAINING)
    assert library in loaded
