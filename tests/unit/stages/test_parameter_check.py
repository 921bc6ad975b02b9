"""Stage 03's module on the smoke card (tiny model, real trainer): it writes every file the stage owns, its summary
keeps the keys its readers use and adds each check's seconds, its decision raises a labkit error, and the shared
model leaves the checks as it was loaded."""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from labkit.core import io
from labkit.data.prompting import encode_rows
from labkit.errors import LabkitError, StageFailed
from labkit.preflight.measure import CUDA_METHOD, step_time_kept
from labkit.preflight.memory_check import time_lengths
from labkit.preflight import timing
from labkit.preflight.timing import Phases
from labkit.train.trainer import build_trainer
from labkit.stages.run_metrics import run_metrics
from labkit.stages import parameter_check as pc
from labkit.stages.context import open_stage
from labkit.stages.preprocessing import length_stats

FILES = {pc.MATCHED_FILE, pc.PARAMETERS_FILE, pc.UPDATE_FILE, pc.MEMORY_FILE, pc.MEMORY_PLOT, pc.FIT_FILE,
         pc.ACCUMULATION_FILE, pc.CHECKPOINTING_FILE, "summary.json"}


@pytest.fixture(scope="module")
def stage03():
    """Stage 03 through the module's functions, as the notebook calls them, on a fresh interactive smoke run."""
    stage = open_stage("parameter_check", str(REPO / "params" / "smoke.yaml"), "")
    encoded = {s: encode_rows(stage.tokenizer, stage.card, stage.split(s)) for s in ("train", "validation")}
    io.write_json(stage.run.dir / "preprocessing" / "lengths.json", length_stats(stage.card, encoded))  # stage 02's
    checks = pc.open_checks(stage)
    pc.target_modules(stage, checks)
    pc.parameters(stage, checks)
    pc.estimate(stage, checks)
    pc.measure_memory(stage, checks, pc.generation(stage, checks))
    pc.plot_memory(stage, checks)
    pc.checkpointing(stage, checks)
    pc.update(stage, checks)
    pc.time_steps(stage, checks)
    pc.fit(stage, checks)
    pc.accumulation(stage, checks)
    summary = pc.decide(stage, checks)
    return stage, checks, summary


def test_the_module_writes_every_file_of_the_stage(stage03) -> None:
    stage, checks, summary = stage03
    assert {p.name for p in stage.out.iterdir()} == FILES
    memory = json.loads(stage.path(pc.MEMORY_FILE).read_text())
    assert set(memory) == {"lengths", "estimates", "measured", "comparison", "generation"}
    assert len(memory["measured"]) == len(memory["comparison"]) == len(checks.lengths) == 2
    fit = json.loads(stage.path(pc.FIT_FILE).read_text())
    assert set(fit) == {"verdict", "plan"} and fit["plan"]["train_seconds"] > 0 and fit["verdict"]["fits"]
    for name in (pc.UPDATE_FILE, pc.ACCUMULATION_FILE, pc.CHECKPOINTING_FILE):
        assert json.loads(stage.path(name).read_text())["ok"], name
    assert stage.path(pc.MEMORY_PLOT).stat().st_size > 1000


def test_summary_keeps_its_readers_keys_and_times_each_check(stage03) -> None:
    stage, checks, summary = stage03
    written = json.loads(stage.path("summary.json").read_text())
    assert written == json.loads(json.dumps(summary))
    assert set(pc.SUMMARY_KEYS) <= set(written) and written["update_ok"] is True and written["method"] == "lora"
    assert written["skipped"] == {}  # every check was measured
    assert written["seconds_per_step"] == checks.fit["plan"]["seconds_per_step"] > 0
    assert len(written["estimate_error"]) == len(written["peak_gib"]) == 2
    timed = written["check_seconds"]
    assert set(timed) == {"load_model", "tokenise", "memory_measurement", "checkpointing_check", "update_check",
                          "timing", "accumulation_check"}
    assert all(v >= 0 for v in timed.values()) and timed["memory_measurement"] > 0 and timed["timing"] > 0
    assert written["seconds"] >= sum(timed.values()) - 1  # the stage's wall time covers its checks


def test_run_metrics_reads_the_stage_files(stage03) -> None:
    stage, checks, _ = stage03
    got = run_metrics(stage.run.dir)
    assert got["predicted_train_seconds"] == pytest.approx(checks.fit["plan"]["train_seconds"])
    assert got["peak_memory_gib"] == pytest.approx(max(r["peak_gib_measured"] for r in checks.memory["comparison"]))


def test_the_shared_model_leaves_the_checks_as_it_was_loaded(stage03) -> None:
    _, checks, _ = stage03
    # two lengths measured and timed, two arms each of checkpointing and accumulation, the update, the end
    assert checks.model.restores >= 10
    assert checks.model.changed() == []
    assert not checks.model.model.is_activation_checkpointing
    assert all(p.grad is None for p in checks.model.model.parameters())


def test_a_failed_check_raises_a_labkit_error_listing_it(stage03) -> None:
    stage, checks, _ = stage03
    update = checks.update
    try:
        checks.update = {**update, "ok": False, "problems": ["3 tensors that must stay frozen changed, e.g. x"]}
        with pytest.raises(StageFailed, match="update check: 3 tensors that must stay frozen changed") as failed:
            pc.decide(stage, checks)
        assert isinstance(failed.value, LabkitError)
    finally:
        checks.update = update


def test_checks_not_measurable_on_this_device_are_shown_and_fail_nothing(stage03) -> None:
    """Arms the estimate says cannot fit are skipped with the reason: the stage's verdict does not count them, the
    files, the decision line and the summary's `skipped` say so."""
    stage, checks, _ = stage03
    measured, phases = (checks.accumulation, checks.checkpointing), checks.phases
    restores = checks.model.restores
    try:
        checks.phases = Phases("cpu")  # a process still measuring (nothing is measured here: no arm fits)
        checkpointing = pc.checkpointing(stage, checks, free_bytes=2**20)
        accumulation = pc.accumulation(stage, checks, free_bytes=2**20)
        assert checks.model.restores == restores + 1  # no arm ran (only the final restore)
        for name, result in ((pc.ACCUMULATION_FILE, accumulation), (pc.CHECKPOINTING_FILE, checkpointing)):
            assert result["skipped"].startswith("not measurable on this device: needs "), result["skipped"]
            assert json.loads(stage.path(name).read_text())["skipped"] == result["skipped"]
        assert pc.failures(checks) == []
        assert pc.skipped_checks(checks) == {"accumulation_check": accumulation["skipped"],
                                             "checkpointing_check": checkpointing["skipped"]}
        text = pc.decision_text(checks)
        assert "accumulation not measurable on this device: needs" in text and "agree" not in text
        checks.accumulation = {**accumulation, "skipped": None, "ok": False, "relative_difference": 0.5,
                               "nonfinite": []}
        assert len(pc.failures(checks)) == 1  # a measured failure still fails
    finally:
        (checks.accumulation, checks.checkpointing), checks.phases = measured, phases
        stage.save_json(pc.ACCUMULATION_FILE, checks.accumulation)
        stage.save_json(pc.CHECKPOINTING_FILE, checks.checkpointing)
    assert pc.failures(checks) == [] and "accumulation and checkpointing agree" in pc.decision_text(checks)


def test_a_nan_in_a_check_fails_the_stage_as_its_own_finding(stage03) -> None:
    stage, checks, _ = stage03
    measured = checks.accumulation
    try:
        checks.accumulation = {**measured, "ok": False, "relative_difference": float("nan"),
                               "nonfinite": ["one batch of 8: step 1: the loss is nan"]}
        assert pc.failures(checks) == ["gradient accumulation: one batch of 8: step 1: the loss is nan"]
        with pytest.raises(StageFailed, match="the loss is nan"):
            pc.decide(stage, checks)
    finally:
        checks.accumulation = measured


def test_plan_text_states_the_processes_and_the_assumed_efficiency(stage03) -> None:
    stage, checks, _ = stage03
    one = pc.plan_text(stage.card, checks.fit)
    assert "processes" not in one and "optimiser steps of" in one
    several = {**checks.fit, "plan": {**checks.fit["plan"], "processes": 4, "scaling_efficiency": 0.9}}
    assert "optimiser steps on 4 processes (scaling efficiency 90% assumed until a run measures it) of" \
        in pc.plan_text(stage.card, several)


def test_memory_is_not_measured_after_an_unmeasured_step(stage03) -> None:
    """Once the update check, the timed steps or the accumulation check ran (the allocator is training's), a memory
    measurement would reuse the memory they left in the process: it is refused in one line and writes nothing."""
    stage, checks, _ = stage03
    assert checks.phases.unmeasured  # the CPU run switched the allocator after the measured checks
    before = stage.path(pc.MEMORY_FILE).read_bytes(), stage.path(pc.CHECKPOINTING_FILE).read_bytes()
    with pytest.raises(StageFailed, match="run the notebook's cells in order"):
        pc.measure_memory(stage, checks, checks.memory["generation"])
    with pytest.raises(StageFailed, match="activation checkpointing's memory is measured before"):
        pc.checkpointing(stage, checks)
    assert (stage.path(pc.MEMORY_FILE).read_bytes(), stage.path(pc.CHECKPOINTING_FILE).read_bytes()) == before


def test_each_length_carries_its_memory_pass_and_its_times(stage03) -> None:
    """Each length's record holds its memory pass and its timed pass (the order between them is `Phases`' to keep:
    test_memory_is_not_measured_after_an_unmeasured_step); the comparison shows the timed step."""
    _, checks, _ = stage03
    for measured in checks.memory["measured"]:
        assert measured["memory_pass_seconds"] and measured["step_seconds"] and measured["seconds_per_step"] > 0
    assert sum(m["eval_seconds"] is not None for m in checks.memory["measured"]) >= 1  # the evaluation batch, once
    assert [r["seconds_per_step"] for r in checks.memory["comparison"]] == \
        [m["seconds_per_step"] for m in checks.memory["measured"]]
    assert {m["timed_by"] for m in checks.memory["measured"]} == {"timed pass"}  # the CPU: the allocator differs


def test_a_measurement_that_kept_the_step_time_is_not_run_again(stage03, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA (a measurement read from PyTorch's statistics) the measured steps are the timed ones: timing runs
    only the evaluation batch, with the first length (one trainer in all), and no optimiser step (the weights stay
    as loaded)."""
    stage, checks, _ = stage03
    built = []
    monkeypatch.setattr(timing, "build_trainer", lambda *a, **k: built.append(k) or build_trainer(*a, **k))
    cuda_like = [{**m, "memory": {**m["memory"], "method": CUDA_METHOD}} for m in checks.memory["measured"]]
    assert step_time_kept(cuda_like[0]) and not step_time_kept(checks.memory["measured"][0])
    model = checks.model()
    before = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
    eval_rows = stage.split("validation")[: stage.card.eval.batch_size]
    timed = time_lengths(stage.card, checks.model, stage.tokenizer, checks.train_rows, checks.encoded, cuda_like,
                         stage.device, eval_rows)
    for got, measured in zip(timed, cuda_like):
        assert got["timed_by"] == "memory pass"
        assert got["step_seconds"] == measured["memory_pass_seconds"]
        assert got["seconds_per_step"] == measured["memory_pass_seconds"][-1]
    assert timed[0]["eval_seconds"] > 0 and timed[0]["eval_tokens"] > 0
    assert len(checks.lengths) == len(set(checks.lengths.values())) == 2  # the smoke card: two distinct lengths
    assert timed[1]["eval_seconds"] is None and len(built) == 1  # the second length builds no trainer
    assert all(v.equal(before[k]) for k, v in model.named_parameters() if k in before)
