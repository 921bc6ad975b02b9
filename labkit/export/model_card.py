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

from labkit.export.hub_card import front_matter
from labkit.export.limits import judged_change, observed_limits, read_if_present  # noqa: F401 - observed_limits: the card's limits, re-exported
from labkit.show.escape import md_code, md_fence, md_text

PACKAGES = ("torch", "transformers", "peft", "trl", "accelerate", "bitsandbytes", "datasets")


def collect_results(run_dir: Path) -> dict[str, Any]:
    """The run's results against the baseline: validation always, test when `labkit final` opened it.

    Args:
        run_dir: the run folder.
    Returns:
        {"validation": {"baseline", "tuned", "verdict", "paired"}, "test": {... , "opening"} or None, "test_opened"}.
    """
    val = {"baseline": read_if_present(run_dir / "baseline" / "baseline_metrics.json"),
           "tuned": read_if_present(run_dir / "comparison" / "tuned_metrics.json"),
           "verdict": read_if_present(run_dir / "comparison" / "verdict.json"),
           "paired": read_if_present(run_dir / "comparison" / "paired.json")}
    final = run_dir / "final"
    test = None
    if (final / "tuned_metrics.json").exists():
        test = {"baseline": read_if_present(final / "baseline_metrics.json"), "tuned": read_if_present(final / "tuned_metrics.json"),
                "verdict": read_if_present(final / "verdict.json"), "opening": read_if_present(final / "opening.json")}
    return {"validation": val, "test": test, "test_opened": test is not None}


def environment(run_dir: Path) -> dict[str, Any]:
    """What the run ran on, from env.json: python, platform, device, library versions (no variables, no secrets).

    Args:
        run_dir: the run folder.
    Returns:
        {"python", "platform", "device", "cuda", "packages", "labkit"}.
    """
    env = read_if_present(run_dir / "env.json") or {}
    acc = env.get("accelerators") or {}
    devices = [d.get("name", str(d)) if isinstance(d, dict) else str(d) for d in acc.get("devices") or []]
    packages = env.get("packages") or {}
    return {"python": env.get("python"), "platform": env.get("platform"),
            "device": ", ".join(devices) if devices else ("cuda" if acc.get("cuda_available") else "cpu"),
            "cuda": acc.get("cuda"), "packages": {k: packages.get(k) for k in PACKAGES if packages.get(k)},
            "labkit": env.get("labkit")}


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _judged(metric: str, baseline: float, tuned: float) -> str:
    """" (better)" / " (worse)" in the metric's good direction (limits.judged_change); "" without one or no change."""
    change = judged_change(metric, baseline, tuned)
    if change is None or abs(change) <= 1e-12:
        return ""
    return " (better)" if change > 0 else " (worse)"


def _metrics_table(res: dict[str, Any]) -> list[str]:
    base, tuned = res.get("baseline") or {}, res.get("tuned") or {}
    names = list((tuned.get("overall") or {}).keys())
    lines = ["| metric | baseline | tuned | change (judged in its good direction) |", "|---|---|---|---|"]
    for name in names:
        b, t = (base.get("overall") or {}).get(name), tuned["overall"][name]
        change = f"{t - b:+.3f}{_judged(name, b, t)}" if isinstance(b, (int, float)) else ""
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


def _origin_lines(base: dict[str, Any], method: str) -> list[str]:
    """Where the base is on the Hub (and what a GGUF was converted from), or that it is not."""
    hub = base.get("hub_origin")
    if base.get("hf_repo"):
        return [f"- on the Hub: `{base['hf_repo']}` at revision `{base['revision']}`"]
    if hub:
        return [f"- on the Hub: the same GGUF file, `{hub['gguf_file']}` of `{hub['hub_id']}` at revision `{hub['revision']}` "
                f"(said by {md_text(hub['said_by'])}); converted from `{hub['converted_from']}` (quantised to GGUF, "
                "dequantised by transformers for training)",
                "- `adapter_config.json` names that repository and revision; transformers loads the base from there with "
                f"`gguf_file={hub['gguf_file']!r}` (the snippet's comment below)"]
    if method == "full":
        return []
    return [f"- not on the Hub: `adapter_config.json` names labkit's source {md_code(base['source'])} (no folder of the "
            "machine that exported), which `AutoPeftModelForCausalLM` cannot fetch; load the base with labkit as in the "
            "snippet below, or publish the base and point "
            "`base_model_name_or_path` and `revision` at it before sharing the adapter"]


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
    lines += _origin_lines(base, info["method"])
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
