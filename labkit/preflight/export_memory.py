"""Memory of `labkit export`: the 16-bit merge and the reload check, on the device training used.

The export runs in two phases, one model in memory at a time:

- reload: the base loaded as training loaded it (4-bit for qlora, the training dtype otherwise) with the adapter,
  regenerating the evaluation's answers (weights + KV cache + last-position logits, as
  `labkit.preflight.memory.estimate_generation` counts them);
- merge: the base in the export dtype (`export_dtype`: the 4-bit compute dtype for qlora, else the weights' dtype),
  for qlora dequantised from its 4-bit codes layer by layer (the codes of the layers not yet dequantised coexist
  with the 16-bit ones: counted whole), the adapter, the merged-vs-unmerged logits of one evaluation batch (the
  model's logits, the unmerged float32 copy kept while the merged one is computed, `COMPARE_ROWS` rows of a batch at
  a time) and the scoring of the merged model (a second generation).

`export_estimate` is what `labkit estimate` prints beside training's peak and what the export and its reload check
compare with the device's free memory before they start. `labkit export --dtype` merges in another dtype than that
default: a float32 run's adapter merged in 16 bits (`smaller_dtype`) when the float32 merge does not fit — a QLoRA
run with float32 compute (Gemma 3 on a T4, which float16 overflows) needs its whole base in float32 for the merge.
"""

from __future__ import annotations

from typing import Any

from labkit.card.schema import Card
from labkit.core.device import DeviceProfile
from labkit.errors import ExportRefused
from labkit.model.loading import decisions
from labkit.model.placement import FP16_RANGE, decide
from labkit.preflight.memory import _BYTES, GIB, Shape, meta_model, parameter_bytes, shape_of, weight_dtype


def export_dtype(card: Card, device: str | DeviceProfile, dtype: str | None = None) -> str:
    """The dtype an export merges and saves in: `dtype` when given (`labkit export --dtype`), else the 4-bit compute
    dtype of a qlora card (the dtype its adapter learned against), else the dtype the weights loaded in for training
    (`labkit.model.placement.decide`).

    Args:
        card: the card.
        device: a device of this machine ("cuda", "cpu") or a device profile.
        dtype: the dtype asked for, or None.
    Returns:
        the dtype name ("bfloat16", "float16", "float32").
    """
    if dtype:
        return dtype
    if isinstance(device, DeviceProfile):
        made = decide(card, device, world_size=1, kernels={})
    else:
        made = decisions(card, device)  # the decisions (and notes) of this process
    return made.compute_dtype or made.weight_dtype

COMPARE_ROWS = 1  # the merged-vs-unmerged logits are compared this many rows of a batch at a time


def _generation(shape: Shape, batch: int, prompt_len: int, new_tokens: int, nbytes: int) -> int:
    """Generation's memory above the weights, as `labkit.preflight.memory.estimate_generation` counts it: KV cache,
    last-position logits and their float32 copy, one layer's prefill transient."""
    kv_cache = 2 * shape.layers * shape.kv * (prompt_len + new_tokens) * batch * nbytes
    return kv_cache + batch * shape.vocab * 4 * 2 + batch * prompt_len * (2 * shape.hidden + 2 * shape.intermediate) * nbytes


def export_estimate(config: Any, card: Card, prompt_len: int, device: str | DeviceProfile = "cpu",
                    dtype: str | None = None) -> dict[str, Any]:
    """Peak memory of the export's phases (see the module docstring).

    Args:
        config: the base model's transformers config.
        card: the card (method, eval.batch_size, eval.max_new_tokens).
        prompt_len: the longest evaluation prompt in tokens (`data.max_length` before the data is known); the
            answers' `eval.max_new_tokens` (`data.max_length` while stage 01 has not sized it).
        device: the device (string) or a device profile.
        dtype: the merge's dtype (`export_dtype`'s `dtype`).
    Returns:
        {"dtype", "reload_bytes", "merge_bytes", "peak_bytes", "phase" (the larger), "breakdown": {term: bytes}}.
    """
    dtype = export_dtype(card, device, dtype)
    shape = shape_of(config)
    nbytes = _BYTES[dtype]
    loaded = _BYTES[weight_dtype(card, device)]
    model = meta_model(config, card)
    params = parameter_bytes(model, card, loaded)
    numel = sum(p.numel() for name, p in model.named_parameters() if ".lora_" not in name and "trainable_tokens" not in name)
    quantised = params["quantised_bytes"]
    # at evaluation nothing is upcast: the norms-only count is the closest (and still an upper bound)
    eval_weights = quantised + params["frozen_bytes_upcast"]["norms"] + params["trainable_bytes"]
    new_tokens = card.eval.max_new_tokens or card.data.max_length
    reload = eval_weights + _generation(shape, card.eval.batch_size, prompt_len, new_tokens, loaded)
    weights16 = numel * nbytes
    b = card.eval.batch_size
    logits = COMPARE_ROWS * prompt_len * shape.vocab * (nbytes + 2 * 4)  # the model's logits, two float32 copies
    scoring = _generation(shape, b, prompt_len, new_tokens, nbytes)
    breakdown = {"weights_export_dtype": weights16, "adapter": params["trainable_bytes"], "quantised_codes": quantised,
                 "logits_comparison": logits, "generation": scoring}
    merge = weights16 + max(quantised, params["trainable_bytes"] + max(logits, scoring))
    return {"dtype": dtype, "reload_bytes": reload, "merge_bytes": merge, "peak_bytes": max(reload, merge),
            "phase": "merge" if merge >= reload else "reload", "breakdown": breakdown, "prompt_len": prompt_len}


def smaller_dtype(dtype: str, model_type: str | None) -> str | None:
    """The 16-bit dtype a float32 export could merge in instead: float16, whose 11 significant bits keep more of the
    adapter's update than bfloat16's 8 (the quickstart's merge: logits within 0.34 in float16, 3.1 in bfloat16, against
    a tolerance of 2.3), except for the architectures that overflow float16 (`FP16_RANGE`): bfloat16, emulated and
    slower on a GPU without native bf16 such as a T4.

    Args:
        dtype: the export dtype.
        model_type: the base config's `model_type`.
    Returns:
        the dtype name, or None when `dtype` is already 16-bit.
    """
    if dtype != "float32":
        return None
    return "bfloat16" if model_type in FP16_RANGE else "float16"


def in_16_bits(config: Any, card: Card, prompt_len: int, device: str | DeviceProfile,
               need: dict[str, Any]) -> tuple[str, int] | None:
    """The 16-bit merge (`smaller_dtype`) a float32 export could run instead, and its peak.

    Args:
        config, card, prompt_len, device: as for `export_estimate`.
        need: `export_estimate`'s result in the export dtype.
    Returns:
        (dtype, peak bytes), or None when the export is already 16-bit.
    """
    smaller = smaller_dtype(need["dtype"], getattr(config, "model_type", None))
    return (smaller, export_estimate(config, card, prompt_len, device, smaller)["peak_bytes"]) if smaller else None


def check_dtype(dtype: str | None, model_type: str | None) -> None:
    """Refuse an export dtype the architecture cannot compute in: float16 for a model type in `FP16_RANGE`.

    Args:
        dtype: `labkit export --dtype`, or None (the run's own dtype, already checked before training).
        model_type: the base config's `model_type`.
    Raises:
        ExportRefused: one line naming --dtype and the dtypes that work.
    """
    if dtype == "float16" and model_type in FP16_RANGE:
        raise ExportRefused(f"--dtype float16: {model_type} overflows float16 (activations past 65504: NaN logits, and "
                            "the reload check would compare NaN); use --dtype bfloat16 or float32")


def refusal(needed_bytes: float, available_bytes: float, device: str, what: str = "the export",
            alternative: tuple[str, float] | None = None, run_id: str = "RUN") -> str | None:
    """The one-line refusal when `needed_bytes` do not fit in `available_bytes`, else None.

    Args:
        needed_bytes: `export_estimate(...)["peak_bytes"]`.
        available_bytes: the device's free memory.
        device: the device, for the line.
        what: what would run.
        alternative: (dtype, bytes) of a 16-bit merge that fits (`smaller_dtype`), named as the first fix.
        run_id: the run, for that fix's command.
    Returns:
        the line, or None when it fits.
    """
    if needed_bytes <= available_bytes:
        return None
    fix = (f"merge in {alternative[0]} (labkit export {run_id} --dtype {alternative[0]}: {alternative[1] / GIB:.2f} GiB), "
           if alternative else "")
    return (f"{what} needs {needed_bytes / GIB:.2f} GiB on {device} (merge and reload check) but "
            f"{available_bytes / GIB:.2f} GiB are free — {fix}free memory on {device}, or export on a device with more")
