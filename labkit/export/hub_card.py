"""What an export tells the Hugging Face Hub: the model card's metadata header and what is known of the base model.

The header follows the Hub's model-card conventions (huggingface_hub's `ModelCardData`): `base_model` (the hub id of
an `hf:` source, or of the Hub file a GGUF is a copy of when its origin is known: `labkit.export.publish.hub_base`;
a local folder has none) with `base_model_relation`, `license` and `language` of the base (its hub card, its GGUF
metadata or its folder's README.md), `datasets` (hub datasets only), `pipeline_tag: text-generation`,
`library_name`, `tags` and a `model-index` holding the task's metrics (`task_metrics`: what the verdict judges and
the metrics of the card's answer format; no ROUGE for a JSON card) on validation and, once `labkit final` opened
it, on test. Offline: only files already on disk are read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFReader
from huggingface_hub import EvalResult, ModelCard, ModelCardData, try_to_load_from_cache

from labkit.export.publish import hub_base
from labkit.model.source_spec import parse_source
from labkit.model.sources import cache_dir
from labkit.scoring.names import METRICS, RUN_METRICS, TWO_SIDED

GGUF_KEYS = {"general.name": "name", "general.organization": "organization", "general.basename": "basename",
             "general.size_label": "size", "general.finetune": "finetune", "general.license": "license",
             "general.languages": "language"}


def gguf_metadata(path: Path) -> dict[str, Any]:
    """The descriptive `general.*` fields of a GGUF file (name, organization, license, languages…).

    Args:
        path: the .gguf file.
    Returns:
        {"name", "organization", "basename", "size", "finetune", "license", "language"}, the fields present only.
    """
    fields = GGUFReader(str(path)).fields
    out: dict[str, Any] = {}
    for key, name in GGUF_KEYS.items():
        if key in fields:
            try:
                out[name] = fields[key].contents()
            except (ValueError, IndexError, TypeError):  # a field of an unexpected type is left out
                continue
    return out


def _readme_metadata(readme: Path | str | None) -> dict[str, Any]:
    if not readme or not Path(readme).is_file():
        return {}

    data = ModelCard.load(readme).data.to_dict()
    return {k: data[k] for k in ("license", "language") if data.get(k)}


def _gguf_file(source: str, card_dir: Path | None) -> Path | None:
    parts = parse_source(source)
    if parts["kind"] == "pypi":
        return cache_dir() / "pypi" / f"{parts['pkg']}-{parts['ver']}" / parts["file"]
    if parts["kind"] == "gguf":
        path = Path(parts["path"]).expanduser()
        return path if path.is_absolute() or card_dir is None else (card_dir / path).resolve()
    return None


def describe_base(resolved: Any, card_dir: Path | None = None) -> dict[str, Any]:
    """What is known of the base model beyond its labkit source: hub id, name, license, language.

    Args:
        resolved: the resolved model source (labkit.model.sources.ResolvedModel).
        card_dir: the folder relative `.gguf` paths are relative to.
    Returns:
        {"hub_id" (hf: sources), "name", "license", "language", "from": where it was read}; unknown keys absent.
    """
    if resolved.kind == "hf":
        readme = try_to_load_from_cache(resolved.location, "README.md", revision=resolved.revision)
        meta = _readme_metadata(readme if isinstance(readme, str) else None)
        return {"hub_id": resolved.location, "name": resolved.location, **meta, "from": "the hub's model card"}
    gguf = _gguf_file(resolved.source, card_dir)
    if gguf is not None and gguf.is_file():
        meta = gguf_metadata(gguf)
        name = " ".join(str(meta[k]) for k in ("organization", "name") if meta.get(k)) or gguf.name
        return {"name": f"{name} (GGUF file {gguf.name})", **{k: meta[k] for k in ("license", "language") if k in meta},
                "from": "the GGUF file's metadata"}
    if resolved.kind == "local":
        return {"name": Path(resolved.location).name, **_readme_metadata(Path(resolved.location) / "README.md"),
                "from": "the model folder"}
    return {"name": resolved.source, "from": "labkit's source string"}


def task_metrics(card: Any, verdict: dict[str, Any] | None = None) -> list[str]:
    """The metrics of the card's task: the primary metric and the guardrails the verdict judges (with the default
    stop_rate guardrail it added), then the catalogue's metrics for the answer format (`labkit.scoring.names.METRICS`:
    JSON metrics for a JSON card, category metrics for labels or a category key, the text metrics for text).
    Two-sided lengths are left out unless judged; run metrics and per_category_f1 (one value per category) are not
    model scores.

    Args:
        card: the card.
        verdict: the verdict.json the metrics were judged in (its guardrails' metrics), or None.
    Returns:
        metric names, judged ones first.
    """
    fmt = card.data.target_format
    needs = {"json": {"json"}, "label": {"category"}, "text": {"any"}}[fmt.kind]
    if getattr(fmt, "category_key", None):
        needs.add("category")
    judged = [card.experiment.target.primary_metric, *(g.metric for g in card.experiment.guardrails),
              *(g.get("metric") for g in (verdict or {}).get("guardrails", []))]
    described = [m for m, (need, _) in METRICS.items() if need in needs and m not in TWO_SIDED]
    return [m for m in dict.fromkeys([*judged, *described]) if m and m not in RUN_METRICS and m != "per_category_f1"]


def _results(info: dict[str, Any]) -> list[Any]:
    """The tuned model's task metrics as the Hub's eval results: validation, and test once it was opened."""
    dataset = getattr(info["card"].data.source, "hf", None) or f"labkit/{info['experiment']}"
    version = str((info["manifest"] or {}).get("data_version", "?"))[:12]
    out = []
    for split in ("validation", "test"):
        res = info["results"].get(split) or {}
        overall = (res.get("tuned") or {}).get("overall") or {}
        for metric in task_metrics(info["card"], res.get("verdict")):
            value = overall.get(metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out.append(EvalResult(task_type="text-generation", dataset_type=dataset,
                                      dataset_name=f"{info['experiment']} {split} split (data version {version})",
                                      dataset_split=split, metric_type=metric, metric_name=metric,
                                      metric_value=round(float(value), 6)))
    return out


def front_matter(info: dict[str, Any]) -> list[str]:
    """The model card's metadata header, `---` lines included.

    Args:
        info: the model card's information (labkit.export.model_card.render); uses "base", "card", "method",
            "results", "experiment", "run_id", "manifest".
    Returns:
        the header's lines.
    """
    base, card = info["base"], info["card"]
    described = base.get("described") or {}
    language = described.get("language")
    hub_data = getattr(card.data.source, "hf", None)
    hub = hub_base(base)
    relation = None if hub is None else "adapter" if info["method"] != "full" else "finetune"
    data = ModelCardData(
        base_model=hub["hub_id"] if hub else None, base_model_relation=relation,
        license=described.get("license"), language=language or None,
        datasets=[hub_data] if hub_data else None, pipeline_tag="text-generation",
        library_name="transformers" if info["method"] == "full" else "peft",
        tags=["labkit", info["method"], *(["lora"] if info["method"] == "qlora" else [])],
        model_name=f"{info['experiment']}/{card.experiment.variant}", eval_results=_results(info) or None)
    return ["---", *data.to_yaml().splitlines(), "---"]
