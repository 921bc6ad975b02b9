"""The rental plan: `labkit plan CARD --days 3|7|30 --price-per-hour P`.

The seed protocol of an experiment on a rented GPU, in five phases: initial check (stages 01–03),
experiment (variants: a training run and its evaluation each), evaluation (`labkit compare` and the
one-time test opening `labkit final`), continuation (a longer run of the chosen variant, or resuming
one) and export (`labkit export`: save, then a reload check in a fresh process). A card with
`experiment.replicates: k` costs k training runs and evaluations per variant.

No duration is invented: `labkit.experiment.timings.measured_timings` takes them from earlier runs in the runs
root, as medians naming the runs; `build_plan` is the arithmetic on those numbers. The plan is for the machine the timings were measured on; `--speedup X` divides the compute times
when the rental GPU is known to be X times faster.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from labkit.card.load import load_card
from labkit.core import io
from labkit.core import runs as R
from labkit.errors import UsageError
from labkit.experiment.campaign import build_campaign, format_campaign, grid_cards, interval_width, variant_of
from labkit.experiment.timings import INITIAL, measured_timings
from labkit.preflight.scaling import parallel_steps, scaled, scaling_efficiency

def for_processes(timings: dict[str, Any], card: Any) -> dict[str, Any]:
    """Set the plan's steps and seconds per step to the card's processes (`labkit.preflight.scaling`).

    With P data-parallel processes (distributed.num_processes) an epoch has about 1/P of one process's steps
    (`parallel_steps`); each step costs the seconds per step measured by runs of the card at P processes, else the
    one-process figure ÷ the assumed scaling efficiency (`scaling_efficiency`: within a machine or across machines).

    Args:
        timings: as `measured_timings` returns; its "card" (steps, save_steps) and "seconds" (seconds_per_step) are
            changed in place.
        card: the card.
    Returns:
        {"processes", "machines", "steps_one_process", "steps", "measured_seconds_per_step", "seconds_per_step",
         "measured_at" (processes), "efficiency" (None when measured), "efficiency_source"}; also kept as
        timings["processes"].
    """
    d = card.distributed
    n, m = (d.num_processes, d.num_machines) if d.launcher == "accelerate" else (1, 1)
    at = timings.get("step_processes", 1)
    sps = timings["seconds"]["seconds_per_step"]
    single = sps * scaling_efficiency(at, 1) if at not in (1, n) else sps  # another count's run: one process's
    got = scaled(single, n, m, measured_at=at)
    steps = parallel_steps(card, timings["card"].get("train_rows"), n) if n > 1 else None
    out = {"processes": n, "machines": m, "steps_one_process": timings["card"]["steps"],
           "steps": steps or timings["card"]["steps"], "measured_seconds_per_step": sps, "measured_at": at, **got}
    timings["card"]["steps"] = out["steps"]
    if n > 1 and not timings["card"].get("save_steps_set", True):
        timings["card"]["save_steps"] = max(1, out["steps"] // 4)
    timings["seconds"]["seconds_per_step"] = got["seconds_per_step"]
    timings["processes"] = out
    return out


def processes_line(timings: dict[str, Any]) -> str | None:
    """The plan's line on the processes: steps and seconds per step scaled, efficiency assumed or measured."""
    p = timings.get("processes")
    if not p or p["processes"] <= 1:
        return None
    where = f"{p['processes']} processes" + (f" on {p['machines']} machines" if p["machines"] > 1 else "")
    if p["efficiency_source"] == "measured":
        how = f"{p['seconds_per_step']:.2f} s/step measured by runs at {p['processes']} processes"
    else:
        how = (f"s/step {p['measured_seconds_per_step']:.2f} (measured at {p['measured_at']} process(es)) ÷ "
               f"{p['efficiency']:g} scaling efficiency (assumed, "
               + ("across machines" if p["machines"] > 1 else "within one machine")
               + f"; a run at {p['processes']} processes measures it) = {p['seconds_per_step']:.2f} s")
    return f"processes: {where}: {p['steps_one_process']} steps of one process → {p['steps']} steps; {how}"


SCALED = ("baseline", "preprocessing", "parameter_check", "seconds_per_step", "evaluation", "final")  # / --speedup


def build_plan(timings: dict[str, Any], days: float, price_per_hour: float, speedup: float = 1.0, margin: float = 0.15,
               max_loss_minutes: float | None = 15.0, max_loss_fraction: float | None = 0.01,
               continuation_factor: float = 2.0) -> dict[str, Any]:
    """The phases of a rental, sized from measured timings (pure arithmetic).

    Fitted in order: the initial check (else ValueError); one variant + evaluation + export (else the plan says
    only the initial check fits); the continuation if it fits; then as many more variants as fit.

    Args:
        timings: as `measured_timings` returns ("seconds" and "card" are read).
        days: length of the rental (3, 7 or 30 typically; any positive number).
        price_per_hour: price of the rental per hour.
        speedup: how many times faster the rental is than the measured machine (divides stage compute, s/step,
            evaluation and final; process starts, model load/save and the export reload check are not divided).
        margin: fraction of the rental kept free for the unexpected (0.15 = 15 %).
        max_loss_minutes: most work an interruption may lose, in minutes (None: no such limit).
        max_loss_fraction: most work an interruption may lose, as a fraction of the rental (None: no such limit).
        continuation_factor: the continuation run's length in units of the card's steps.
    Returns:
        {"phases": [{"phase", "seconds", "hours", "cost", "notes"}], "variants", "feasible", "problem",
        "checkpoint", "rental_hours", "usable_hours", "planned_hours", "planned_cost", "rental_cost", …}.
    Raises:
        ValueError: a parameter out of range, or a rental shorter than the initial check.
    """
    if days <= 0 or price_per_hour < 0 or speedup <= 0 or not 0 <= margin < 1 or continuation_factor <= 0:
        raise UsageError(f"need days > 0, price >= 0, speedup > 0, 0 <= margin < 1 (a fraction, e.g. 0.15) and "
                         f"continuation > 0; got days={days}, price={price_per_hour}, speedup={speedup}, "
                         f"margin={margin}")
    limits = [x for x in (max_loss_minutes and max_loss_minutes * 60,
                          max_loss_fraction and max_loss_fraction * days * 86400) if x and x > 0]
    if not limits:
        raise UsageError("give a positive limit on the work an interruption may lose (minutes or rental fraction)")
    t = {k: v / speedup if k in SCALED else v for k, v in timings["seconds"].items()}
    card, sps = timings["card"], t["seconds_per_step"]
    seeds = card.get("replicates", 1)  # experiment.replicates: each variant trained and evaluated once per seed
    start, setup, steps = t.get("process_start", 0.0), t.get("train_setup", 0.0), card["steps"]
    evaluation = t.get("evaluation", t["baseline"])
    rows_known = card.get("test_rows") and card.get("validation_rows")
    ratio = card["test_rows"] / card["validation_rows"] if rows_known else 1.0
    reload = start + setup  # room to reload a checkpoint in a new process
    cost = {"initial": sum(t[k] for k in INITIAL) + 3 * start,
            "variant": seeds * (steps * sps + evaluation + setup + 2 * start + reload),
            # labkit compare (reads data) + labkit final (base and tuned model on the test split)
            "evaluation": 2 * start + t.get("final", 2 * evaluation * ratio),
            "continuation": continuation_factor * steps * sps + evaluation + setup + 2 * start + reload,
            "export": reload + start + t.get("export_check", setup)}  # save, then the reload check in a fresh process
    rental, usable = days * 86400, days * 86400 * (1 - margin)
    if cost["initial"] > usable:
        raise UsageError(f"a {days:g}-day rental ({usable / 3600:.2f} h usable after the {margin:.0%} margin) is "
                         f"shorter than the initial check alone ({cost['initial'] / 3600:.2f} h)")
    need = cost["initial"] + cost["variant"] + cost["evaluation"] + cost["export"]
    variants, continuation, left, problem = 0, False, usable - cost["initial"], None
    if need > usable:
        problem = (f"only the initial check fits: one variant + evaluation + export need {need / 3600:.2f} h, the "
                   f"rental has {usable / 3600:.2f} h after the {margin:.0%} margin")
    else:
        left = usable - need
        continuation = left >= cost["continuation"]
        left -= cost["continuation"] if continuation else 0.0
        variants = 1 + int(left // cost["variant"])
        left -= (variants - 1) * cost["variant"]
    rows = [("initial check", cost["initial"], "01 baseline {:.0f} s + 02 preprocessing {:.0f} s + 03 parameter "
             "check {:.0f} s + 3 process starts".format(*(t[k] for k in INITIAL))),
            ("experiment", variants * cost["variant"],
             f"{variants} variant(s) × {cost['variant'] / 60:.1f} min: "
             + (f"{seeds} seeds (experiment.replicates) × (" if seeds > 1 else "")
             + f"{steps} steps × {sps:.2f} s + evaluation "
             f"{evaluation:.0f} s + 2 loads × {setup:.0f} s + 3 process starts × {start:.0f} s (one load and start: "
             "a checkpoint reload)" + (")" if seeds > 1 else "")),
            ("evaluation", cost["evaluation"] if variants else 0.0,
             "labkit compare + labkit final (" + (f"measured {t['final']:.0f} s" if "final" in t else
                                                  f"base and tuned: 2 × {ratio:.2f} × validation evaluation") + ")"),
            ("continuation", cost["continuation"] if continuation else 0.0,
             f"{continuation_factor:g} × {steps} steps of the chosen variant + evaluation" if continuation
             else "does not fit"),
            ("export", cost["export"] if variants else 0.0, "save + reload check in a fresh process"
             + (f" (measured {t['export_check']:.0f} s)" if "export_check" in t else "")),
            ("safety margin", rental - usable, f"{margin:.0%} of the rental, kept free"),
            ("unallocated", left, "less than one more variant" if variants else "")]
    phases = [{"phase": p, "seconds": s, "hours": s / 3600, "cost": s / 3600 * price_per_hour, "notes": note}
              for p, s, note in rows]
    limit, save = min(limits), card["save_steps"]
    interval = max(1, int(limit // sps))
    checkpoint = {"limit_minutes": limit / 60, "interval_steps": interval, "interval_minutes": interval * sps / 60,
                  "card_save_steps": save, "card_save_set": card.get("save_steps_set", True),
                  "card_interval_minutes": save * sps / 60, "card_meets": save <= interval or save * sps <= limit,
                  "resume_seconds": reload, "one_step_over_limit": sps > limit, "run_steps": steps,
                  "run_minutes": steps * sps / 60, "run_within_limit": steps * sps <= limit}
    if continuation and not card.get("save_steps_set", True):
        long_save = max(1, int(continuation_factor * steps) // 4)  # the default follows the run's length
        checkpoint.update(continuation_save_steps=long_save, continuation_meets=long_save <= interval)
    planned = sum(p["seconds"] for p in phases if p["phase"] not in ("safety margin", "unallocated"))
    return {"days": days, "price_per_hour": price_per_hour, "speedup": speedup, "margin": margin,
            "continuation_factor": continuation_factor, "rental_hours": rental / 3600, "usable_hours": usable / 3600,
            "feasible": problem is None, "problem": problem, "variants": variants, "continuation": continuation,
            "variant_seconds": cost["variant"], "phases": phases, "checkpoint": checkpoint,
            "planned_hours": planned / 3600, "planned_cost": planned / 3600 * price_per_hour,
            "rental_cost": rental / 3600 * price_per_hour}


def format_plan(plan: dict[str, Any], timings: dict[str, Any]) -> str:
    """The plan as text: the phases table (time, hours, cost, notes), the checkpoint interval, the timings' sources."""
    def hm(s: float) -> str:
        return f"{s / 60:.1f} min" if s < 5400 else f"{s / 3600:.1f} h"

    header = ("phase", "time", "hours", "cost", "notes")
    table = [(p["phase"], hm(p["seconds"]), f"{p['hours']:.2f}", f"{p['cost']:.2f}", p["notes"])
             for p in plan["phases"]]
    table.append(("total (rental)", hm(plan["rental_hours"] * 3600), f"{plan['rental_hours']:.2f}",
                  f"{plan['rental_cost']:.2f}",
                  f"planned work {plan['planned_hours']:.2f} h = {plan['planned_cost']:.2f}"))
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table)]
    scaled = f"divided by --speedup {plan['speedup']:g}" if plan["speedup"] != 1 else \
        "the plan is for that machine; --speedup X scales it"
    lines = [f"labkit plan · {timings['experiment']}/{timings['variant']} · {plan['days']:g} days at "
             f"{plan['price_per_hour']:g}/h · margin {plan['margin']:.0%}",
             f"timings measured on: {timings['device']} ({scaled})",
             f"from runs ({timings['matched_by']}): {', '.join(timings['runs'])}"]
    lines += [x for x in (processes_line(timings), "") if x is not None]
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip()
              for row in [header, tuple("-" * w for w in widths), *table]]
    c = plan["checkpoint"]
    lines += ["", f"checkpoint: every <= {c['interval_steps']} steps ({c['interval_minutes']:.1f} min) keeps the work "
              f"lost to an interruption within {c['limit_minutes']:.1f} min (+ {c['resume_seconds']:.0f} s to reload); "
              f"the card's save_steps {c['card_save_steps']}"
              f"{'' if c['card_save_set'] else ' (default: a quarter of the run)'} = "
              f"{c['card_interval_minutes']:.1f} min: "
              + ("meets it" if c["card_meets"] else "does NOT meet it: set train.save_steps")]
    if "continuation_save_steps" in c:
        lines.append(f"  the continuation run's default would be {c['continuation_save_steps']} steps: "
                     + ("meets it" if c["continuation_meets"] else "does NOT meet it: set train.save_steps"))
    if c["run_within_limit"]:
        lines.append(f"  the card's whole run ({c['run_steps']} steps, {c['run_minutes']:.1f} min) is within the limit")
    if c["one_step_over_limit"]:
        lines.append("  one step alone takes longer than the limit: checkpoint every step")
    lines += [f"{k}: {timings['seconds'][k]:.2f} s (measured) — {v}" for k, v in timings["sources"].items()]
    lines += [f"note: {n}" for n in timings["notes"]] + ([f"PROBLEM: {plan['problem']}"] if plan["problem"] else [])
    if not plan["price_per_hour"]:
        lines.append("note: price 0 (the card's budget.price_per_gpu_hour): pass --price-per-hour")
    return "\n".join(lines)


def make_plan(card: str | Path, days: float, price_per_hour: float | None = None, root: Path | None = None,
              grid: list[str] | None = None, spread: float | None = None, setup_hours: float = 1.0,
              **options: Any) -> dict[str, Any]:
    """Measure, plan, print the table and save the plan as `<root>/<experiment>/_plans/plan-<days>d-<UTC stamp>.json`.

    Args:
        card: the card file (loaded strictly).
        days: rental length in days.
        price_per_hour: rental price per hour (None: the card's budget.price_per_gpu_hour × its GPUs).
        root: runs root (None: $LABKIT_RUNS or <project>/runs).
        grid: variant cards (files or folders): plan a campaign over them (`labkit.experiment.campaign`).
        spread: the range of gains the grid's variants are expected to span (default: 2 × min_improvement).
        setup_hours: the campaign's assumed machine set-up.
        options: passed to `build_plan` (speedup, margin, max_loss_minutes, max_loss_fraction, continuation_factor).
    Returns:
        the plan, with "timings" and "path" added.
    """
    loaded = load_card(card)
    root = Path(root).resolve() if root else R.runs_root(loaded.path.parent)
    timings = measured_timings(loaded, root)
    timings["card"]["replicates"] = loaded.card.experiment.replicates  # each variant's runs (build_plan)
    for_processes(timings, loaded.card)
    price = timings["card"]["price_per_hour"] if price_per_hour is None else price_per_hour
    if grid:
        return _campaign(loaded, root, timings, days, price, grid, spread, setup_hours, options)
    plan = build_plan(timings, days, price, **options)
    print(format_plan(plan, timings))
    return _save(plan, timings, root, f"plan-{days:g}d")


def _save(plan: dict[str, Any], timings: dict[str, Any], root: Path, name: str) -> dict[str, Any]:
    """Save a plan (with the timings it used) under the experiment's `_plans/`, stamped, and say where."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = root / timings["experiment"] / "_plans" / f"{name}-{stamp}.json"
    plan.update(timings=timings, path=str(path), created=io.utc_now())
    io.write_json(path, plan)
    print(f"plan saved: {path}")
    return plan


def _campaign(loaded: Any, root: Path, timings: dict[str, Any], days: float, price: float, grid: list[str],
              spread: float | None, setup_hours: float, options: dict[str, Any]) -> dict[str, Any]:
    """`labkit plan … --grid`: the campaign over the listed variant cards, printed and saved next to the plans."""
    card = loaded.card
    variants = [variant_of(load_card(p).card, timings["card"].get("train_rows"), timings["card"])
                for p in grid_cards(grid)]
    width = interval_width(root, card.experiment.id, card.experiment.target.primary_metric)
    keep = {k: options[k] for k in ("speedup", "margin", "max_loss_minutes", "continuation_factor") if k in options}
    plan = build_campaign(timings, days, price, variants, width=width[0] if width else None,
                          spread=spread or 2 * card.experiment.target.min_improvement, setup_hours=setup_hours, **keep)
    if width:
        plan["measured"]["interval width"] = f"{width[0]:.3f} ({width[1]})"
    print(format_campaign(plan))
    return _save(plan, timings, root, f"campaign-{days:g}d")
