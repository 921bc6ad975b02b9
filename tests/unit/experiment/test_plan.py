"""The rental plan: the arithmetic on given timings, the timings read from a crafted runs folder, the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from labkit.card.load import load_card
from labkit.cli.main import build_parser
from labkit.cli.main import main as cli_main
from labkit.experiment import plan as P

QUICKSTART = REPO / "params" / "quickstart.yaml"


def timings(**seconds: float) -> dict:
    base = {"baseline": 100.0, "preprocessing": 20.0, "parameter_check": 60.0, "process_start": 10.0,
            "train_setup": 30.0, "evaluation": 60.0, "seconds_per_step": 2.0}
    return {"seconds": {**base, **seconds},
            "card": {"steps": 300, "save_steps": 100, "save_steps_set": True, "validation_rows": 50, "test_rows": 100}}


# --------------------------------------------------------------------------- arithmetic
# initial 180 + 3×10 = 210 s; reload 10 + 30 = 40; variant 300×2 + 60 + 30 + 2×10 + 40 = 750;
# evaluation 2×10 + 2 (base and tuned) × 60×(100/50) = 260; continuation 1200 + 60 + 30 + 20 + 40 = 1350;
# export 40 (save) + 10 + 30 (reload check in a fresh process) = 80


def test_variants_costs_and_phases() -> None:
    plan = P.build_plan(timings(), days=0.5, price_per_hour=2.0)  # 43200 s, 36720 usable after 15 %
    phases = {p["phase"]: p for p in plan["phases"]}
    assert plan["variant_seconds"] == pytest.approx(750)
    # 36720 − (210 + 750 + 260 + 80) = 35420; − 1350 continuation = 34070 = 45 × 750 + 320
    assert plan["variants"] == 46 and plan["continuation"] and plan["feasible"] and plan["problem"] is None
    assert phases["initial check"]["seconds"] == pytest.approx(210)
    assert phases["experiment"]["seconds"] == pytest.approx(46 * 750)
    assert phases["evaluation"]["seconds"] == pytest.approx(260)
    assert phases["continuation"]["seconds"] == pytest.approx(1350)
    assert phases["export"]["seconds"] == pytest.approx(80)
    assert phases["safety margin"]["seconds"] == pytest.approx(6480)
    assert phases["unallocated"]["seconds"] == pytest.approx(320)
    assert sum(p["seconds"] for p in plan["phases"]) == pytest.approx(43200)  # the rows add up to the rental
    assert phases["experiment"]["cost"] == pytest.approx(46 * 750 / 3600 * 2.0)
    assert plan["planned_hours"] == pytest.approx(36400 / 3600)
    assert plan["planned_cost"] == pytest.approx(36400 / 3600 * 2.0)
    assert plan["rental_cost"] == pytest.approx(24.0)


def test_margin_leaves_fewer_variants() -> None:
    plan = P.build_plan(timings(), days=0.5, price_per_hour=2.0, margin=0.5)  # 21600 usable
    # 21600 − 1300 − 1350 = 18950 = 25 × 750 + 200
    assert plan["variants"] == 26
    assert plan["phases"][-1]["seconds"] == pytest.approx(200)
    assert plan["phases"][-2]["seconds"] == pytest.approx(21600)


def test_speedup_divides_compute_not_process_starts_or_loading() -> None:
    plan = P.build_plan(timings(), days=0.5, price_per_hour=2.0, speedup=2.0)
    phases = {p["phase"]: p for p in plan["phases"]}
    assert phases["initial check"]["seconds"] == pytest.approx(90 + 30)
    assert plan["variant_seconds"] == pytest.approx(300 + 30 + 30 + 20 + 40)
    assert phases["evaluation"]["seconds"] == pytest.approx(20 + 2 * 30 * 2)
    # 36720 − (120 + 420 + 140 + 80) − 720 = 35240 = 83 × 420 + 380
    assert plan["variants"] == 84
    assert plan["checkpoint"]["interval_steps"] == 432  # 432 s limit at 1 s/step


def test_checkpoint_interval_against_the_cards_save_steps() -> None:
    plan = P.build_plan(timings(), days=0.5, price_per_hour=0.0)
    c = plan["checkpoint"]
    # limit = min(15 min, 1 % of 12 h = 432 s) = 432 s → 216 steps of 2 s
    assert c["limit_minutes"] == pytest.approx(7.2)
    assert (c["interval_steps"], c["interval_minutes"]) == (216, pytest.approx(7.2))
    assert c["card_meets"] and c["card_interval_minutes"] == pytest.approx(100 * 2 / 60)
    assert c["resume_seconds"] == pytest.approx(40) and not c["run_within_limit"]
    loose = P.build_plan(timings(), days=0.5, price_per_hour=0.0, max_loss_fraction=None)["checkpoint"]
    assert loose["interval_steps"] == 450  # 15 min only
    t = timings()
    t["card"]["save_steps"] = 300
    assert not P.build_plan(t, days=0.5, price_per_hour=0.0)["checkpoint"]["card_meets"]
    slow = P.build_plan(timings(seconds_per_step=1000.0), days=30, price_per_hour=0.0)["checkpoint"]
    assert slow["interval_steps"] == 1 and slow["one_step_over_limit"]
    with pytest.raises(ValueError, match="limit"):
        P.build_plan(timings(), days=1, price_per_hour=0.0, max_loss_minutes=None, max_loss_fraction=None)


def test_default_save_steps_of_the_longer_continuation_run() -> None:
    t = timings()
    t["card"].update(save_steps=75, save_steps_set=False)  # a quarter of 300
    c = P.build_plan(t, days=0.5, price_per_hour=0.0)["checkpoint"]
    assert c["card_meets"] and c["continuation_save_steps"] == 150 and c["continuation_meets"]
    c = P.build_plan(t, days=0.5, price_per_hour=0.0, continuation_factor=4.0)["checkpoint"]
    assert c["continuation_save_steps"] == 300 and not c["continuation_meets"]  # 300 > 216


def test_short_rentals() -> None:
    with pytest.raises(ValueError, match=r"shorter than the initial check alone \(0\.06 h\)"):
        P.build_plan(timings(), days=0.001, price_per_hour=1.0)  # 73 s usable < 210 s
    only = P.build_plan(timings(), days=0.01, price_per_hour=1.0)  # 734.4 s usable: 210 fits, 1300 does not
    assert not only["feasible"] and only["variants"] == 0 and "only the initial check fits" in only["problem"]
    assert [p["seconds"] for p in only["phases"][1:5]] == [0, 0, 0, 0]
    assert only["phases"][-1]["seconds"] == pytest.approx(734.4 - 210)
    no_cont = P.build_plan(timings(), days=0.025, price_per_hour=1.0)  # 1836 s: 1300 fits, + 1350 does not
    assert no_cont["variants"] == 1 and not no_cont["continuation"]
    assert no_cont["phases"][3]["seconds"] == 0 and no_cont["phases"][3]["notes"] == "does not fit"


def test_measured_final_and_export_check_replace_the_estimates() -> None:
    plan = P.build_plan(timings(final=100.0, export_check=15.0), days=0.5, price_per_hour=0.0, speedup=2.0)
    phases = {p["phase"]: p for p in plan["phases"]}
    assert phases["evaluation"]["seconds"] == pytest.approx(20 + 100 / 2)  # the test evaluation is compute: scaled
    assert phases["export"]["seconds"] == pytest.approx(40 + 10 + 15)  # the reload check is mostly loading: not scaled
    assert "measured 50 s" in phases["evaluation"]["notes"] and "measured 15 s" in phases["export"]["notes"]


@pytest.mark.parametrize("kwargs", [{"days": 0}, {"days": -3}, {"margin": 1.0}, {"speedup": 0}, {"price_per_hour": -1}])
def test_bad_parameters(kwargs: dict) -> None:
    args = {"days": 3, "price_per_hour": 1.0, **kwargs}
    with pytest.raises(ValueError, match="need days > 0"):
        P.build_plan(timings(), **args)


# --------------------------------------------------------------------------- a crafted runs folder
def _event(run_id: str, experiment: str, event: str, **fields) -> dict:
    return {"time": "2026-11-30T20:05:23Z", "run_id": run_id, "experiment": experiment, "variant": "quickstart-lora-r16",
            "event": event, "status": "completed" if event == "completed" else "running", **fields}


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


ENV_CPU = {"machine": "x86_64", "cpu_count": 2, "memory_gib": 23.54,
           "accelerators": {"cuda_available": False, "cuda": None, "hip": None, "cudnn": None, "devices": []}}
ENV_GPU = {"machine": "x86_64", "cpu_count": 16, "memory_gib": 125.8,
           "accelerators": {"cuda_available": True, "cuda": "12.8", "devices": [
               {"name": "NVIDIA H200", "memory_gib": 139.8, "capability": "9.0"}]}}


def _run(root: Path, experiment: str, run_id: str, card: dict, seconds: dict, registry: bool, cached: bool = False,
         wall_extra: float | None = None, training: dict | None = None, env: dict = ENV_CPU) -> list[dict]:
    """A run folder shaped like a real one; returns its registry lines (written by the caller)."""
    folder = root / experiment / run_id
    (folder / "card.yaml").parent.mkdir(parents=True, exist_ok=True)
    (folder / "card.yaml").write_text(yaml.safe_dump(card, sort_keys=False))
    _write(folder / "env.json", env)
    _write(folder / "status.json", {"run_id": run_id, "experiment": experiment, "status": "completed", "stages": {}})
    extra = {"baseline": {"primary_metric": "field_accuracy", "baseline": 0.0, "needed": 0.3, "cached": cached,
                          "data_version": "ce43a3100a3c"},
             "preprocessing": {"data_version": "ce43a3100a3c", "sizes": {"train": 275, "validation": 60, "test": 60},
                               "duplicate_pairs": 6, "cross_split_pairs": 4, "checks_ok": True},
             "parameter_check": {"method": "lora", "trainable": 4884480, "total": 139399488, "update_ok": True,
                                 "seconds_per_step": 5.3},
             "training": {"steps": 24, "first_loss": 1.53, "last_loss": 0.26, "budget_exhausted": False},
             "comparison": {"confirmed": True}}
    lines = []
    for stage, secs in seconds.items():
        _write(folder / stage / "summary.json", {"stage": stage, "seconds": secs, **extra[stage]})
        lines.append(_event(run_id, experiment, "stage_started", stage=stage, pid=2179))
        lines.append(_event(run_id, experiment, "stage_done", stage=stage, seconds=secs))
    if training and "outcome" in training:
        _write(folder / "training" / "outcome.json", training["outcome"])
    if training and "history" in training:
        (folder / "training" / "log_history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in training["history"]))
    if wall_extra is not None:
        lines.append(_event(run_id, experiment, "completed", seconds=sum(seconds.values()),
                            timings={s: round(v + wall_extra, 1) for s, v in seconds.items()},
                            summary={"confirmed": True, "field_accuracy": {"baseline": 0.0, "tuned": 0.5778}}))
    return lines if registry else []


def _outcome(steps: int, runtime: float, resumed_from: str | None = None) -> dict:
    return {"steps": steps, "metrics": {"train_runtime": runtime, "train_samples_per_second": 0.236,
                                        "train_steps_per_second": 0.059, "total_flos": 46012.0, "train_loss": 0.41,
                                        "epoch": 0.348}, "resumed_from": resumed_from, "budget_exhausted": False,
            "world_size": 1, "interrupted": None, "best_step": None, "best_eval_loss": None, "early_stopped": False}


HISTORY = [{"step": 1, "epoch": 0.0145, "loss": 1.535, "learning_rate": 0.0, "grad_norm": 2.72},
           {"step": 12, "epoch": 0.174, "eval_loss": 0.297},
           {"step": 24, "epoch": 0.348, "loss": 0.264, "learning_rate": 5.1e-06, "grad_norm": 0.50},
           {"step": 24, "epoch": 0.348, "eval_loss": 0.221},
           {"step": 24, "epoch": 0.348, "train_runtime": 90.0}]


@pytest.fixture
def runs_root(tmp_path: Path) -> Path:
    """Three quickstart runs of ticket-triage, a full fine-tune in it, a run of another experiment (other machine)."""
    root = tmp_path / "runs"
    card = load_card(QUICKSTART).resolved
    full = {**card, "method": {"kind": "full"}}
    lines = []
    lines += _run(root, "ticket-triage", "qs-a", card, {"baseline": 100, "preprocessing": 10, "parameter_check": 40,
                  "training": 130, "comparison": 50}, registry=True, wall_extra=7, training={"outcome": _outcome(24, 120)})
    lines += [_event("qs-a", "ticket-triage", "test_opened", time="2026-11-30T21:00:00Z", who="tester", reopen=False,
                     why=None, opening=1, test_rows=60),
              _event("qs-a", "ticket-triage", "test_evaluated", time="2026-11-30T21:01:30Z", opening=1, n=60,
                     confirmed=True, verdict="CONFIRMED", primary={"metric": "field_accuracy", "baseline": 0.0,
                                                                   "tuned": 0.6})]
    _write(root / "ticket-triage" / "qs-a" / "export" / "reload_check.json",
           {"ok": True, "identical": True, "total": 8, "mismatches": [], "seconds": 25.0, "time": "2026-11-30T21:05:00Z"})
    # resumed from step 12: 12 steps in 84 s; its baseline came from the cache (not a measurement of the model)
    lines += _run(root, "ticket-triage", "qs-b", card, {"baseline": 20, "preprocessing": 14, "parameter_check": 44,
                  "training": 154, "comparison": 70}, registry=True, cached=True, wall_extra=9,
                  training={"outcome": _outcome(24, 84, "/x/training/trainer/checkpoint-12")})
    # no registry lines (a copied folder): summary.json seconds and the log history
    _run(root, "ticket-triage", "qs-c", card, {"baseline": 110, "preprocessing": 12, "parameter_check": 41,
         "training": 100, "comparison": 60}, registry=False, training={"history": HISTORY})
    lines += _run(root, "ticket-triage", "full-d", full, {"baseline": 500, "preprocessing": 10, "parameter_check": 400},
                  registry=True)
    lines += _run(root, "other-exp", "other-e", card, {"baseline": 10, "preprocessing": 1, "parameter_check": 4,
                  "training": 31, "comparison": 5}, registry=True, wall_extra=2, training={"outcome": _outcome(24, 24)},
                  env=ENV_GPU)
    (root / "registry.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


def test_measured_timings_medians_and_sources(runs_root: Path) -> None:
    t = P.measured_timings(load_card(QUICKSTART), runs_root)
    assert t["runs"] == ["qs-a", "qs-b", "qs-c"]  # not the full fine-tune, not the other experiment
    assert t["matched_by"].startswith("same experiment, model source")
    assert t["seconds"] == {"baseline": 105.0,  # uncached runs only: 100, 110
                            "preprocessing": 12.0, "parameter_check": 41.0,
                            "process_start": 8.0,  # 7 and 9: `labkit run` wall time − stage seconds
                            "train_setup": 10.0,  # 130−120, 154−84, 100−90
                            "evaluation": 60.0,
                            "seconds_per_step": 5.0,  # 120/24, 84/12 (resumed at 12), 90/24
                            "final": 90.0,  # test_opened 21:00:00 → test_evaluated 21:01:30
                            "export_check": 25.0}
    assert "qs-a, qs-c" in t["sources"]["baseline"] and "qs-b" not in t["sources"]["baseline"]
    assert "qs-b training/outcome.json: 84.0 s / 12 steps" in t["sources"]["seconds_per_step"]
    assert "qs-c training/log_history.jsonl: 90.0 s / 24 steps" in t["sources"]["seconds_per_step"]
    assert t["device"] == "CPU x86_64, 2 cores, 23.54 GiB, no GPU" and t["notes"] == []
    assert t["card"] == {"steps": 24, "save_steps": 6, "save_steps_set": False, "validation_rows": 60, "test_rows": 60,
                         "price_per_hour": 0.0, "gpus": 1, "train_rows": 275, "step_size": 4 * 1 * 384}


def test_other_experiment_with_the_same_model_method_and_length(runs_root: Path, tmp_path: Path) -> None:
    card = tmp_path / "other.yaml"
    card.write_text(f"parent: {QUICKSTART}\nexperiment: {{id: new-exp, variant: v1}}\ntrain: {{max_steps: 100}}\n")
    t = P.measured_timings(load_card(card), runs_root)
    # other-e trained on an H200: a median with the CPU runs' steps would plan for neither machine
    assert t["runs"] == ["qs-a", "qs-b", "qs-c"]
    assert "ticket-triage" in t["matched_by"] and "other-exp" in t["matched_by"]
    assert t["card"]["steps"] == 100 and t["card"]["save_steps"] == 25
    assert t["seconds"]["seconds_per_step"] == pytest.approx(5.0)  # median of 5, 7, 3.75 (not the H200's 1)
    assert t["device"] == "CPU x86_64, 2 cores, 23.54 GiB, no GPU"
    assert t["notes"][0] == ("the runs were measured on 2 machines: the plan uses the 3 run(s) on CPU x86_64, 2 cores, "
                             "23.54 GiB, no GPU (the machine with the most runs, then the latest); left out: other-e "
                             "(1 × NVIDIA H200 (139.8 GiB))")


def test_one_run_per_machine_the_latest_machine_is_planned(tmp_path: Path) -> None:
    root, card = tmp_path / "runs", load_card(QUICKSTART)
    seconds = {"baseline": 100, "preprocessing": 10, "parameter_check": 40, "training": 130, "comparison": 50}
    lines = _run(root, "ticket-triage", "on-cpu", card.resolved, seconds, registry=True,
                 training={"outcome": _outcome(24, 120)})
    gpu = _run(root, "ticket-triage", "on-gpu", card.resolved, {k: v / 10 for k, v in seconds.items()}, registry=True,
               training={"outcome": _outcome(24, 12)}, env=ENV_GPU)
    lines += [{**e, "time": "2026-12-01T09:00:00Z"} for e in gpu]  # the GPU run came later
    (root / "registry.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    t = P.measured_timings(card, root)
    assert t["runs"] == ["on-gpu"] and t["seconds"]["seconds_per_step"] == pytest.approx(0.5)
    assert t["device"] == "1 × NVIDIA H200 (139.8 GiB)" and "left out: on-cpu (CPU x86_64" in t["notes"][0]


def test_stage_03_only_and_nothing_measured(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    loaded = load_card(QUICKSTART)
    with pytest.raises(FileNotFoundError, match="labkit stage parameter_check .*quickstart.yaml"):
        P.measured_timings(loaded, root)
    lines = _run(root, "ticket-triage", "qs-x", loaded.resolved,
                 {"baseline": 99.1, "preprocessing": 4.7, "parameter_check": 18.9}, registry=True)
    (root / "registry.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    t = P.measured_timings(loaded, root)
    assert t["seconds"]["seconds_per_step"] == 5.3 and t["seconds"]["evaluation"] == 99.1
    assert any("underestimate" in n for n in t["notes"])
    assert any(n.startswith("process_start not measured") for n in t["notes"])
    assert "train_setup" not in t["seconds"]
    # stage 01 measured the base model under 3 prompts (eval.baseline_prompts): one evaluation pass is a third of it
    _write(root / "ticket-triage" / "qs-x" / "baseline" / "baseline_prompts.json",
           {"primary_metric": "field_accuracy", "higher_is_better": True, "strongest": "training",
            "prompts": [{"name": n, "description": n, "skipped": None} for n in ("training", "own", "own_1shot")]})
    t = P.measured_timings(loaded, root)
    assert t["seconds"]["evaluation"] == pytest.approx(99.1 / 3) and "÷ the baseline prompts" in t["sources"]["evaluation"]


# --------------------------------------------------------------------------- the command
def test_main_prints_the_table_and_saves_the_plan(runs_root: Path, capsys: pytest.CaptureFixture) -> None:
    rc = cli_main(["--runs", str(runs_root), "plan", str(QUICKSTART), "--days", "3", "--price-per-hour", "2.5"])
    out = capsys.readouterr().out
    assert rc == 0
    (saved,) = (runs_root / "ticket-triage" / "_plans").glob("plan-3d-*.json")
    plan = json.loads(saved.read_text())
    # initial 158 + 24 = 182; variant 24×5 + 60 + 10 + 16 + 18 = 224; evaluation 2×8 + 90 (measured final) = 106;
    # continuation 48×5 + 60 + 10 + 16 + 18 = 344; export 18 + 8 + 25 (measured reload check) = 51;
    # 220320 usable − (182 + 224 + 106 + 51) − 344 = 219413 = 979 × 224 + 117
    assert plan["variants"] == 980 and plan["variant_seconds"] == pytest.approx(224)
    assert [p["seconds"] for p in plan["phases"][2:5]] == [pytest.approx(106), pytest.approx(344), pytest.approx(51)]
    assert plan["phases"][-1]["seconds"] == pytest.approx(117)
    assert plan["rental_cost"] == pytest.approx(180.0)
    assert plan["phases"][1]["cost"] == pytest.approx(980 * 224 / 3600 * 2.5)
    assert plan["checkpoint"]["interval_steps"] == 180 and plan["timings"]["runs"] == ["qs-a", "qs-b", "qs-c"]
    assert plan["path"] == str(saved)
    assert "timings measured on: CPU x86_64, 2 cores, 23.54 GiB, no GPU" in out
    row = next(line for line in out.splitlines() if line.startswith("experiment "))
    assert row.split()[1:5] == ["61.0", "h", "60.98", "152.44"]
    assert "save_steps 6 (default: a quarter of the run) = 0.5 min: meets it" in out
    assert f"plan saved: {saved}" in out


def test_cli_subcommand_and_errors(runs_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = build_parser().parse_args(["--runs", str(runs_root), "plan", str(QUICKSTART), "--days", "7", "--speedup", "2"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "price 0" in out and "divided by --speedup 2" in out
    assert len(list((runs_root / "ticket-triage" / "_plans").glob("plan-7d-*.json"))) == 1
    assert cli_main(["--runs", str(tmp_path / "empty"), "plan", str(QUICKSTART), "--days", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("labkit: error: nothing measured") and "\n" not in err
    assert cli_main(["--runs", str(runs_root), "plan", str(QUICKSTART), "--days", "0.0001"]) == 2
    assert "shorter than the initial check" in capsys.readouterr().err


def test_cli_campaign_over_a_grid_of_four_cards(runs_root: Path, capsys: pytest.CaptureFixture) -> None:
    examples = REPO / "params" / "examples"
    grid = [str(examples / n) for n in ("ticket-lora-r4-qv.yaml", "ticket-qlora.yaml", "ticket-packed.yaml",
                                        "ticket-earlystop.yaml")]
    for days in ("3", "7", "30"):
        assert cli_main(["--runs", str(runs_root), "plan", str(QUICKSTART), "--days", days, "--grid", *grid]) == 0
        out = capsys.readouterr().out
        assert "4 of 4 listed variant(s) planned (limited by the grid" in out  # never the 3353 copies of before
        assert "continuation of the best" in out and "assumed: set-up: 1 h" in out and "measured: seconds_per_step" in out
    assert len(list((runs_root / "ticket-triage" / "_plans").glob("campaign-*.json"))) == 3


def test_replicates_multiply_each_variants_runs() -> None:
    """experiment.replicates: 3 trains and evaluates every variant three times (one run per seed)."""
    one = P.build_plan(timings(), days=0.5, price_per_hour=2.0)
    t = timings()
    t["card"]["replicates"] = 3
    three = P.build_plan(t, days=0.5, price_per_hour=2.0)
    assert three["variant_seconds"] == pytest.approx(3 * 750)
    # 36720 − (210 + 2250 + 260 + 80) = 33920; − 1350 continuation (one run) = 32570 = 14 × 2250 + 1070
    assert three["variants"] == 15 and one["variants"] == 46
    phases = {p["phase"]: p for p in three["phases"]}
    assert phases["experiment"]["seconds"] == pytest.approx(15 * 2250)
    assert phases["continuation"]["seconds"] == pytest.approx(1350)
    assert "3 seeds (experiment.replicates)" in phases["experiment"]["notes"]
    assert sum(p["seconds"] for p in three["phases"]) == pytest.approx(43200)


def test_plan_divides_training_among_the_cards_processes(runs_root: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    """2 processes: an epoch's 69 steps of one process (275 rows, micro-batch 4) are 35; each step costs the measured
    5 s ÷ 0.9, the assumed efficiency within a machine, until a run of the card at 2 processes measures it."""
    path = tmp_path / "ddp.yaml"
    path.write_text(f"parent: {QUICKSTART}\ntrain: {{max_steps: null, epochs: 1}}\n"
                    "distributed: {launcher: accelerate, strategy: ddp, num_processes: 2}\n")
    assert cli_main(["--runs", str(runs_root), "plan", str(path), "--days", "3", "--price-per-hour", "2"]) == 0
    out = capsys.readouterr().out
    assert ("processes: 2 processes: 69 steps of one process → 35 steps; s/step 5.00 (measured at 1 process(es)) ÷ "
            "0.9 scaling efficiency (assumed, within one machine; a run at 2 processes measures it) = 5.56 s") in out
    (saved,) = (runs_root / "ticket-triage" / "_plans").glob("plan-3d-*.json")
    plan = json.loads(saved.read_text())
    # variant: 35 × 5/0.9 + evaluation 60 + setup 10 + 2 starts × 8 + reload 18 (one process: 69 × 5 + 104)
    assert plan["variant_seconds"] == pytest.approx(35 * 5 / 0.9 + 104)
    assert plan["timings"]["processes"]["efficiency_source"] == "assumed"
    # a run of the card at 2 processes: its seconds per step (35 steps in 140 s) replace the assumption
    lines = _run(runs_root, "ticket-triage", "ddp-f", load_card(path).resolved, {
        "baseline": 100, "preprocessing": 10, "parameter_check": 40, "training": 150, "comparison": 50}, registry=True,
        wall_extra=8, training={"outcome": {**_outcome(35, 140.0), "world_size": 2}})
    with (runs_root / "registry.jsonl").open("a") as registry:
        registry.write("".join(json.dumps(line) + "\n" for line in lines))
    assert cli_main(["--runs", str(runs_root), "plan", str(path), "--days", "7"]) == 0
    out = capsys.readouterr().out
    assert "processes: 2 processes: 69 steps of one process → 35 steps; 4.00 s/step measured by runs at 2 " \
           "processes" in out
    assert "seconds_per_step: 4.00 s (measured) — stage 04 runtime / steps" in out and "ddp-f" in out
