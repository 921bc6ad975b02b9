"""What `labkit run` says about a finished run: the registry's summary, the budget stop, and the verdict line that
ends each card's output (one line per card again at the very end when several ran)."""

from __future__ import annotations

import os
import re
from typing import Any

from labkit.core import io
from labkit.core import runs as R
from labkit.core.comparability import budget_note, steps_text, training_steps
from labkit.stages.records import PAIRED, VERDICT


def registry_summary(run: R.Run) -> dict[str, Any]:
    """The `summary` of the registry's `completed` event: confirmed, the decision, the primary metric's reference
    and tuned values (from comparison/verdict.json; {} when stage 05 did not run).

    Args:
        run: the run.
    Returns:
        {"confirmed", "decision", <metric>: {"baseline", "tuned"}} or {}.
    """
    path = run.dir / "comparison" / VERDICT
    if not path.exists():
        return {}
    verdict = io.read_json(path)
    primary = verdict["primary"]
    ref, tuned = primary.get("reference", primary.get("baseline")), primary.get("tuned")  # against the card's reference
    return {"confirmed": verdict["confirmed"], "decision": verdict.get("decision"),
            primary["metric"]: {"baseline": None if ref is None else round(ref, 4),
                                "tuned": None if tuned is None else round(tuned, 4)}}


def budget_stop(run: R.Run) -> dict[str, Any]:
    """{"stopped_by": "budget", "note"} when training stopped on budget.max_minutes (training/outcome.json says so,
    as training wrote it), else {}.

    Args:
        run: the run.
    Returns:
        the keys the registry's `completed` event carries for a budget stop.
    """
    steps = training_steps(run.dir)
    if not steps["budget_stopped"]:
        return {}
    return {"stopped_by": "budget", "note": f"training stopped by budget.max_minutes after {steps_text(steps)} "
                                            "step(s); a checkpoint was written"}


def verdict_summary(run: R.Run) -> str:
    """The run's verdict line: `verdict <experiment>/<variant>: NOT CONFIRMED · field_accuracy 0.100 → 0.150 (gain
    …) · 3 wins / 1 losses / 8 ties · guardrails 2/3 pass · budget-stopped at 8/24 steps`.

    Args:
        run: the run.
    Returns:
        the line (without a verdict: what the run's status is instead).
    """
    from labkit.evaluate.verdict_text import verdict_line  # numpy and scipy: not at the command line's start

    head = f"verdict {run.experiment}/{run.status().get('variant') or run.run_id}: "
    path = run.dir / "comparison" / VERDICT
    note = budget_note(training_steps(run.dir))
    if not path.exists():
        return head + f"none ({R.status_label(run.status())}; stage 05 did not run)" + (f" · {note}" if note else "")
    decision = io.read_json(path)
    paired = run.dir / "comparison" / PAIRED
    pairs = io.read_json(paired) if paired.exists() and decision.get("against") == "baseline" else None
    return head + verdict_line(decision, pairs, note)


WIDTH = 118  # `labkit compare`'s tables fit a terminal of this many columns


def cut(text: Any, width: int) -> str:
    """`text` as a string of at most `width` characters, cut with "…"."""
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def text_table(rows: list[dict[str, Any]], width: int = WIDTH, flex: str | None = None) -> list[str]:
    """Rows as aligned text lines of at most `width` characters: each column as wide as its longest cell, the `flex`
    column (default: the last) shrunk to fit, and cells that still do not fit cut with "…".

    Args:
        rows: one dict per row, the same keys in the same order (the header).
        width: the most characters a line has.
        flex: the column that gives way first.
    Returns:
        the header, a rule and one line per row.
    """
    if not rows:
        return []
    keys = list(rows[0])
    cells = [[" ".join(str(r.get(k, "")).split()) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    gaps = 2 * (len(keys) - 1)
    flex_at = keys.index(flex) if flex in keys else len(keys) - 1
    over = sum(widths) + gaps - width
    if over > 0:  # the flex column gives way first, down to 12 characters, then every column evenly
        give = min(over, max(0, widths[flex_at] - 12))
        widths[flex_at] -= give
        over -= give
        while over > 0 and max(widths) > 6:
            widest = widths.index(max(widths))
            widths[widest] -= 1
            over -= 1
    lines = [[cut(k, w) for k, w in zip(keys, widths)], ["-" * w for w in widths]]
    lines += [[cut(c, w) for c, w in zip(row, widths)] for row in cells]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]


_RUN_ID = re.compile(r"^(.*)-\d{4}(\d{4}T\d{4})\d{2}Z-[0-9a-f]{8}$")


def short_runs(run_ids: list[str]) -> dict[str, str]:
    """Run ids as table cells: the variant and its start as MMDDTHHMM ("lora-r16 1202T2230"), told apart.

    Variants up to 20 characters are shown whole. Longer ones often share a prefix with the others of the experiment
    ("quickstart-lora-r16-earlystop", "quickstart-qlora-r16"): the prefix all the table's variants share (up to a
    "-", "_" or ".") is then shown as "…", and a variant still over 20 characters is cut in the middle. Other ids
    are kept, cut at 22.

    Args:
        run_ids: the ids of one table.
    Returns:
        {run id: cell}.
    """
    variants = {m.group(1) for m in map(_RUN_ID.match, run_ids) if m}
    long = len(variants) > 1 and max(map(len, variants)) > 20
    shared = os.path.commonprefix(sorted(variants)) if long else ""
    shared = shared[:max(shared.rfind(sep) for sep in "-_.") + 1]
    out = {}
    for run_id in run_ids:
        found = _RUN_ID.match(run_id)
        if not found:
            out[run_id] = cut(run_id, 22)
            continue
        variant = "…" + found.group(1)[len(shared):] if shared else found.group(1)
        out[run_id] = f"{variant if len(variant) <= 20 else variant[:9] + '…' + variant[-10:]} {found.group(2)}"
    return out


def compare_lines(comparison: dict[str, Any], flat: list[dict[str, Any]], pairs: list[dict[str, Any]],
                  seeds: list[dict[str, Any]], width: int = WIDTH) -> list[str]:
    """`labkit compare`'s terminal output: one row per run, the notes that do not fit a cell (not comparable, budget
    stops, failed guardrails, errors), run against run, and the seeds of replicated variants.

    Args:
        comparison: `labkit.experiment.compare.compare_experiment`'s result (comparison.json).
        flat: `summary_rows(comparison)` (one per run, in the same order).
        pairs: `pair_rows(comparison)`.
        seeds: `seed_rows(comparison)`.
        width: the most characters a line has.
    Returns:
        the lines.
    """
    table, notes = [], []
    short = short_runs([r["run_id"] for r in comparison["runs"]]
                       + [p[side] for p in comparison.get("pairs") or [] for side in ("a", "b") if p.get("seeds") is None])
    named = {str(c.get("primary", "")).split(" = ")[0] for c in flat if c.get("primary")}
    metric = named.pop() if len(named) == 1 else "primary"
    for row, cells in zip(comparison["runs"], flat):
        steps = row.get("training_steps")
        primary = str(cells.get("primary", "—")).split(" [")[0]
        table.append({"run": short[row["run_id"]], "status": cells["status"],
                      metric: primary.split(" = ")[-1] if metric != "primary" else primary,
                      "gain [95% CI]": cells.get("gain vs reference [95% CI]", "—"),
                      "w/l/t": cells.get("wins/losses/ties", "—"),
                      "steps": steps_text(steps) if steps else cells.get("steps", "—"),
                      "verdict": str((row.get("decision") or {}).get("decision") or "—").upper()})
        said = str(cells.get("verdict", "")).split(" · ")[1:]  # the flags after the verdict word
        said += [f"guardrail failed: {g}" for g in row.get("guardrails_failed") or []]
        if row.get("reason") and row["status"] != "completed":
            said.append(row["reason"])
        notes += ["  " + cut(f"{short[row['run_id']]}: {x}", width - 2) for x in said]
    lines = [cut(f"experiment {comparison['experiment']}: {len(table)} run(s), gain against each card's reference; "
                 f"reference protocol: run {comparison.get('reference')}", width)]
    lines += text_table(table, width, flex="run")
    if notes:
        lines += ["notes:", *notes]
    if pairs:
        rows = []
        for raw, p in zip(comparison.get("pairs") or [], pairs):
            steps = raw.get("steps") or {"comparable": True}
            one = raw.get("seeds") is None  # a pair of runs, not of variants across seeds
            rows.append({"A": short[raw["a"]] if one else p["A"], "B": short[raw["b"]] if one else p["B"],
                         "metric": p["metric"], "B − A [95% CI]": p["B − A [95% CI]"].split(" · NOT COMPARABLE")[0],
                         "B w/l/t": p["B wins/losses/ties"],
                         "comparable": "yes" if steps["comparable"] else f"NO: {steps['a']} vs {steps['b']} steps"})
        same = {r["metric"] for r in rows}
        if len(same) == 1:
            for r in rows:
                del r["metric"]
        lines += [f"run against run (B − A{' on ' + next(iter(same)) if len(same) == 1 else ''}):",
                  *text_table(rows, width, flex="B − A [95% CI]")]
    if seeds:
        lines += ["seeds:", *text_table([{k: s.get(k, "") for k in seeds[-1]} for s in seeds], width)]
    return lines
