"""What a card trains with on a given device: dtypes, precision, placement, attention, packing — decided from a profile.

`decide(card, profile)` reads only the card and a `labkit.core.device.DeviceProfile`, so every choice and every
refusal is tested on a CPU with recorded profiles of a T4, a 2×T4 box, an A100, an H100 and an MI300X.

- weights (`model.dtype: auto`): bfloat16 where the GPU runs it natively; on other GPUs (T4, V100) float16 for a
  frozen base (lora / qlora: PEFT keeps the adapters in float32) and float32 for full fine-tuning (the loss
  scaler needs float32 master weights); float32 on the CPU.
- training precision (`train.precision: auto`): bf16 where native, else fp16 with a loss scaler, fp32 on the CPU.
- 4-bit compute dtype (`method.quantisation.compute_dtype: auto`): bfloat16 where native, else float16.
- placement: several visible GPUs in one process (no launcher) train on one GPU, with a one-line note naming the
  `distributed` keys that use them all (TRL refuses the DataParallel that transformers would otherwise wrap).
- attention (`model.attn_implementation: auto`): sdpa; when packing on a GPU, flash_attention_2 (padding-free,
  variable-length kernels) where flash-attn is installed and the GPU supports it, else flex_attention (transformers
  builds the document mask on the GPU from the restarting position ids) on a GPU of compute capability ≥ 8.0 (flex
  attention's Triton kernels are not validated below: a T4 packs with sdpa and the block mask); labkit's 4D block
  mask where none applies (the CPU, MPS, a T4, an explicit sdpa / eager).
- the architecture (`for_architecture`, once the model's config is read): a kernel the architecture's transformers
  class has no implementation of (Gemma 2 and gpt-oss have no sdpa: softcapping, attention sinks) becomes eager
  attention under `auto` and is refused when the card names it; Phi (model_type `phi`) in float16 gets eager attention
  with float32 scores (`labkit.model.attention`), or a refusal of a fused kernel naming bf16 / fp32; a model whose
  activations overflow float16 (`FP16_RANGE`: Gemma 3, 3n and 4, gpt-oss, Qwen3.5, Qwen3-MoE, GLM-4-MoE) is refused
  any float16 (fp16 precision, float16 weights or 4-bit compute), in one line naming the keys to set to float32.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any

import transformers
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.utils import is_flash_attn_2_available, is_torch_flex_attn_available

from labkit.card.schema import Card, Method, Train
from labkit.core.device import DeviceProfile
from labkit.errors import CardError
from labkit.model.attention import FP32_SCORES

# largest allowed |packed − alone| of an example's mean loss, by the dtype the forward pass computes in: float32
# agrees to rounding (1e-4); float16 keeps 11 significant bits, bfloat16 8 (relative rounding 2^-8 ≈ 4e-3 per
# operation, accumulated over the layers), so a loss of a few nats differs by up to ~1e-2 / ~5e-2 between two
# mathematically equal computations with a different kernel or reduction order
PACK_TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
_PRECISION_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# architectures whose attention scores overflow float16 (Phi-1/1.5/2: transformers issues 28163, 28673)
FP16_OVERFLOW = ("phi",)
# architectures whose activations or gradients pass float16's range (65504) elsewhere too, so any float16 computation
# turns losses and gradients NaN: Gemma 3's activations reach ~8e5 (transformers issue 39972), Gemma 3n's and gpt-oss's
# overflow alike, Qwen3.5's gated delta-net layers, and Gemma 4's, Qwen3-MoE's and GLM-4-MoE's backward along the
# residual stream — the model types Unsloth never trains in float16 (unsloth-zoo's FORCE_FLOAT32, PR 866)
FP16_RANGE = ("gemma3", "gemma3_text", "gemma3n", "gemma3n_text", "gemma4", "gemma4_text", "gpt_oss", "qwen3_5",
              "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_moe", "glm4_moe", "glm4_moe_lite")


def _sm80(profile: DeviceProfile) -> bool:
    """A CUDA GPU of compute capability ≥ 8.0 (Ampere and later), where flex attention's kernels are validated."""
    return profile.type == "cuda" and profile.capability is not None and int(profile.capability.split(".")[0]) >= 8


@dataclass(frozen=True)
class Decisions:
    """What the card trains with on this device (recorded in the run; printed by stage 03); frozen, since `decide`
    hands the same decisions to every caller."""

    device: str
    weight_dtype: str
    precision: str
    loss_scaler: bool
    compute_dtype: str | None
    attention: str
    packing: str | None
    packing_tolerance: float | None
    gpus_visible: int
    gpus_used: int
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The decisions as plain data (notes as a list), as recorded in a run."""
        return {**asdict(self), "notes": list(self.notes)}


def attention_kernels() -> dict[str, bool]:
    """Which optional attention kernels this installation has: {"flash_attention_2", "flex_attention"}."""
    return {"flash_attention_2": bool(is_flash_attn_2_available()), "flex_attention": bool(is_torch_flex_attn_available())}


@lru_cache(maxsize=32)
def architecture_kernels(model_type: str | None) -> tuple[str, dict[str, bool]] | None:
    """The attention kernels the transformers class of a `model_type` implements.

    Args:
        model_type: the model config's `model_type` ("gemma2", "llama", …).
    Returns:
        (the causal-LM class name, {"sdpa", "flash_attention_2", "flex_attention": implemented}), or None for an
        architecture this transformers does not ship (remote code: its own class decides).
    """
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type or "")
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    if cls is None:
        return None
    return name, {"sdpa": cls._supports_sdpa is True, "flash_attention_2": cls._supports_flash_attn is True,
                  "flex_attention": cls._supports_flex_attn is True}


def _emulated(where: str, value: str, profile: DeviceProfile, fix: str) -> CardError:
    return CardError(f"{where}: {value} is emulated, not native, on {profile.name} ({profile.arch}; native bf16 needs "
                     f"CUDA compute capability ≥ 8.0 or an MI200/MI300 GPU), which makes it slow and can break Triton "
                     f"kernels; {fix}")


def _dtype(key: str, wanted: str, profile: DeviceProfile, fallback: str) -> str:
    """A dtype key resolved on a device: bfloat16 refused where it is emulated; `auto` is float32 on the CPU, bfloat16
    where the GPU runs it natively, else `fallback`."""
    if wanted == "bfloat16" and profile.is_gpu and not profile.native_bf16:
        raise _emulated(key, "bfloat16", profile, f"use auto ({fallback} here) or float16")
    if wanted != "auto":
        return wanted
    if not profile.is_gpu:
        return "float32"
    return "bfloat16" if profile.native_bf16 else fallback


def _weights(card: Card, profile: DeviceProfile) -> str:
    # full fine-tuning keeps fp32 master weights where bf16 is not native (fp16 weights cannot be unscaled)
    return _dtype("model.dtype", card.model.dtype, profile, "float32" if card.method.kind == "full" else "float16")


def _precision(train: Train, profile: DeviceProfile) -> str:
    """`train.precision` on this device: auto resolved; a mixed precision the device cannot run refused."""
    wanted = train.precision
    if wanted == "auto":
        return ("bf16" if profile.native_bf16 else "fp16") if profile.is_gpu else "fp32"
    if wanted != "fp32" and not profile.is_gpu:
        raise CardError(f"train.precision: {wanted} needs a CUDA GPU (this machine trains on {profile.device}); use "
                        "fp32 or auto")
    if wanted == "bf16" and not profile.native_bf16:
        raise _emulated("train.precision", "bf16", profile, "use auto (fp16 with a loss scaler here) or fp16")
    return wanted


def _compute_dtype(method: Method, profile: DeviceProfile) -> str | None:
    """The 4-bit layers' compute dtype of a qlora `method` on this device (None for any other method)."""
    if method.kind != "qlora":
        return None
    return _dtype("method.quantisation.compute_dtype", method.quantisation.compute_dtype, profile, "float16")


def _attention(card: Card, profile: DeviceProfile, weights: str, kernels: dict[str, bool]) -> tuple[str, str | None]:
    """(attn_implementation, packing mode: "padding_free" | "block_mask" | None)."""
    wanted = card.model.attn_implementation
    packing = card.train.packing
    flash_ok = kernels.get("flash_attention_2", False) and profile.is_gpu and weights != "float32" and (
        profile.native_bf16 or profile.type == "rocm")
    if wanted == "flash_attention_2" and not flash_ok:
        why = ("float32 weights (flash-attn computes in float16 / bfloat16)" if weights == "float32" and profile.is_gpu
               else f"the flash-attn package and a GPU of compute capability ≥ 8.0 (this machine: {profile.describe()})")
        raise CardError(f"model.attn_implementation: flash_attention_2 needs {why}; use auto or sdpa")
    if wanted == "flex_attention" and not kernels.get("flex_attention", False):
        raise CardError("model.attn_implementation: flex_attention needs torch ≥ 2.5 with flex attention; use auto or sdpa")
    if wanted != "auto":
        return wanted, (("padding_free" if wanted in ("flash_attention_2", "flex_attention") else "block_mask")
                        if packing else None)
    if not packing:
        return "sdpa", None
    if flash_ok:
        return "flash_attention_2", "padding_free"
    if _sm80(profile) and kernels.get("flex_attention", False):  # not validated below sm80 (a T4: sm_75)
        return "flex_attention", "padding_free"
    return "sdpa", "block_mask"


def decide(card: Card, profile: DeviceProfile, world_size: int | None = None,
           kernels: dict[str, bool] | None = None) -> Decisions:
    """Decide dtypes, precision, placement and attention for `card` on the machine `profile` describes.

    Computed once per (card, profile, world size, kernels) in a process: a card is frozen and hashable, so every
    later call (the loader, the trainer, the memory estimate) gets the same decisions back.

    Args:
        card: the card.
        profile: the device profile (captured, or recorded for a test).
        world_size: processes in this training (default: the WORLD_SIZE a launcher sets, else 1).
        kernels: the optional attention kernels installed (default: `attention_kernels()`; only read when packing
            or when the card names one).
    Returns:
        the decisions.
    Raises:
        CardError: a card key that cannot work on this device, in one line naming the key and the fix.
    """
    world_size = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1"))
    frozen = replace(profile, uuids=tuple(profile.uuids))  # hashable: the profile is part of the cache key
    return _decide(card, frozen, world_size, None if kernels is None else tuple(sorted(kernels.items())))


@lru_cache(maxsize=64)
def _decide(card: Card, profile: DeviceProfile, world_size: int,
            given_kernels: tuple[tuple[str, bool], ...] | None) -> Decisions:
    """`decide`, cached on its (hashable) arguments."""
    kernels = dict(given_kernels) if given_kernels is not None else None
    weights = _weights(card, profile)
    precision = _precision(card.train, profile)
    if card.method.kind == "full" and weights == "float16" and precision == "fp16":
        raise CardError(f"model.dtype: float16 weights with train.precision {card.train.precision} (fp16 on "
                        f"{profile.name}) for method full: the loss scaler refuses float16 trainable weights "
                        "(\"Attempting to unscale FP16 gradients\"); set model.dtype: float32 or auto")
    compute = _compute_dtype(card.method, profile)
    needs_kernels = card.train.packing or card.model.attn_implementation in ("flash_attention_2", "flex_attention")
    kernels = kernels if kernels is not None else (attention_kernels() if needs_kernels else {})
    attention, packing = _attention(card, profile, weights, kernels)
    d = card.distributed
    notes: list[str] = []
    if attention == "flex_attention" and profile.type == "cuda" and not _sm80(profile):
        notes.append(f"model.attn_implementation: flex_attention has not been validated below compute capability 8.0 "
                     f"({profile.name}, {profile.arch}); auto packs with sdpa and labkit's block mask here")
    gpus = profile.count if profile.is_gpu else 0
    used = min(gpus, 1)
    if profile.is_gpu and d.launcher == "accelerate":
        per_machine = max(1, d.num_processes // d.num_machines)  # the card's processes are machines × this
        if per_machine > gpus:
            over = f" over {d.num_machines} machines is {per_machine} per machine" if d.num_machines > 1 else ""
            raise CardError(f"distributed.num_processes: {d.num_processes}{over} but this machine has {gpus} GPU(s) "
                            f"({profile.describe()}); set num_processes: {gpus * d.num_machines}")
        used = 1 if world_size > 1 else per_machine  # per process when launched; this machine's share for the plan
    elif gpus > 1 and world_size == 1:
        notes.append(f"{gpus} GPUs visible ({profile.describe()}), training on cuda:0 only; to use all {gpus}, set "
                     f"distributed: {{launcher: accelerate, strategy: ddp, num_processes: {gpus}}}")
    dtypes = [_PRECISION_DTYPE[precision] if profile.is_gpu else weights, weights, compute or "float32"]
    tolerance = max(PACK_TOLERANCE[t] for t in dtypes) if card.train.packing else None
    return Decisions(device=profile.device, weight_dtype=weights, precision=precision, loss_scaler=precision == "fp16",
                     compute_dtype=compute, attention=attention, packing=packing, packing_tolerance=tolerance,
                     gpus_visible=gpus, gpus_used=used, notes=tuple(notes))


def for_architecture(made: Decisions, card: Card, model_type: str | None) -> Decisions:
    """The decisions for the model's architecture, once its config is read: Phi (`FP16_OVERFLOW`) computing in float16
    (fp16 training, float16 weights or a float16 4-bit compute dtype) gets eager attention with float32 scores
    (`labkit.model.attention.FP32_SCORES`) for `model.attn_implementation: auto | eager`; a fused kernel named in the
    card is refused.

    Args:
        made: `decide`'s decisions for the card on this device.
        card: the card.
        model_type: the model config's `model_type` ("phi", "llama", …), or None when unknown.
    Returns:
        `made`, or a copy with the attention (and the packing path: labkit's block mask) replaced and a note.
    Raises:
        CardError: a kernel named in the card that the architecture's class does not implement; sdpa,
            flash_attention_2 or flex_attention named for Phi in float16, in one line naming bf16 / fp32.
    """
    made = _implemented(made, card, model_type)
    if model_type in FP16_RANGE:
        _refuse_float16(made, card, model_type)
    float16 = "fp16" if made.precision == "fp16" else "float16" if "float16" in (made.weight_dtype,
                                                                                  made.compute_dtype) else None
    if model_type not in FP16_OVERFLOW or float16 is None or made.attention == FP32_SCORES:
        return made
    wanted = card.model.attn_implementation
    if wanted not in ("auto", "eager"):
        raise CardError(f"model.attn_implementation: {wanted} computes {model_type}'s attention scores in {float16}, "
                        "where they overflow to NaN (transformers issues 28163, 28673); set auto or eager (float32 "
                        "scores), or train in bf16 (a GPU of compute capability ≥ 8.0) or fp32 (train.precision, "
                        "model.dtype)")
    note = (f"{model_type} in {float16}: eager attention with float32 scores ({FP32_SCORES}), since its scores "
            "overflow float16 in sdpa / flash / flex; bf16 or fp32 would not need it")
    return replace(made, attention=FP32_SCORES, packing="block_mask" if made.packing else None,
                   notes=(*made.notes, note))


def _refuse_float16(made: Decisions, card: Card, model_type: str) -> None:
    """Refuse float16 anywhere in the step (precision, weights, 4-bit compute) for a model type in `FP16_RANGE`: one
    line naming each key that gives float16 (as written, or what `auto` gives on this device) and its float32 value."""
    quantisation = getattr(card.method, "quantisation", None)  # qlora's
    given = [(key, value, here, wanted) for key, value, here, wanted, used in (
        ("train.precision", card.train.precision, "fp16", "fp32", made.precision == "fp16"),
        ("model.dtype", card.model.dtype, "float16", "float32", made.weight_dtype == "float16"),
        ("method.quantisation.compute_dtype", quantisation and quantisation.compute_dtype, "float16", "float32",
         made.compute_dtype == "float16")) if used]
    if not given:
        return
    keys = ", ".join(f"{key}: {value}" + (f" ({here} here)" if value == "auto" else "") for key, value, here, _
                     in given)
    fix = ", ".join(f"{key}: {wanted}" for key, _, _, wanted in given)
    raise CardError(f"{keys}: {model_type} overflows float16 (activations or gradients past 65504: NaN losses and "
                    f"gradients, and a baseline scored on NaN logits); set {fix} (float32: slower, more activation "
                    "memory), or train in bf16 on a GPU of compute capability ≥ 8.0 (L4, A10G, A100, H100)")


def _implemented(made: Decisions, card: Card, model_type: str | None) -> Decisions:
    """`made` with an attention kernel the architecture's class implements: under `auto`, flash / flex packing falls
    back to sdpa with labkit's block mask and sdpa to eager (a note says so); a kernel named in the card is refused."""
    found = architecture_kernels(model_type)
    if found is None or made.attention not in found[1] or found[1][made.attention]:
        return made
    name, has = found
    there = ", ".join(["eager", *(k for k, ok in has.items() if ok)])
    if card.model.attn_implementation != "auto":
        raise CardError(f"model.attn_implementation: {made.attention} is not implemented for {name} in transformers "
                        f"{transformers.__version__} (it has {there}); set auto or one of those")
    attention = "sdpa" if made.attention != "sdpa" and has["sdpa"] else "eager"
    note = (f"{name} has no {made.attention} attention in transformers {transformers.__version__}: {attention}"
            + (" with labkit's block mask for packing" if made.packing else "")
            + (" (it keeps every attention score: more activation memory on long rows)" if attention == "eager" else ""))
    return replace(made, attention=attention, packing="block_mask" if made.packing else None,
                   notes=(*made.notes, note))


def one_gpu(args: Any, made: Decisions | dict[str, Any] | None) -> bool:
    """Pin a trainer's arguments to one GPU when several are visible to one process without a launcher.

    transformers' Trainer would wrap the model in DataParallel over every visible GPU, which TRL 1.16's SFTTrainer
    and DPOTrainer refuse in their constructors; ORPOTrainer is pinned alike, so every trainer places the same way.
    `args._n_gpu = 1` is what transformers itself sets for a model split with device_map. The decision follows
    `decide`'s profile (`gpus_visible`), so it is tested with recorded profiles; `args.n_gpu` is read first, which
    runs transformers' device set-up (it would otherwise overwrite the pin later). The one-line note naming the
    `distributed` keys is `decide`'s, printed when the model loads.

    Args:
        args: the trainer's TrainingArguments (SFTConfig, DPOConfig, ORPOConfig), before the trainer is built.
        made: the decisions for this process (`Decisions` or its `as_dict()`, e.g. `model.labkit_decisions`), or
            None (then only the GPUs transformers counts decide).
    Returns:
        True when the arguments were pinned to one GPU.
    """
    visible = (made.as_dict() if isinstance(made, Decisions) else made or {}).get("gpus_visible", 0)
    if max(args.n_gpu, visible) > 1 and args.world_size == 1:
        args._n_gpu = 1
        return True
    return False
