"""Benchmark: what each stage's kernel spends importing, a base commit's labkit against this checkout's, side by side.

Every notebook's import statements (its code cells' `import` / `from … import` lines, what its kernel runs before any
work) run in a fresh interpreter, for the base commit (`git archive BASE` into a temporary folder, first on the path)
and for this checkout, alternated (old, new, old, new, … with --repeats). Prints one JSON object: per notebook the
median seconds of each, their ratio (old / new) and the training libraries each left imported.

Run: .venv/bin/python bench/stage_start.py [--base 2778664] [--repeats 5]
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASE = "2778664"  # before the stages that never train stopped importing the training stack
WATCHED = ("torch", "transformers", "peft", "bitsandbytes", "trl", "wandb")


def checkout(commit: str, into: Path) -> Path:
    """The tree of `commit` (git archive), unpacked into `into`."""
    data = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def notebook_imports(path: Path) -> str:
    """The import statements of a notebook's code cells, one per line."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    nodes = [n for c in cells if c["cell_type"] == "code" for n in ast.parse("".join(c["source"])).body
             if isinstance(n, (ast.Import, ast.ImportFrom))]
    return "\n".join(ast.unparse(n) for n in nodes)


def timed_imports(tree: Path, code: str) -> tuple[float, list[str]]:
    """Seconds a fresh interpreter takes to run `code` with `tree`'s labkit first on the path (start included), and
    the watched libraries it left imported."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {WATCHED!r} if m in sys.modules)))\n"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: the imports failed:\n{proc.stderr[-2000:]}")
    return seconds, json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=BASE, help="the commit whose imports are the 'old' ones")
    parser.add_argument("--repeats", type=int, default=5, help="old/new pairs per notebook")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    results = []
    with tempfile.TemporaryDirectory(prefix="labkit-start-") as tmp:
        base = checkout(args.base, Path(tmp) / "base")
        for notebook in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")):
            trees = {"old": (base, notebook_imports(base / "notebooks" / notebook.name)),
                     "new": (REPO, notebook_imports(notebook))}
            seconds: dict[str, list[float]] = {"old": [], "new": []}
            loaded = {}
            for _ in range(args.repeats):
                for label, (tree, code) in trees.items():
                    took, loaded[label] = timed_imports(tree, code)
                    seconds[label].append(took)
            old, new = statistics.median(seconds["old"]), statistics.median(seconds["new"])
            results.append({"notebook": notebook.stem, "old_seconds": round(old, 2), "new_seconds": round(new, 2),
                            "ratio": round(old / new, 2), "old_loaded": loaded["old"],
                            "new_loaded": loaded["new"]})
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "stage_start", "base": args.base, "commit": commit,
                      "date": time.strftime("%Y-%m-%d"), "repeats": args.repeats,
                      "load_at_end": round(os.getloadavg()[0], 1), "results": results}, indent=1))


if __name__ == "__main__":
    main()
