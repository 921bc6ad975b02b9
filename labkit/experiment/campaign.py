"""A rental campaign: the phases of a 3-, 7- or 30-day rental over the variants the user lists, as a careful team plans it.

`labkit plan CARD --days D --grid CARD…|FOLDER` plans, in order: set-up of the rented machine (assumed), the checks
of stages 01–03 there (measured), the listed variants — each trained for its own card's length on the full data —,
a continuation of the best one, the final evaluation (`labkit compare` + `labkit final`), export, and the margin.
It never plans more variants than were listed, nor more than the validation split can tell apart: with a paired
95 % interval of width w on the primary metric (measured in earlier runs: `_report/comparison.json`), variants whose
gains lie within a spread S (default: twice the card's `min_improvement`) can be ranked at most ⌊S / w⌋ + 1 apart.
Each training phase gets its checkpoint interval. The plan names what it assumed and what was measured.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from labkit.core import io
from labkit.errors import UsageError
from labkit.experiment.timings import INITIAL


def grid_cards(paths: list[str]) -> list[Path]:
    """The variant cards of a grid: card files, and the *.yaml files of folders (sorted)."""
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.glob("*.yaml")) if p.is_dir() else [p]
    if not out:
        raise UsageError(f"--grid {' '.join(paths)}: no cards (give card files or a folder of *.yaml cards)")
    return out


def variant_of(card: Any, train_rows: int | None, reference: dict[str, Any]) -> dict[str, Any]:
    """A grid entry from a card: its name, optimiser steps (its own length on the full data) and its step's size
    relative to the card the step time was measured on (tokens per optimiser step)."""
    t = card.train
    if t.max_steps:
        steps = t.max_steps
    elif train_rows:
        steps = math.ceil(math.ceil(train_rows / t.micro_batch) / t.grad_accum * (t.epochs or 1))
    else:
        raise UsageError(f"{card.experiment.variant}: no train.max_steps and the training split's size is unmeasured")
    size = t.micro_batch * t.grad_accum * card.data.max_length
    return {"variant": card.experiment.variant, "steps": steps, "step_ratio": size / reference["step_size"],
            "save_steps": t.save_steps or max(1, steps // 4), "replicates": card.experiment.replicates}


def interval_width(root: Path, experiment: str, metric: str) -> tuple[float, str] | None:
    """The median width of the paired 95 % interval of `metric`'s gain over the experiment's runs, and its source."""
    data = io.read_json(root / experiment / "_report" / "comparison.json") if (
        root / experiment / "_report" / "comparison.json").exists() else None
    widths = []
    for run in (data or {}).get("runs", []):
        leaf = ((run.get("intervals") or {}).get("overall") or {}).get(metric, {}).get("diff") or {}
        if leaf.get("low") is not None and leaf.get("high") is not None:
            widths.append(leaf["high"] - leaf["low"])
    if not widths:
        return None
    widths.sort()
    return widths[len(widths) // 2], f"{experiment}/_report/comparison.json, median of {len(widths)} run(s)"


def build_campaign(timings: dict[str, Any], days: float, price_per_hour: float, grid: list[dict[str, Any]],
                   width: float | None = None, spread: float = 0.1, setup_hours: float = 1.0, speedup: float = 1.0,
                   margin: float = 0.15, max_loss_minutes: float = 15.0, continuation_factor: float = 2.0) -> dict[str, Any]:
    """The campaign's phases from timings (pure arithmetic; `labkit.experiment.timings.measured_timings` gives them).

    Args:
        timings: {"seconds": {baseline, preprocessing, parameter_check, seconds_per_step, evaluation, …}, "card": …}.
        days, price_per_hour: the rental.
        grid: variants in priority order, {"variant", "steps", "step_ratio", "save_steps", "replicates"} (`variant_of`;
            a variant with replicates costs one training run and evaluation per seed).
        width: the paired interval width of the primary metric's gain (None: not measured, no cap from the split).
        spread: the range of gains the variants are expected to span (the split separates ⌊spread / width⌋ + 1).
        setup_hours: machine set-up (drivers, environment, model download) — assumed.
        speedup: the rental is this many times faster than the machine the timings were measured on.
        margin: fraction of the rental kept free.
        max_loss_minutes: most work an interruption may lose (sets each training phase's checkpoint interval).
        continuation_factor: the continuation's length in units of the best variant's steps.
    Returns:
        {"phases": [{"phase", "seconds", "hours", "cost", "checkpoint_steps", "notes"}], "variants", "planned",
         "distinguishable", "limited_by", "assumed", "measured", "feasible", "problem", …}.
    """
    if days <= 0 or speedup <= 0 or not 0 <= margin < 1 or not grid or spread <= 0 or max_loss_minutes <= 0:
        raise UsageError("need days > 0, speedup > 0, 0 <= margin < 1, a non-empty grid, spread > 0 and "
                         "max-loss-minutes > 0")
    s = timings["seconds"]
    sps = s["seconds_per_step"] / speedup
    start, setup_load = s.get("process_start", 0.0), s.get("train_setup", 0.0)
    evaluation = s.get("evaluation", s["baseline"]) / speedup
    card = timings["card"]
    ratio = card["test_rows"] / card["validation_rows"] if card.get("test_rows") and card.get("validation_rows") else 1.0
    reload = start + setup_load

    def train_cost(steps: float, step_ratio: float) -> float:
        return steps * sps * step_ratio + evaluation + setup_load + 2 * start + reload

    def interval(step_ratio: float) -> int:
        return max(1, int(max_loss_minutes * 60 // (sps * step_ratio)))

    rental, usable = days * 86400, days * 86400 * (1 - margin)
    setup = setup_hours * 3600
    initial = sum(s[k] / speedup for k in INITIAL) + 3 * start
    final = 2 * start + s.get("final", 2 * s.get("evaluation", s["baseline"]) * ratio) / speedup
    export = reload + start + s.get("export_check", setup_load)
    fixed = setup + initial + final + export
    distinguishable = math.floor(spread / width) + 1 if width else None
    cap = min(len(grid), distinguishable or len(grid))
    left = usable - fixed
    planned: list[dict[str, Any]] = []
    for v in grid[:cap]:
        cost = v.get("replicates", 1) * train_cost(v["steps"], v["step_ratio"])  # one run per seed
        if cost > left:
            break
        planned.append({**v, "seconds": cost})
        left -= cost
    limited_by = ("the grid" if cap == len(grid) and len(planned) == cap else
                  "the validation split" if len(planned) == cap else "the rental's time")
    # the longest single run (a variant's seconds cover its seeds): the plan must fit any winner
    best = max(planned, key=lambda v: v["seconds"] / v.get("replicates", 1)) if planned else None
    cont = train_cost(continuation_factor * best["steps"], best["step_ratio"]) if best else 0.0
    continuation = bool(best) and cont <= left
    left -= cont if continuation else 0.0
    problem = None if planned else (f"no variant fits: set-up, checks, final and export take {fixed / 3600:.1f} h of "
                                    f"{usable / 3600:.1f} h usable")
    rows = [("set-up", setup, None, f"assumed {setup_hours:g} h: drivers, environment, model download"),
            ("initial checks (01–03)", initial, None, "stages 01 baseline, 02 preprocessing, 03 parameter check"),
            *((f"variant {v['variant']}", v["seconds"], interval(v["step_ratio"]),
               (f"{v['replicates']} seeds × (" if v.get("replicates", 1) > 1 else "")
               + f"{v['steps']} steps × {sps * v['step_ratio']:.2f} s + evaluation"
               + (")" if v.get("replicates", 1) > 1 else "")) for v in planned),
            ("continuation of the best", cont if continuation else 0.0,
             interval(best["step_ratio"]) if continuation else None,
             f"{continuation_factor:g} × the best variant's steps (sized for the longest, {best['variant']})"
             if continuation else "does not fit"),
            ("final (compare + test split)", final, None, "labkit compare, then labkit final"),
            ("export", export, None, "labkit export: save + reload check"),
            ("margin", rental - usable, None, f"{margin:.0%} kept free"),
            ("unallocated", max(left, 0.0), None, "")]
    phases = [{"phase": p, "seconds": sec, "hours": sec / 3600, "cost": sec / 3600 * price_per_hour,
               "checkpoint_steps": ck, "notes": note} for p, sec, ck, note in rows]
    assumed = {"set-up": f"{setup_hours:g} h", "spread of gains": f"{spread:g}",
               "speedup": f"{speedup:g} (the rental vs the measured machine)"}
    if width is None:
        assumed["interval width"] = "not measured: no cap from the validation split"
    return {"days": days, "phases": phases, "variants": len(planned), "planned": [v["variant"] for v in planned],
            "listed": len(grid), "distinguishable": distinguishable, "limited_by": limited_by,
            "continuation": continuation, "feasible": problem is None, "problem": problem, "assumed": assumed,
            "measured": dict(timings.get("sources", {})), "rental_hours": rental / 3600,
            "rental_cost": rental / 3600 * price_per_hour}


def format_campaign(plan: dict[str, Any]) -> str:
    """The campaign as text: phases with hours, cost and checkpoint interval; what was assumed and measured."""
    lines = [f"campaign · {plan['days']:g} days · {plan['variants']} of {plan['listed']} listed variant(s) planned "
             f"(limited by {plan['limited_by']}; the split tells apart "
             f"{plan['distinguishable'] if plan['distinguishable'] else 'an unmeasured number of'} variant(s))"]
    for p in plan["phases"]:
        ck = f"checkpoint every {p['checkpoint_steps']} steps" if p["checkpoint_steps"] else ""
        lines.append(f"  {p['phase']:<34} {p['hours']:8.2f} h  {p['cost']:9.2f}  {ck:<28} {p['notes']}")
    lines += [f"assumed: {k}: {v}" for k, v in plan["assumed"].items()]
    lines += [f"measured: {k}: {v}" for k, v in plan["measured"].items()]
    if plan["problem"]:
        lines.append(f"PROBLEM: {plan['problem']}")
    return "\n".join(lines)
