"""The model card of an export: what was tried, on which base and data, what it achieved, where it fails.

Everything comes from the run's data files, never from notebook outputs:
  card.yaml, data_manifest.json, env.json, model_source.json          what was run
  baseline/baseline_metrics.json, comparison/tuned_metrics.json,
  comparison/tuned_predictions.jsonl, comparison/verdict.json, comparison/paired.json   validation
  final/tuned_metrics.json, final/baseline_metrics.json, final/verdict.json, final/opening.json   test (`labkit final`)
  preprocessing/lengths.json                                          truncation (computed when absent)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from labkit.core import io
from labkit.core import runs as R
from labkit.data.lengths import length_stats
from labkit.data.prepare import load_split
from labkit.data.prompting import encode_rows
from labkit.export.hub_card import front_matter
from labkit.show.escape import md_code, md_fence, md_text

PACKAGES = ("torch", "transformers", "peft", "trl", "accelerate", "bitsandbytes", "datasets")
PER_EXAMPLE = {"json_valid_rate": "json_valid", "field_presence_rate": "field_presence"}


def _read(path: Path) -> Any:
    if not path.exists():
        return None
    if path.suffix == ".jsonl":
        return io.read_jsonl(path)
    return io.read_json(path)


def collect_results(run_dir: Path) -> dict[str, Any]:
    """The run's results against the baseline: validation always, test when `labkit final` opened it.

    Args:
        run_dir: the run folder.
    Returns:
        {"validation": {"baseline", "tuned", "verdict", "paired"}, "test": {... , "opening"} or None, "test_opened"}.
    """
    val = {"baseline": _read(run_dir / "baseline" / "baseline_metrics.json"),
           "tuned": _read(run_dir / "comparison" / "tuned_metrics.json"),
           "verdict": _read(run_dir / "comparison" / "verdict.json"),
           "paired": _read(run_dir / "comparison" / "paired.json")}
    final = run_dir / "final"
    test = None
    if (final / "tuned_metrics.json").exists():
        test = {"baseline": _read(final / "baseline_metrics.json"), "tuned": _read(final / "tuned_metrics.json"),
                "verdict": _read(final / "verdict.json"), "opening": _read(final / "opening.json")}
    return {"validation": val, "test": test, "test_opened": test is not None}


def environment(run_dir: Path) -> dict[str, Any]:
    """What the run ran on, from env.json: python, platform, device, library versions (no variables, no secrets).

    Args:
        run_dir: the run folder.
    Returns:
        {"python", "platform", "device", "cuda", "packages", "labkit"}.
    """
    env = _read(run_dir / "env.json") or {}
    acc = env.get("accelerators") or {}
    devices = [d.get("name", str(d)) if isinstance(d, dict) else str(d) for d in acc.get("devices") or []]
    packages = env.get("packages") or {}
    return {"python": env.get("python"), "platform": env.get("platform"),
            "device": ", ".join(devices) if devices else ("cuda" if acc.get("cuda_available") else "cpu"),
            "cuda": acc.get("cuda"), "packages": {k: packages.get(k) for k in PACKAGES if packages.get(k)},
            "labkit": env.get("labkit")}


def _worse_categories(baseline: dict[str, Any] | None, tuned: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not baseline or not tuned:
        return []
    out = []
    for cat, values in sorted((tuned.get("per_category") or {}).items()):
        base = (baseline.get("per_category") or {}).get(cat, {})
        for metric, value in values.items():
            if metric == "support" or metric not in base or not isinstance(value, (int, float)):
                continue
            if value < base[metric] - 1e-12:
                out.append({"category": cat, "metric": metric, "baseline": base[metric], "tuned": value,
                            "drop": base[metric] - value})
    return out


def _weakest_categories(tuned: dict[str, Any] | None, metric: str) -> list[dict[str, Any]]:
    """Categories below the tuned model's overall level on the primary metric (or F1), weakest first."""
    cats = (tuned or {}).get("per_category") or {}
    key = next((k for k in (metric, "field_accuracy", "f1") if cats and all(k in v for v in cats.values())), None)
    overall = ((tuned or {}).get("overall") or {}).get(key if key != "f1" else "macro_f1")
    if key is None or overall is None:
        return []
    rows = [{"category": c, "metric": key, "tuned": v[key], "overall": overall, "f1": v.get("f1")}
            for c, v in cats.items() if v[key] < overall - 1e-12]
    return sorted(rows, key=lambda r: r["tuned"])


def _example_key(metric: str, row: dict[str, Any]) -> str:
    key = PER_EXAMPLE.get(metric, metric)
    if key in row:
        return key
    return next((k for k in ("field_accuracy", "rougeL", "exact_match") if k in row), key)


def failure_examples(run_dir: Path, metric: str, n: int = 3) -> list[dict[str, Any]]:
    """The tuned predictions with the lowest per-example score on the primary metric (regressions first among ties).

    Args:
        run_dir: the run folder.
        metric: the card's primary metric.
        n: how many.
    Returns:
        rows {"id", "category", "metric", "tuned", "baseline", "target", "prediction", "baseline_prediction"}.
    """
    tuned = _read(run_dir / "comparison" / "tuned_predictions.jsonl") or []
    base = {r["id"]: r for r in _read(run_dir / "baseline" / "baseline_predictions.jsonl") or []}
    if not tuned:
        return []
    key = _example_key(metric, tuned[0])
    if key not in tuned[0]:
        return []

    def base_score(row: dict[str, Any]) -> float:
        return float(base.get(row["id"], {}).get(key, 0.0))

    worst = sorted(tuned, key=lambda r: (r[key], -(base_score(r) - r[key]), r["id"]))[:n]
    return [{"id": r["id"], "category": r.get("category"), "metric": key, "tuned": r[key], "baseline": base_score(r),
             "target": r["target"], "prediction": r["prediction"][:300],
             "baseline_prediction": base.get(r["id"], {}).get("prediction", "")[:300]} for r in worst]


def truncation(run_dir: Path, card: Any, tokenizer: Any = None) -> dict[str, Any]:
    """How much of the data max_length cut, and what the cleaning rules dropped for length.

    Read from stage 02's preprocessing/lengths.json; computed from the prepared train and validation
    splits with the tokenizer when that file is absent.

    Args:
        run_dir: the run folder.
        card: the card (max_length, prompt).
        tokenizer: the tokenizer, for computing lengths when stage 02 recorded none.
    Returns:
        {"max_length", "source", "per_split": {split: {rows, max, truncated_rate, completion_cut_rate}},
        "dropped_for_length": [{"rule", "removed"}]}.
    """
    stats = _read(run_dir / "preprocessing" / "lengths.json")
    source = "preprocessing/lengths.json"
    if stats is None and tokenizer is not None:
        run = R.Run(run_dir)
        stats = length_stats(card, {s: encode_rows(tokenizer, card, load_split(run, s)) for s in ("train", "validation")})
        source = "computed at export from data/ and the exported tokenizer"
    manifest = _read(run_dir / "data_manifest.json") or {}
    dropped = [{"rule": step["rule"], "removed": step["removed"]} for step in manifest.get("cleaning", [])
               if isinstance(step.get("rule"), dict) and any(k.startswith("drop_longer_than") for k in step["rule"])]
    per_split = {s: {k: v.get(k) for k in ("rows", "max", "truncated_rate", "completion_cut_rate")}
                 for s, v in (stats or {}).items()}
    return {"max_length": card.data.max_length, "source": source if stats is not None else None,
            "per_split": per_split, "dropped_for_length": dropped}


def observed_limits(run_dir: Path, card: Any, results: dict[str, Any], tokenizer: Any = None) -> dict[str, Any]:
    """Where the tuned model is known to fall short.

    Args:
        run_dir: the run folder.
        card: the card.
        results: `collect_results(run_dir)`.
        tokenizer: the exported tokenizer (only used when stage 02 recorded no lengths).
    Returns:
        {"categories_worse", "weakest_categories", "guardrails_failed", "primary_not_met", "truncation",
        "failure_examples", "evaluated_on"}.
    """
    limits: dict[str, Any] = {"categories_worse": {}, "weakest_categories": {}, "guardrails_failed": {}, "primary_not_met": {}}
    for split in ("validation", "test"):
        res = results.get(split)
        if not res:
            continue
        limits["categories_worse"][split] = _worse_categories(res.get("baseline"), res.get("tuned"))
        limits["weakest_categories"][split] = _weakest_categories(res.get("tuned"), card.experiment.target.primary_metric)
        verdict = res.get("verdict") or {}
        limits["guardrails_failed"][split] = [g for g in verdict.get("guardrails", []) if not g.get("ok")]
        if verdict.get("primary") and not verdict["primary"].get("ok"):
            limits["primary_not_met"][split] = verdict["primary"]
    limits["truncation"] = truncation(run_dir, card, tokenizer)
    limits["failure_examples"] = failure_examples(run_dir, card.experiment.target.primary_metric)
    limits["evaluated_on"] = {s: (results[s] or {}).get("tuned", {}).get("n") for s in ("validation", "test") if results.get(s)}
    return limits


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _metrics_table(res: dict[str, Any]) -> list[str]:
    base, tuned = res.get("baseline") or {}, res.get("tuned") or {}
    names = list((tuned.get("overall") or {}).keys())
    lines = ["| metric | baseline | tuned | change |", "|---|---|---|---|"]
    for name in names:
        b, t = (base.get("overall") or {}).get(name), tuned["overall"][name]
        change = f"{t - b:+.3f}" if isinstance(b, (int, float)) else ""
        lines.append(f"| `{name}` | {_fmt(b)} | {_fmt(t)} | {change} |")
    cats = tuned.get("per_category") or {}
    if cats:
        lines += ["", "| category | n | F1 baseline → tuned | field_accuracy baseline → tuned |", "|---|---|---|---|"]
        for cat, v in cats.items():
            b = (base.get("per_category") or {}).get(cat, {})
            lines.append(f"| {cat} | {v.get('support', '')} | {_fmt(b.get('f1'))} → {_fmt(v.get('f1'))} | "
                         f"{_fmt(b.get('field_accuracy'))} → {_fmt(v.get('field_accuracy'))} |")
    verdict = res.get("verdict") or {}
    if verdict.get("verdict"):
        lines += ["", f"**Verdict:** {verdict['verdict']}"]
    return lines


def _merged_section(scores: dict[str, Any] | None) -> list[str]:
    """The model card's "Merged model" section: the merged model's scores beside the adapter's on the same rows."""
    if not scores:
        return []
    lines = ["", "## Merged model", "", f"The adapter merged into its base ({scores['dtype']}), scored on {scores['rows']} "
             f"{scores['split']} rows beside the unmerged adapter (the evaluated model); {scores['changed_answers']} "
             "answer(s) differ.", "", "| metric | adapter | merged | difference |", "|---|---|---|---|"]
    for key, diff in scores["difference"].items():
        lines.append(f"| `{key}` | {_fmt(scores['adapter'][key])} | {_fmt(scores['merged'][key])} | {diff:+.3f} |")
    return lines


def render(info: dict[str, Any]) -> str:
    """The model card (README.md of the export) as Markdown.

    Args:
        info: {"run_id", "experiment", "card" (Card), "card_yaml", "base", "manifest", "env", "results",
            "limits", "reload" (reload_check.json or None), "weights_dir", "merged", "method"}.
    Returns:
        the Markdown text.
    """
    card, base, results, limits = info["card"], info["base"], info["results"], info["limits"]
    reload = info.get("reload") or {}
    lines = front_matter(info) + ["", f"# {info['experiment']} / {info['run_id']}", ""]
    status = "passed" if reload.get("ok") else "FAILED — do not use this export" if reload else "not run"
    lines += [f"Exported by `labkit export` from run `{info['run_id']}`. Reload check: **{status}**"
              + (f" ({info['reload_summary']})." if info.get("reload_summary") else "."), "",
              "## Hypothesis", "", md_text(card.experiment.hypothesis.strip()), "",
              f"Primary metric `{card.experiment.target.primary_metric}`, required gain ≥ {card.experiment.target.min_improvement}.", "",
              "## Base model", "", f"- source: `{base['source']}`", f"- exact revision: `{base['revision']}`"]
    described = base.get("described") or {}
    license_ = described.get("license") or "unknown (check it before you share this)"
    lines += [f"- model: {md_text(described.get('name'))}; license: {md_text(license_)}; language: "
              f"{md_text(described.get('language') or 'not stated')} (read from {md_text(described.get('from'))})"]
    if not base.get("hf_repo") and info["method"] != "full":
        lines.append(f"- `adapter_config.json` names the local folder of these exact weights, `{base.get('location')}`: "
                     "`AutoPeftModelForCausalLM` loads it on this machine; elsewhere use the snippet below")
    for name, sha in (base.get("weights_sha256") or {}).items():
        lines.append(f"- sha256 of `{name}`: `{sha}`")
    m = info["manifest"] or {}
    split = m.get("split", {})
    lines += ["", "## Data", "", f"- data version: `{m.get('data_version')}`",
              f"- source: `{json.dumps(m.get('source'), ensure_ascii=False)}`",
              f"- split sizes: {json.dumps(split.get('sizes'))}; split sha256: "
              + ", ".join(f"{k} `{v[:12]}`" for k, v in (split.get("sha256") or {}).items())]
    env = info["env"]
    lines += ["", "## Environment of the run", "", f"- python {env.get('python')}, {env.get('platform')}",
              f"- device: {env.get('device')}" + (f" (CUDA {env['cuda']})" if env.get("cuda") else ""),
              "- " + ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items())]
    lines += ["", "## Results against the base model", "",
              f"### Validation ({(results['validation'].get('tuned') or {}).get('n')} examples, same prompts, greedy)", ""]
    lines += _metrics_table(results["validation"])
    paired = results["validation"].get("paired")
    if paired:
        lines += ["", f"Paired per example on the primary metric: {paired.get('wins')} wins, {paired.get('losses')} losses, "
                  f"{paired.get('ties')} ties."]
    lines += ["", "### Test"]
    if results["test_opened"]:
        opening = results["test"].get("opening") or {}
        if opening.get("when"):
            said = (f"Opened by `labkit final` on {opening['when']} (opening #{opening.get('opening', 1)}"
                    + (f", reopened: {md_text(opening.get('why'))}" if opening.get("reopen") else "") + f"), {opening.get('test_rows')} test rows.")
        else:
            said = f"Opened by `labkit final`: `{json.dumps(opening, ensure_ascii=False, default=str)[:300]}`"
        lines += ["", said, ""]
        lines += _metrics_table(results["test"])
    else:
        lines += ["", "Test split not opened (`labkit final RUN` opens it once); only validation results are reported."]
    lines += ["", "## Observed limits", ""]
    for split, rows in limits["categories_worse"].items():
        text = "; ".join(f"{md_text(r['category'])} {r['metric']} {r['baseline']:.3f} → {r['tuned']:.3f}" for r in rows) or "none"
        lines.append(f"- categories worse than the base model ({split}): {text}")
    for split, rows in limits["weakest_categories"].items():
        if rows:
            lines.append(f"- categories below the tuned model's overall {rows[0]['metric']} {rows[0]['overall']:.3f} ({split}): "
                         + "; ".join(f"{md_text(r['category'])} {r['tuned']:.3f}" + (f" (F1 {r['f1']:.3f})" if r.get("f1") is not None else "")
                                     for r in rows))
    for split, rows in limits["guardrails_failed"].items():
        text = "; ".join(f"{r['metric']}: {md_text(r['why'])}" for r in rows) or "none"
        lines.append(f"- failing guardrails ({split}): {text}")
    for split, primary in limits["primary_not_met"].items():
        gain = primary.get("gain")
        why = primary.get("why") or (f"{primary['metric']} gain {gain:+.3f} < {primary['min_improvement']}"
                                     if gain is not None else primary["metric"])
        lines.append(f"- primary metric not met ({split}): {md_text(why)}")
    trunc = limits["truncation"]
    rates = ", ".join(f"{s} {v.get('truncated_rate', 0):.1%} (max {v.get('max')} tokens)" for s, v in trunc["per_split"].items())
    lines.append(f"- truncation at max_length {trunc['max_length']}: {rates or 'not recorded'}"
                 + (f" [{trunc['source']}]" if trunc.get("source") else ""))
    for d in trunc["dropped_for_length"]:
        lines.append(f"- rows removed before splitting by `{json.dumps(d['rule'])}`: {d['removed']}")
    lines.append(f"- evaluated on {', '.join(f'{n} {s}' for s, n in limits['evaluated_on'].items())} examples: small samples "
                 "give wide uncertainty.")
    if limits["failure_examples"]:
        lines += ["", "Failure examples (lowest primary-metric score of the tuned model on validation):", ""]
        for ex in limits["failure_examples"]:
            lines += [f"- {md_code(ex['id'])} ({md_text(ex['category'])}), {ex['metric']} {ex['tuned']:.2f} "
                      f"(base {ex['baseline']:.2f})", f"  - expected: {md_code(ex['target'])}",
                      f"  - tuned: {md_code(ex['prediction'])}"]
    lines += _merged_section(reload.get("merged_scores"))
    lines += ["", "## How to load it", "", "```python", *info["load_snippet"], "```", "",
              "## Files", "", f"- `{info['weights_dir']}/`: "
              + ("the trained model" if info["method"] == "full" else "the adapter (safetensors) with `adapter_config.json` "
                 "naming the base and its revision, `labkit_base_model.json`")
              + ", the tokenizer (chat template, EOS/pad) and `generation_config.json` (the evaluation's greedy decoding)"]
    if info["merged"]:
        lines.append("- `merged/`: base + adapter merged (peft `merge_and_unload`), safetensors, loadable without peft")
        if info["method"] == "qlora":
            lines.append("  - QLoRA: merged into the dequantised 4-bit weights the adapter learned against; the results above "
                         "were measured with the adapter on the 4-bit base: the merged model's own are under Merged model")
    lines += ["- `results.json`, `limits.json`: the numbers above as data; `reload_check.json`: the reload check; "
              "`merged_vs_adapter.json`: the merged model's scores beside the adapter's",
              "- `card.yaml`: the resolved experiment card; `export.json`: what was exported, with sha256 of every file",
              "", "## Experiment card (resolved)", "", *md_fence(info["card_yaml"].rstrip(), "yaml"), ""]
    return "\n".join(lines)
