"""`labkit.train.process_state.prepare`: the process state before the model loads, and its one-line refusals when a
process was not started with the accelerate config the card asks for (the sharded loading itself is measured in
tests/integration/test_sharded_loading.py)."""

from __future__ import annotations

import importlib.util

import pytest
from accelerate import PartialState
from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.errors import StageFailed
from labkit.model.loading import sharded_loading
from labkit.train.process_state import prepare, zero3_config


@pytest.fixture
def fresh_state():
    PartialState._reset_state()
    yield
    PartialState._reset_state()


def _card(**distributed: object):
    return updated(load_card(REPO / "params" / "smoke.yaml").card,
                   {f"distributed.{k}": v for k, v in {"launcher": "accelerate", "num_processes": 2, **distributed}.items()})


def test_one_process_gets_a_plain_state_and_no_sharded_loading(fresh_state, monkeypatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "ACCELERATE_USE_FSDP"):
        monkeypatch.delenv(name, raising=False)
    state = prepare(load_card(REPO / "params" / "smoke.yaml").card, "cpu")
    assert state.num_processes == 1 and sharded_loading() is None


@pytest.mark.parametrize(("strategy", "variable"), [("fsdp", "ACCELERATE_USE_FSDP"),
                                                    ("deepspeed", "ACCELERATE_USE_DEEPSPEED")])
def test_a_sharded_card_outside_its_launch_config_fails_in_one_line(fresh_state, monkeypatch, strategy: str,
                                                                    variable: str) -> None:
    monkeypatch.delenv(variable, raising=False)
    with pytest.raises(StageFailed, match=rf"^distributed.strategy: {strategy}, but .*{variable} is not set.*labkit run"):
        prepare(_card(strategy=strategy), "cpu")


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="DeepSpeed installed")
def test_zero3_without_deepspeed_names_the_extra_and_the_alternative() -> None:
    with pytest.raises(StageFailed, match=r"pip install 'labkit\[deepspeed\]'.*strategy: fsdp"):
        zero3_config()
