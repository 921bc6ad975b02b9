"""The command line starts fast: `import labkit.cli.main` and `labkit check CARD` load none of the libraries that take
seconds to import (torch, transformers, datasets, peft, trl, accelerate).

Each probe runs in a fresh interpreter (this test process has imported them long ago) and reports which of them are
in `sys.modules` when it ends. The last test shows the probe sees such an import when one happens, so an empty report
means what it says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "transformers", "datasets", "peft", "trl", "accelerate")


def _loaded(code: str, tmp_path: Path) -> tuple[list[str], str]:
    """Run `code` in a fresh interpreter (this checkout first on the path); the heavy libraries it left imported,
    and what it printed."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
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


@pytest.mark.parametrize("module, library", [("labkit.model.loading", "torch"), ("labkit.data.reading", "datasets")])
def test_the_probe_sees_a_heavy_import(module: str, library: str, tmp_path: Path) -> None:
    loaded, _ = _loaded(f"import {module}", tmp_path)
    assert library in loaded
