"""What a tracking mirror (MLflow, W&B) shows of a run: a curated view of its folder, the same for every backend.

Headline metrics only — the primary metric (stage 01's baseline value, the tuned value), the guardrails' values, the
gain with its interval and the verdict, stage 03's predicted step time, the run metrics (train seconds, tokens/s,
MFU, memory, cost) and the steps trained; the trainer's own step metrics come from its callback (report_to), once.
Per-category and per-key values are tables, restricted to the task's metrics; the baseline is a table sent once per
baseline key (the first mirrored run that measured it). The hypothesis and the verdict are the run's description.
"""

from __future__ import annotations

import base64
import html
import json
import mimetypes
import re
from pathlib import Path
from typing import Any

import yaml

from labkit.core import io
from labkit.core import runs as R
from labkit.stages import records

RUN_METRICS = ("train_seconds", "tokens_seen", "tokens_per_second", "mfu", "peak_memory_gib", "cost")
PLAN_METRICS = ("seconds_per_step", "train_seconds")
SLOT_COLUMNS = ("slot_precision", "slot_recall", "slot_f1", "support")


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested card or result as {"a.b.c": leaf}; lists are kept whole (as JSON)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(flatten(sub, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): json.dumps(value) if isinstance(value, list) else value}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")


def numbers(value: Any, prefix: str) -> dict[str, float]:
    """The finite numbers of a result file as metrics ("baseline/field_accuracy", …); booleans as 0/1."""
    out = {}
    for key, leaf in flatten(value, prefix + "/").items():
        if isinstance(leaf, bool):
            out[key] = float(leaf)
        elif _finite(leaf):
            out[key] = float(leaf)
    return {k.replace(" ", "_").replace("/overall.", "/"): v for k, v in out.items()}


def _read(run_dir: Path, name: str) -> Any:
    path = run_dir / name
    return io.read_json(path) if path.exists() else None


def read_card(run: R.Run) -> dict[str, Any]:
    """The run's archived card as a plain dict."""
    return yaml.safe_load(run.card_path.read_text(encoding="utf-8")) or {}


def task_metrics(card: dict[str, Any], verdict: dict[str, Any] | None = None) -> list[str]:
    """The metrics this task is judged on: the primary metric, the guardrails' (and the verdict's default ones) and
    eval.metrics; `per_category_f1` reads as the per-category `f1`.

    Args:
        card: the archived card.
        verdict: comparison/verdict.json, when written (it names the default guardrails too).
    Returns:
        metric names, in that order, each once.
    """
    experiment = card.get("experiment") or {}
    names = [(experiment.get("target") or {}).get("primary_metric")]
    names += [g.get("metric") for g in experiment.get("guardrails") or []]
    names += [str(g.get("metric", "")).split("[")[0] for g in (verdict or {}).get("guardrails") or []]
    names += list((card.get("eval") or {}).get("metrics") or [])
    return list(dict.fromkeys(n for n in names if n))


def run_metrics(run_dir: Path) -> dict[str, float]:
    """The run metrics (`labkit.scoring.names.RUN_METRICS` and tokens seen): stage 05's record of them, else what
    stage 04's outcome says (a run that stopped before stage 05)."""
    tuned = _read(run_dir, f"comparison/{records.TUNED_METRICS}") or {}
    found = dict(tuned.get("run") or {})
    if not found and (outcome := records.read_outcome(run_dir)):
        cost = outcome.get("cost") or {}
        found = {"train_seconds": (outcome.get("metrics") or {}).get("train_runtime"), "tokens_seen": cost.get("tokens"),
                 "tokens_per_second": cost.get("tokens_per_second"), "mfu": cost.get("mfu")}
    return {f"run/{k}": float(found[k]) for k in RUN_METRICS if _finite(found.get(k))}


def headline(run_dir: Path, card: dict[str, Any]) -> dict[str, float]:
    """The run's headline metrics, as far as its stages got (see the module docstring).

    Args:
        run_dir: the run folder.
        card: its archived card.
    Returns:
        {name: value}: `baseline/<primary>`, `parameter_check/plan.*`, `training/steps`, `run/*`,
        `comparison/<primary and guardrail metrics>`, `verdict/{gain,gain_low,gain_high,confirmed,guardrails_failed}`.
    """
    out: dict[str, float] = {}
    primary = ((card.get("experiment") or {}).get("target") or {}).get("primary_metric")
    base = _read(run_dir, f"baseline/{records.BASELINE_METRICS}") or {}
    if _finite((base.get("overall") or {}).get(primary)):
        out[f"baseline/{primary}"] = float(base["overall"][primary])
    plan = (_read(run_dir, f"parameter_check/{records.FIT}") or {}).get("plan") or {}
    out.update({f"parameter_check/plan.{k}": float(plan[k]) for k in PLAN_METRICS if _finite(plan.get(k))})
    outcome = records.read_outcome(run_dir) or {}
    out.update({f"training/{k}": float(outcome[k]) for k in ("steps", "best_step") if _finite(outcome.get(k))})
    out.update(run_metrics(run_dir))
    verdict = _read(run_dir, f"comparison/{records.VERDICT}")
    if not verdict:
        return out
    decided = verdict.get("primary") or {}
    if _finite(decided.get("tuned")):
        out[f"comparison/{decided['metric']}"] = float(decided["tuned"])
    for name in ("gain", "gain_low", "gain_high"):
        if _finite(decided.get(name)):
            out[f"verdict/{name}"] = float(decided[name])
    if verdict.get("against", "baseline") != "baseline" and _finite(decided.get("reference")):
        out["verdict/reference"] = float(decided["reference"])  # another run's value, not the baseline
    worst: dict[str, float] = {}
    for rail in verdict.get("guardrails") or []:
        metric, value = str(rail.get("metric")), rail.get("value")
        if not _finite(value):
            continue
        if "[" in metric:  # one check per category: the table has each; the metric is the lowest
            name = f"comparison/{metric.split('[')[0]}.min"
            worst[name] = min(worst.get(name, float(value)), float(value))
        else:
            out[f"comparison/{metric}"] = float(value)
    out.update(worst)
    out["verdict/confirmed"] = float(bool(verdict.get("confirmed")))
    out["verdict/guardrails_failed"] = float(sum(not g.get("ok", True) for g in verdict.get("guardrails") or []))
    return out


def metric_tables(metrics: dict[str, Any] | None, columns: list[str]) -> dict[str, list[dict[str, Any]]]:
    """A metrics file's per-category and per-key values as table rows, only the task's columns.

    Args:
        metrics: baseline_metrics.json or tuned_metrics.json.
        columns: the task's metrics (`task_metrics`).
    Returns:
        {"per_category": [{"category", <metric>…, "support"}], "per_key": [{"key", slot_*…, "support"}]}; a group
        without values is left out.
    """
    wanted = [("f1" if c == "per_category_f1" else c) for c in columns] + ["support"]
    out: dict[str, list[dict[str, Any]]] = {}
    rows = [{"category": c, **{m: v[m] for m in wanted if m in v}} for c, v in ((metrics or {}).get("per_category") or {}).items()]
    if rows:
        out["per_category"] = rows
    keys = [{"key": k, **{m: v[m] for m in SLOT_COLUMNS if m in v}} for k, v in ((metrics or {}).get("per_key") or {}).items()]
    if keys:
        out["per_key"] = keys
    return out


def tuned_tables(run_dir: Path, card: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The tuned model's per-category and per-key values (stage 05), task metrics only."""
    verdict = _read(run_dir, f"comparison/{records.VERDICT}")
    return metric_tables(_read(run_dir, f"comparison/{records.TUNED_METRICS}"), task_metrics(card, verdict))


def baseline_table(run_dir: Path, card: dict[str, Any]) -> tuple[str, list[dict[str, Any]]] | None:
    """Stage 01's values as one table (overall, then per category and per key), task metrics only.

    Returns:
        (the baseline key, rows {"scope", <metric>…}), or None before stage 01 wrote them.
    """
    metrics = _read(run_dir, f"baseline/{records.BASELINE_METRICS}")
    key = (_read(run_dir, f"baseline/{records.BASELINE_KEY}") or {}).get("key")
    if not metrics or not key:
        return None
    columns = task_metrics(card, _read(run_dir, f"comparison/{records.VERDICT}"))
    overall = metrics.get("overall") or {}
    rows = [{"scope": "overall", **{c: overall[c] for c in columns if c in overall}, "support": metrics.get("n")}]
    tables = metric_tables(metrics, columns)
    rows += [{"scope": f"category {r.pop('category')}", **r} for r in tables.get("per_category", [])]
    rows += [{"scope": f"key {r.pop('key')}", **r} for r in tables.get("per_key", [])]
    return str(key), rows


def run_state(run: R.Run) -> dict[str, Any]:
    """The run's status as a mirror shows it.

    Returns:
        {"status": labkit's status, `budget_stopped` for a completed run whose training the budget stopped,
         "steps": steps trained, "planned": stage 03's planned steps (or None), "error"}.
    """
    status = run.status()
    outcome = records.read_outcome(run.dir) or {}
    label = str(status.get("status"))
    if label == "completed" and (outcome.get("budget_exhausted") or status.get("stopped_by") == "budget"):
        label = "budget_stopped"
    plan = (_read(run.dir, f"parameter_check/{records.FIT}") or {}).get("plan") or {}
    return {"status": label, "steps": outcome.get("steps"), "planned": plan.get("steps"), "error": status.get("error")}


def description(run: R.Run, card: dict[str, Any]) -> str:
    """The run's description (Markdown): the hypothesis, the verdict (or how far the run got), a budget stop."""
    experiment = card.get("experiment") or {}
    state = run_state(run)
    verdict = _read(run.dir, f"comparison/{records.VERDICT}") or {}
    lines = [f"**Hypothesis:** {str(experiment.get('hypothesis', '')).strip()}", ""]
    if verdict.get("verdict"):
        lines.append(f"**Verdict:** {verdict['verdict']}")
    else:
        lines.append("**Verdict:** none yet (the run is running)" if state["status"] == "running" else
                     f"**Verdict:** none (the run {state['status']} before stage 05 decided)")
    if state["status"] == "budget_stopped":
        planned = f" of {state['planned']}" if state["planned"] else ""
        lines += ["", f"**Budget-stopped:** training stopped by budget.max_minutes after {state['steps']}{planned} "
                      "steps; not comparable with a run that trained its planned steps."]
    lines += ["", f"Variant `{experiment.get('variant')}` · labkit run `{run.run_id}` · status {state['status']}"]
    return "\n".join(lines)


def self_contained(index: Path) -> str:
    """The report page with its images inlined (data: URIs), so it renders as one file — MLflow's artifact viewer
    shows an HTML artifact from a blob URL, where relative images cannot load.

    Args:
        index: the report's index.html.
    Returns:
        the page's HTML; images outside the report folder are left as they are.
    """
    folder = index.parent.resolve()

    def inline(match: re.Match[str]) -> str:
        src = html.unescape(match.group(2))
        path = (folder / src).resolve()
        if "://" in src or src.startswith("data:") or folder not in path.parents or not path.is_file():
            return match.group(0)
        kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        return f'{match.group(1)}data:{kind};base64,{base64.b64encode(path.read_bytes()).decode()}{match.group(3)}'

    return re.sub(r'(<img\b[^>]*?\bsrc=")([^"]+)(")', inline, index.read_text(encoding="utf-8"))
