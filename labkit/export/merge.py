"""The base an adapter is merged into, in the export dtype, on the device training used — and whether it fits there.

- qlora: the base is loaded in 4 bits exactly as training loaded it (`labkit.model.loading.load_model`), then
  dequantised by transformers (`PreTrainedModel.dequantize`, bitsandbytes' `dequantize_4bit` layer by layer) into
  the 4-bit compute dtype: the weights the adapter learned against, not the original ones. peft's own
  `merge_and_unload` on a 4-bit model would dequantise, add the delta and quantise the sum back into 4 bits
  (peft.tuners.lora.bnb.Linear4bit.merge); labkit merges into the dequantised 16-bit weights instead.
- lora: the base is loaded in the weights' dtype training used (bfloat16 / float16 on a GPU, float32 on the CPU).

The merged model is saved in that dtype (`labkit.preflight.export_memory.export_dtype`), or in the one
`labkit export --dtype` names: a qlora base's unquantised tensors are cast to it before the 4-bit layers are
dequantised (in the compute dtype, then cast, one layer at a time), so no whole float32 copy is ever held.

A multimodal qlora base (Gemma 3 4B and up) also had its vision tower and projector quantised, which text rows never
run: they take the checkpoint's own weights back (`restore_towers`), so merged/ reads images as the base does, not
through a 4-bit round trip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from huggingface_hub import snapshot_download
from peft import PeftModel
from safetensors import safe_open
from transformers import AutoConfig, GenerationConfig
from transformers.core_model_loading import revert_weight_conversion

from labkit.core import io
from labkit.errors import ExportRefused
from labkit.evaluate.generation import generate_answers
from labkit.evaluate.procedure import score_answers
from labkit.model.loading import load_model
from labkit.model.method import towers
from labkit.preflight.arms import release
from labkit.preflight.export_memory import check_dtype, export_dtype, export_estimate, in_16_bits, refusal
from labkit.preflight.measure import free_device_memory


def base_for_merge(resolved: Any, card: Any, device: str, dtype: str | None = None) -> Any:
    """The base model the adapter learned against, in the export dtype, on `device` (see the module docstring).

    Args:
        resolved: the resolved base model source.
        card: the card (method, quantisation, dtypes).
        device: the device training used ("cuda", "cpu").
        dtype: the export dtype asked for (`labkit export --dtype`), or None: the run's.
    Returns:
        the model, in eval mode, every tensor in the export dtype.
    """
    dtype = getattr(torch, export_dtype(card, device, dtype))
    if card.method.kind == "qlora":
        model = load_model(resolved, card, device)  # the 4-bit codes training used
        for param in model.parameters():  # embeddings, norms, a vision tower: in the export dtype before the layers grow
            if param.is_floating_point() and type(param).__name__ != "Params4bit":
                param.data = param.data.to(dtype)
        model = model.dequantize(dtype=dtype)  # nn.Linear in place of each Linear4bit, one at a time
        restore_towers(model, resolved)
    else:
        model = load_model(resolved, card, device, quantize=False)
    return model.to(dtype).eval()


def restore_towers(model: Any, resolved: Any) -> int:
    """Give a multimodal model's vision tower and projector (`labkit.model.method.towers`) the base checkpoint's own
    weights, read one tensor at a time under the names `save_pretrained` writes, cast to each parameter's dtype.

    Args:
        model: a dequantised qlora base (its towers' Linear layers came back from 4 bits).
        resolved: the resolved base model source (its safetensors: a local folder, or the hub cache for hf).
    Returns:
        the number of tensors restored (0 for a text-only model or a base without safetensors).
    """
    outside = towers(model)
    if not outside:
        return 0
    folder = (snapshot_download(resolved.location, revision=resolved.revision, local_files_only=True,
                                allow_patterns=["*.safetensors"]) if resolved.kind == "hf" else resolved.location)
    named = {name: param for name, param in model.named_parameters() if id(param) in outside}
    wanted = {disk: param for disk, param in revert_weight_conversion(model, named).items() if id(param) in outside}
    restored = 0
    for file in sorted(Path(folder).glob("*.safetensors")) if Path(folder).is_dir() else []:
        with safe_open(str(file), framework="pt") as handle:
            for name in set(handle.keys()) & set(wanted):
                param = wanted[name]
                param.data.copy_(handle.get_tensor(name).to(device=param.device, dtype=param.dtype))
                restored += 1
    return restored


def merge_to(adapter: Path, dest: Path, resolved: Any, card: Any, tokenizer: Any, base: dict[str, Any],
             device: str, dtype: str | None = None) -> str:
    """Merge an exported adapter into `base_for_merge` (peft `merge_and_unload`) and save it in the export dtype.

    Args:
        adapter: the export's adapter/ folder (its generation_config.json goes with the merged model).
        dest: the merged/ folder to write.
        resolved: the resolved base model source.
        card: the card.
        tokenizer: the exported tokenizer.
        base: labkit_base_model.json of the export.
        device: where to merge (the training device).
        dtype: the export dtype asked for, or None: the run's.
    Returns:
        the dtype name the merged weights are saved in.
    """
    model = base_for_merge(resolved, card, device, dtype)
    into = "the base weights as trained" if card.method.kind != "qlora" else "dequantised 4-bit weights" + (
        "; the vision tower and projector: the checkpoint's own (`restore_towers`)" if towers(model) else "")
    model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    model.generation_config = GenerationConfig.from_pretrained(str(adapter))
    model.save_pretrained(str(dest))
    tokenizer.save_pretrained(str(dest))
    io.write_json(dest / "labkit_base_model.json", {**base, "merged_from_adapter": True, "dtype": dtype,
                                                   "merged_into": into})
    del model
    release(device)
    return dtype


def ensure_fits(resolved: Any, card: Any, prompt_len: int, device: str, available: float | None = None,
                what: str = "the export", dtype: str | None = None, run_id: str = "RUN") -> dict[str, Any]:
    """State the export's memory need and refuse it when it does not fit in the device's free memory; a 16-bit merge
    that would fit (`labkit.preflight.export_memory.in_16_bits`) is named as the fix.

    Args:
        resolved: the resolved base model source (its config is read, no weights).
        card: the card.
        prompt_len: the longest evaluation prompt in tokens.
        device: the device the export runs on.
        available: free bytes to compare with (default: `labkit.preflight.measure.free_device_memory(device)`).
        what: what would run, for the line.
        dtype: the export dtype asked for (`labkit export --dtype`), or None: the run's.
        run_id: the run, for the command the refusal names.
    Returns:
        `labkit.preflight.export_memory.export_estimate` with "available_bytes" and "device" added.
    Raises:
        ExportRefused: one line with both numbers, before anything is loaded; float16 asked for an architecture
            that overflows it.
    """
    config = AutoConfig.from_pretrained(resolved.location, trust_remote_code=card.model.trust_remote_code,
                                        **resolved.from_pretrained_kwargs())
    check_dtype(dtype, config.model_type)
    kind = device.split(":")[0]
    need = export_estimate(config, card, prompt_len, kind, dtype)
    free = float(free_device_memory(device)) if available is None else float(available)
    if need["peak_bytes"] > free:
        other = in_16_bits(config, card, prompt_len, kind, need)
        raise ExportRefused(refusal(need["peak_bytes"], free, device, what, other if other and other[1] <= free else None,
                                    run_id))
    return {**need, "available_bytes": free, "device": device}


def score_merged(model: Any, tokenizer: Any, card: Any, rows: list[dict[str, Any]], adapter_answers: list[str]) -> dict[str, Any]:
    """Score the merged model on evaluation rows beside the unmerged adapter's answers (the run's) on the same rows.

    Called while the adapter is merged in place (peft `merge_adapter`: the weights of merged/), the rows are
    answered by the evaluation procedure (`labkit.evaluate.generation.generate_answers`) and both sets of answers
    are scored by the card's metrics (`labkit.evaluate.procedure.score_answers`).

    Args:
        model: a peft PeftModel on the base of `base_for_merge`, its adapter merged.
        tokenizer: the exported tokenizer.
        card: the card (its eval.max_new_tokens sized).
        rows: the evaluation rows checked, in order.
        adapter_answers: the run's answers to those rows (comparison/tuned_predictions.jsonl).
    Returns:
        {"split", "rows", "dtype", "merged": metrics, "adapter": metrics, "difference": {metric: merged − adapter},
         "changed_answers", "changed_examples"}.
    """
    answers = generate_answers(model, tokenizer, card, rows, desc="merged model: generating")
    merged = score_answers(card, rows, answers)[1]["overall"]
    adapter = score_answers(card, rows, adapter_answers)[1]["overall"]
    difference = {k: merged[k] - adapter[k] for k, v in merged.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(adapter.get(k), (int, float))}
    changed = [{"id": r["id"], "adapter": a, "merged": m} for r, a, m in zip(rows, adapter_answers, answers) if a != m]
    return {"split": card.eval.split, "rows": len(rows), "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "merged": merged, "adapter": adapter, "difference": difference, "changed_answers": len(changed),
            "changed_examples": changed[:3]}
