"""Shared fixtures: an isolated cache and runs folder per test session, the repository paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


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


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tiny_model():
    """The tiny:llama model source, built offline once per session."""
    from labkit.models import resolve

    return resolve("tiny:llama")
