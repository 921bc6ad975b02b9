"""A stage kernel's start under `labkit run` (`labkit.core.kernel`): plain-text progress bars and the libraries' log
records in the run's log, before any library is imported; the libraries' warnings about their own calls hidden. Run
in a fresh interpreter: each changes process state."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from labkit.core.kernel import LOG, start_line

REPO = Path(__file__).resolve().parents[3]


def test_kernel_start_line_sets_plain_bars_and_routes_library_logs(tmp_path: Path) -> None:
    run = tmp_path / "a run's folder"  # a space and a quote survive the line
    run.mkdir()
    code = "\n".join([
        start_line(run, "baseline"),
        "import logging, sys, tqdm.auto",
        "logging.getLogger('bitsandbytes.backends').warning('a notice at import')",  # no handler of its own
        "print(tqdm.auto.tqdm.__name__, 'transformers' in sys.modules, 'datasets' in sys.modules)",
    ])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["StdoutTqdm", "False", "False"]  # nothing heavy imported by the start itself
    assert proc.stderr == ""  # the record went to the run's log, not to stderr (an archived notebook's red block)
    log = (run / LOG).read_text(encoding="utf-8")
    assert "baseline bitsandbytes.backends WARNING: a notice at import" in log


def test_without_the_start_the_record_reaches_stderr(tmp_path: Path) -> None:
    code = "import logging\nlogging.getLogger('bitsandbytes.backends').warning('a notice at import')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "a notice at import" in proc.stderr  # what the start prevents


def test_peft_s_own_rank_pattern_warning_is_hidden_and_only_it(tmp_path: Path) -> None:
    """LoRA on a mixture of experts (`all-linear`): PEFT doubles the fused gate/up weight's rank itself, applies it and
    warns it "matched no targeted module"; every labkit process hides that line, and nothing else."""
    import yaml

    raw = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    raw["model"]["source"] = "tiny:qwen3moe"
    card = tmp_path / "moe.yaml"
    card.write_text(yaml.safe_dump(raw))
    code = "\n".join([
        "import sys, warnings",
        "from labkit.core.kernel import quiet_unactionable",
        "if sys.argv[2] == 'quiet': quiet_unactionable()",
        "from labkit.card.load import load_card",
        "from labkit.preflight.sizing import check_method",
        "assert check_method(load_card(sys.argv[1]))",  # what `labkit run` does before stage 01
        "warnings.warn('The following rank_pattern keys did not match: a user warning', UserWarning)",
    ])
    said = {}
    for mode in ("quiet", "plain"):
        proc = subprocess.run([sys.executable, "-c", code, str(card), mode], capture_output=True, text=True,
                              timeout=300, cwd=REPO)
        assert proc.returncode == 0, proc.stderr
        said[mode] = proc.stderr
    for pattern in ("rank_pattern", "alpha_pattern"):
        line = f"RuntimeWarning: The following {pattern} keys did not match any targeted module"
        assert line in said["plain"] and line not in said["quiet"]
    assert "UserWarning: The following rank_pattern keys did not match: a user warning" in said["quiet"]
