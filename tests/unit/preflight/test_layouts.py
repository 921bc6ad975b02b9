"""Each GPU's memory under ddp, fsdp, ZeRO-2/3 and CPU offload, from Llama 3 8B's config on the meta device: the
terms are what the formulas of `labkit.preflight.layouts` give, ddp is today's single-GPU number, and a card that
does not fit one GPU is told the fewest GPUs and the layout that fit."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO
from test_sizing import terms_add_up

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.cli.main import main
from labkit.errors import UsageError
from labkit.preflight.gpus import GPUS, gpu_named
from labkit.preflight.layouts import fitting_layout, layout_of, layout_verdict, per_gpu
from labkit.preflight.memory import GIB, estimate_step
from labkit.preflight.scaling import (
    EFFICIENCY_ACROSS_MACHINES,
    EFFICIENCY_WITHIN_MACHINE,
    parallel_steps,
    scaled,
    scaling_efficiency,
)
from labkit.preflight.sizing import NCCL_GIB, estimate_config, fit_verdict, gpu_profile

EXAMPLE = REPO / "params" / "examples" / "llama3-8b-qlora.yaml"
H100 = gpu_profile(80, "9.0")
WEIGHTS = ("weights_frozen", "weights_4bit", "trainable_parameters")


@pytest.fixture(scope="module")
def full_8b():
    """Llama 3 8B, a full fine-tune with AdamW (16 GB of bf16 weights, 32 GB of states): one step, one process."""
    loaded = load_card(EXAMPLE)
    config = estimate_config(loaded.card, loaded.path)
    card = updated(loaded.card, {"method": {"kind": "full"}, "train.optimizer": "adamw"})
    return card, config, estimate_step(config, card, 512, device=H100)


def _layout(lid: str, n: int, machines: int = 1) -> dict:
    return {"id": lid, "processes": n, "machines": machines, "per_machine": n // machines}


def test_ddp_is_todays_single_gpu_number(full_8b) -> None:
    card, config, est = full_8b
    assert 7.9e9 < est["trainable"] < 8.1e9 and est["breakdown"]["weights_frozen"] == 0
    ddp = per_gpu(est, _layout("ddp", 4))
    assert (ddp["peak_bytes"], ddp["step_bytes"], ddp["weights_bytes"]) == (est["peak_bytes"], est["step_bytes"],
                                                                          est["weights_bytes"])
    assert {k: v for k, v in ddp["breakdown"].items() if k != "gathered_layer"} == est["breakdown"]
    ddp_card = updated(card, {"distributed": {"launcher": "accelerate", "strategy": "ddp", "num_processes": 4}})
    machine = gpu_profile(80, "9.0", count=4)  # 4 × H100: a machine of the card's processes
    today = fit_verdict(config, ddp_card, 512, 80 * GIB, machine, free_is_total=True)
    assert layout_verdict(config, ddp_card, 512, 80 * GIB, machine, layout_of(ddp_card), True) == today
    single = layout_of(card)
    assert single == _layout("single", 1) and per_gpu(est, single)["peak_bytes"] == est["peak_bytes"]
    assert layout_verdict(config, card, 512, 80 * GIB, H100, single, True) == fit_verdict(
        config, card, 512, 80 * GIB, H100, free_is_total=True)


@pytest.mark.parametrize("lid", ["fsdp", "zero2", "zero3", "zero2_offload", "zero3_offload"])
def test_sharded_terms_are_the_formulas(full_8b, lid: str) -> None:
    _, _, est = full_8b
    b, n, layers = est["breakdown"], 4, est["shape"]["layers"]
    weights, grads, states = sum(b[k] for k in WEIGHTS), b["gradients"], b["optimizer_states"]
    shard_weights = lid in ("fsdp", "zero3", "zero3_offload")
    gathered = weights / layers if shard_weights else 0.0
    gpu_weights = 0.0 if lid == "zero3_offload" else weights / n if shard_weights else weights
    gpu_states = 0.0 if lid.endswith("offload") else states / n
    others = max(v for k, v in est["phases"].items() if k != "optimizer_update")
    got = per_gpu(est, _layout(lid, n, machines=2))
    assert got["breakdown"]["gradients"] == pytest.approx(grads / n)
    assert got["breakdown"]["optimizer_states"] == pytest.approx(gpu_states)
    assert got["breakdown"]["gathered_layer"] == pytest.approx(gathered)
    assert got["breakdown"]["activations"] == b["activations"]  # per GPU: each process runs its own micro-batch
    assert got["weights_bytes"] == pytest.approx(gpu_weights)
    assert got["peak_bytes"] == pytest.approx(gpu_weights + gpu_states + max(others + gathered, grads / n))
    host = (states / n if lid.endswith("offload") else 0.0) + (weights / n if lid == "zero3_offload" else 0.0)
    assert got["host_bytes_per_machine"] == pytest.approx(2 * host)  # 2 processes per machine
    assert got["peak_bytes"] < est["peak_bytes"]


def test_sharded_verdict_adds_the_margins(full_8b) -> None:
    card, config, est = full_8b
    layout = _layout("zero3", 8)
    verdict = layout_verdict(config, card, 512, 80 * GIB, H100, layout, True, est)
    assert verdict["overheads"]["nccl_buffers"] == NCCL_GIB * GIB and "ddp_buckets" not in verdict["overheads"]
    assert verdict["needed_bytes"] == pytest.approx(per_gpu(est, layout)["peak_bytes"] + sum(
        verdict["overheads"].values()))
    assert verdict["fits"] and verdict["message"].startswith("fits with ") and "per GPU" in verdict["message"]


def test_qlora_shards_the_frozen_base_and_the_adapter_is_small() -> None:
    loaded = load_card(EXAMPLE)
    card, config = loaded.card, estimate_config(loaded.card, loaded.path)
    est = estimate_step(config, card, 512, device=H100)
    got = per_gpu(est, _layout("fsdp", 2))
    assert got["breakdown"]["weights_4bit"] == pytest.approx(est["breakdown"]["weights_4bit"] / 2)
    assert got["breakdown"]["weights_frozen"] == pytest.approx(est["breakdown"]["weights_frozen"] / 2)
    assert est["breakdown"]["optimizer_states"] < 0.05 * est["weights_bytes"]  # the adapter's states: small


def test_a_card_too_large_for_one_gpu_gets_the_fewest_gpus_that_fit(full_8b) -> None:
    card, config, est = full_8b
    free = 40 * GIB  # an A100 40 GB: 15 GiB of bf16 weights, as much of gradients, twice that of AdamW states
    assert not layout_verdict(config, card, 512, free, H100, layout_of(card), True)["fits"]
    found = fitting_layout(config, card, 512, free, H100, est=est)
    n = found["layout"]["processes"]
    assert found["layout"]["id"] == "fsdp" and n >= 2 and found["needed_bytes"] <= free
    smaller = [_layout(lid, n // 2) for lid in ("fsdp", "zero2", "zero3", "zero2_offload", "zero3_offload")]
    assert n == 2 or not any(layout_verdict(config, card, 512, free, H100, lay, True, est)["fits"] for lay in smaller)
    tiny_gpu = 1 * GIB  # nothing up to 64 GPUs: the activations alone are larger
    assert fitting_layout(config, card, 512, tiny_gpu, H100, est=est) is None


def test_layout_of_the_card_and_the_overrides() -> None:
    card = load_card(EXAMPLE).card
    assert layout_of(card, processes=4, machines=2) == _layout("ddp", 4, 2)
    assert layout_of(card, 2, None, "zero3_offload")["id"] == "zero3_offload"
    ds = updated(card, {"distributed": {"launcher": "accelerate", "strategy": "deepspeed", "zero_stage": 3,
                                        "offload": "cpu", "num_processes": 2}})
    assert layout_of(ds) == _layout("zero3_offload", 2)
    with pytest.raises(UsageError, match=r"^--processes 3 --machines 2: .* multiple of the machines"):
        layout_of(card, 3, 2)
    with pytest.raises(UsageError, match=r"^--processes 0 --machines 1: "):
        layout_of(card, 0)
    with pytest.raises(UsageError, match=r"^--gpu B300: not a GPU labkit knows \(T4, L4,"):
        gpu_named("B300")
    assert gpu_named("l4") == GPUS["L4"] and GPUS["L4"].capability == "8.9"


def test_scaling_efficiency_is_assumed_until_measured() -> None:
    assert scaling_efficiency(1, 1) == 1.0
    assert scaling_efficiency(4, 1) == EFFICIENCY_WITHIN_MACHINE == 0.9
    assert scaling_efficiency(4, 2) == EFFICIENCY_ACROSS_MACHINES == 0.8
    assert scaled(2.0, 4, 2) == {"seconds_per_step": 2.5, "efficiency": 0.8, "efficiency_source": "assumed"}
    assert scaled(2.0, 4, 2, measured_at=4)["efficiency_source"] == "measured"
    card = updated(load_card(EXAMPLE).card, {"train.max_steps": None})  # one epoch of micro-batch 4 × grad_accum 4
    assert parallel_steps(card, 1000, 1) == 63 and parallel_steps(card, 1000, 4) == 16  # ceil(ceil(1000/16)/4)
    assert parallel_steps(updated(card, {"train.max_steps": 30}), 1000, 4) == 30


def _gib(out: str, term: str) -> list[float]:
    return [float(line.split()[-2]) for line in out.splitlines() if line.strip().startswith(term + " ")]


def test_labkit_estimate_on_two_machines(capsys: pytest.CaptureFixture, tmp_path) -> None:
    assert main(["estimate", str(EXAMPLE), "--gpu", "L4", "--processes", "2", "--machines", "2"]) == 0
    out = capsys.readouterr().out
    assert "device: 1 × L4 (cuda, sm_89, 22 GiB each): weights bfloat16" in out
    assert "per GPU under ddp (replicated), 2 processes on 2 machines (1 per machine):" in out
    one, each = _gib(out, "weights (4-bit)")
    assert one == each > 3  # ddp: everything replicated
    assert "DDP gradient buckets" in out and "verdict per GPU: fits: fits with" in out
    assert ("training time: an epoch's steps ÷ 2 processes, each step ÷ 0.8 scaling efficiency (assumed, across "
            "machines") in out
    assert main(["estimate", str(EXAMPLE), "--gpu", "L4", "--processes", "4", "--machines", "2",
                 "--strategy", "zero3_offload"]) == 0
    out = capsys.readouterr().out
    assert "per GPU under deepspeed ZeRO-3, optimiser and weights offload to CPU, 4 processes on 2 machines" in out
    assert _gib(out, "weights (4-bit)") == [one] and "gathered layer (whole)" in out  # weights on the host
    assert terms_add_up(out, "step at micro-batch") and terms_add_up(out, "per GPU under")
    assert "host memory per machine (CPU offload: optimiser states, weights (frozen), weights (4-bit), trainable " \
           "parameters):" in out and "for its 2 process(es)" in out
    # a full fine-tune of the 8B model does not fit one A100 40 GB: the fewest GPUs that do, and how
    full = tmp_path / "full.yaml"
    resolved = load_card(EXAMPLE).resolved
    full.write_text(yaml.safe_dump({**resolved, "method": {"kind": "full"},
                                    "train": {**resolved["train"], "optimizer": "adamw"}}))
    config = EXAMPLE.parent / "configs" / "meta-llama--Meta-Llama-3-8B-Instruct.json"
    assert main(["estimate", str(full), "--gpu", "A100", "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "verdict: does not fit" in out and "fits with fsdp on 2× A100: " in out
    # a card of 2 processes on one machine is sized on a machine of 2 GPUs (the export line too)
    ddp = tmp_path / "ddp.yaml"
    ddp.write_text(yaml.safe_dump({**resolved, "distributed": {"launcher": "accelerate", "strategy": "ddp",
                                                               "num_processes": 2}}))
    assert main(["estimate", str(ddp), "--gpu", "L4", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "device: 2 × L4 (cuda, sm_89, 22 GiB each)" in out and "export (bfloat16 merge" in out
    assert "per GPU under ddp (replicated), 2 processes on one machine:" in out
    assert main(["estimate", str(EXAMPLE), "--gpu", "L4", "--processes", "3", "--machines", "2"]) == 2
    assert capsys.readouterr().err.strip().endswith("must be a positive multiple of the machines (e.g. --processes 4 "
                                                    "--machines 2)")
