"""Shared fixtures: an isolated cache and runs folder per test session, the repository paths."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Under pytest-xdist each worker (and every kernel and `labkit` process it starts) gets its share of the cores for
# torch's threads: two processes' OpenMP threads spinning on the same 2 cores made a tiny model's step 10-15x slower
# (docs/benchmarks.md#test-suite). A value the caller set stands.
if (_workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))) > 1:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _cores // _workers)))


@pytest.fixture(scope="session", autouse=True)
def _isolated(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep tests away from the user's cache and runs; never touch a hub."""
    base = tmp_path_factory.mktemp("labkit")
    os.environ.setdefault("LABKIT_CACHE", str(base / "cache"))
    os.environ["LABKIT_RUNS"] = str(base / "runs")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["LABKIT_REPORT"] = "0"  # the experiment report is built by the tests that check it (test_experiment)


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tiny_model():
    """The tiny:llama model source, built offline once per session."""
    from labkit.model.sources import resolve

    return resolve("tiny:llama")


def labkit(*args: str, runs: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "LABKIT_RUNS": str(runs)}
    return subprocess.run([sys.executable, "-m", "labkit", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


SECRETS = {"HF_TOKEN": "hf_labkitPLANTEDtoken0123456789", "WANDB_API_KEY": "labkit-planted-wandb-key-42",
           "MY_SERVICE_PASSWORD": "labkit-planted-password-7"}
TOKEN_FILE_SECRET = "hf_labkitPLANTEDtokenFILE9876543210"


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """The smoke card through `labkit run`, with fake secrets planted in the environment and in the HF token file."""
    runs = tmp_path_factory.mktemp("runs")
    hf_home = tmp_path_factory.mktemp("hf_home")
    (hf_home / "token").write_text(TOKEN_FILE_SECRET)
    before = dict(os.environ)
    os.environ.update(SECRETS, HF_HOME=str(hf_home))
    try:
        proc = labkit("run", "params/smoke.yaml", runs=runs)
    finally:
        os.environ.clear()
        os.environ.update(before)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = [p for p in (runs / "smoke").iterdir() if not p.name.startswith("_")]
    return run, proc


def top_level_names(path: Path) -> set[str]:
    """The names a Python module defines or imports at its top level (for the tests that check named modules)."""
    import ast

    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def write_run_files(tmp: Path, name: str, seconds: float, epoch: float = 1.0) -> Path:
    """A run folder holding only what the run metrics read: stage 04's outcome, stage 03's plan and memory."""
    import json

    run = tmp / name
    (run / "training").mkdir(parents=True)
    (run / "parameter_check").mkdir()
    (run / "training" / "outcome.json").write_text(json.dumps(
        {"steps": 63, "world_size": 1, "metrics": {"train_runtime": seconds, "epoch": epoch}}))
    (run / "parameter_check" / "fit.json").write_text(json.dumps({"plan": {"train_tokens": 50_000, "train_seconds": 300.0}}))
    (run / "parameter_check" / "memory.json").write_text(json.dumps(
        {"comparison": [{"peak_gib_measured": 1.5}, {"peak_gib_measured": 2.25}]}))
    return run


def smoke_rows(n: int = 24) -> list[dict]:
    """The first `n` non-empty mapped rows of the smoke card's data."""
    from labkit.card.load import load_card
    from labkit.data import sources as D

    card = load_card(REPO / "params" / "smoke.yaml").card
    return [r for r in D.map_fields(card.data, D.load_source(card.data)[0]) if r["input"].strip()][:n]


@pytest.fixture
def card():
    """The smoke card (params/smoke.yaml), loaded fresh for each test (a test module may define its own)."""
    from labkit.card.load import load_card

    return load_card(REPO / "params" / "smoke.yaml").card


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    """`smoke_rows()` once per module (a test module may define its own)."""
    return smoke_rows()


def mistral3_card(tmp_path: Path) -> Path:
    """A smoke card on a local Mistral 3 checkpoint (the format of Mistral Small 3.1 and Ministral 3: a vision tower
    beside a `ministral3` text decoder; tiny:llama's tokenizer), which transformers has no causal-LM class for.
    Model source line: 3. Returns the card's path; the checkpoint is `tmp_path / "mistral3"`."""
    import shutil

    import transformers

    from labkit.model.sources import resolve

    folder = tmp_path / "mistral3"
    text = {"model_type": "ministral3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 600}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 32, "patch_size": 16, "head_dim": 16}
    config = transformers.Mistral3Config(text_config=text, vision_config=vision)
    transformers.Mistral3ForConditionalGeneration(config).save_pretrained(folder)
    tokenizer = Path(resolve("tiny:llama").location)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tokenizer / name, folder)
    card = tmp_path / "card.yaml"
    card.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\nexperiment: {{variant: mistral3}}\n"
                    f"model: {{source: '{folder}', dtype: float32}}\n")
    return card


MISTRAL3_REFUSAL = ("its config is mistral3 (Mistral3Config), which transformers does not load as a causal LM "
                    "(AutoModelForCausalLM); its text decoder (ministral3) is one: point model.source at a text-only "
                    "copy of it")
