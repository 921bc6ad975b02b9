"""One step's memory on each GPU when several processes train the card: DDP, FSDP and DeepSpeed ZeRO, with offload.

`labkit.preflight.memory.estimate_step` counts one process holding everything. Under a layout of P processes
(`layout_of`: the card's `distributed` section, or `labkit estimate`'s overrides) each GPU holds (`per_gpu`):

- ddp: everything, replicated (the single-process estimate, with DDP's gradient buckets and NCCL's buffers as margins);
- fsdp (full shard): weights, gradients and optimiser states ÷ P, plus the gathered working set: one decoder layer's
  weights gathered whole while it runs (`GATHERED_LAYER`: the weights ÷ the layers, the embeddings' share included);
- zero2: gradients and optimiser states ÷ P, the weights replicated;
- zero3: weights too ÷ P, plus the gathered layer as under fsdp;
- offload cpu (zero2_offload, zero3_offload): the optimiser states' shard (and with ZeRO-3 the weights' shard) move
  to host memory: `host_bytes_per_machine` is that times the processes of one machine.

Activations and the loss head stay per GPU (each process runs its own micro-batch). With LoRA / QLoRA the frozen
base (4-bit codes under QLoRA) is what fsdp / zero3 shard; the adapter and its optimiser states are small either way.
Not counted: DeepSpeed's own communication buckets (its "auto" sizes are hidden² elements) and FSDP's prefetch of the
next layer; the margins (`labkit.preflight.sizing.overheads`) are added as for one process.
"""

from __future__ import annotations

from typing import Any

from labkit.card.schema import Card
from labkit.core.device import DeviceProfile
from labkit.errors import UsageError
from labkit.preflight.memory import GIB, estimate_step
from labkit.preflight.records import GATHERED_LAYER, FitVerdict, GpuEstimate, Layout, LayoutFit, MemoryEstimate
from labkit.preflight.scaling import scaling_efficiency
from labkit.preflight.sizing import NCCL_GIB, estimate_card, estimate_config, fit_verdict, gpu_profile, overheads
from labkit.preflight.sizing import paged_bytes

GPUS_PER_MACHINE = 8  # the most GPUs one rented machine offers (8 × A100 / H100 / L4): `fitting_layout` adds machines
WEIGHTS = ("weights_frozen", "weights_4bit", "trainable_parameters")
SHARD_WEIGHTS = ("fsdp", "zero3", "zero3_offload")
SHARD_STATES = ("fsdp", "zero2", "zero3", "zero2_offload", "zero3_offload")
CANDIDATES = ("fsdp", "zero2", "zero3", "zero2_offload", "zero3_offload")  # lightest first, for `fitting_layout`
_STRATEGY = {"ddp": ("ddp", 2, "none"), "fsdp": ("fsdp", 2, "none"), "zero2": ("deepspeed", 2, "none"),
             "zero3": ("deepspeed", 3, "none"), "zero2_offload": ("deepspeed", 2, "cpu"),
             "zero3_offload": ("deepspeed", 3, "cpu")}


def layout_of(card: Card, processes: int | None = None, machines: int | None = None,
              strategy: str | None = None) -> Layout:
    """The card's layout of training processes, with `labkit estimate`'s overrides.

    Args:
        card: the card (`distributed`: strategy, zero_stage, offload, num_processes, num_machines).
        processes: processes in all (overrides distributed.num_processes).
        machines: machines (overrides distributed.num_machines).
        strategy: a layout id (`LAYOUTS` less "single"; overrides the card's strategy). Without one, a card of one
            process given several trains with ddp.
    Returns:
        the `Layout`.
    Raises:
        UsageError: processes not a multiple of machines, or an unknown strategy.
    """
    d = card.distributed
    n = d.num_processes if processes is None else processes
    m = d.num_machines if machines is None else machines
    if strategy is not None and strategy not in _STRATEGY:
        raise UsageError(f"--strategy {strategy}: one of {', '.join(_STRATEGY)}")
    if n < 1 or m < 1 or n % m:
        raise UsageError(f"--processes {n} --machines {m}: processes count every machine's, so they must be a "
                         f"positive multiple of the machines (e.g. --processes {2 * m} --machines {m})")
    if strategy:
        made = strategy
    elif d.strategy == "deepspeed":
        made = f"zero{d.zero_stage}" + ("_offload" if d.offload == "cpu" else "")
    elif d.strategy in ("ddp", "fsdp"):
        made = d.strategy
    else:
        made = "single" if n == 1 else "ddp"
    return {"id": made, "processes": n, "machines": m, "per_machine": n // m}


def layout_card(card: Card, layout: Layout) -> Card:
    """The card with its `distributed` section set to the layout (for the margins that depend on the strategy)."""
    if layout["id"] == "single":
        return card
    strategy, stage, offload = _STRATEGY[layout["id"]]
    d = card.distributed.model_copy(update={"launcher": "accelerate", "strategy": strategy, "zero_stage": stage,
                                            "offload": offload, "num_processes": layout["processes"],
                                            "num_machines": layout["machines"]})
    return card.model_copy(update={"distributed": d})


def per_gpu(est: MemoryEstimate, layout: Layout) -> GpuEstimate:
    """One step's memory on each GPU under a layout (the module's docstring says what each strategy divides).

    Args:
        est: the single-process `estimate_step`.
        layout: from `layout_of`.
    Returns:
        the `GpuEstimate`; under single and ddp its breakdown, phases and peak are `est`'s own.
    """
    n, lid = layout["processes"], layout["id"]
    out = {**est["breakdown"], GATHERED_LAYER: 0.0}
    parts = {phase: dict(terms) for phase, terms in est["phase_terms"].items()}
    host: dict[str, float] = {}
    if lid in SHARD_STATES and n > 1:
        out["gradients"] = est["breakdown"]["gradients"] / n
        out["optimizer_states"] = est["breakdown"]["optimizer_states"] / n
        parts["optimizer_update"]["gradients"] = out["gradients"]
    if lid in SHARD_WEIGHTS and n > 1:
        out[GATHERED_LAYER] = est["weights_bytes"] / est["shape"]["layers"]
        for key in WEIGHTS:
            out[key] = est["breakdown"][key] / n
        for phase, terms in parts.items():
            if phase != "optimizer_update":
                terms[GATHERED_LAYER] = out[GATHERED_LAYER]
    phases = {phase: sum(terms.values()) for phase, terms in parts.items()}
    if lid.endswith("_offload"):
        host["optimizer_states"], out["optimizer_states"] = out["optimizer_states"], 0.0
        if lid == "zero3_offload":
            for key in WEIGHTS:
                host[key], out[key] = out[key], 0.0
    if lid in ("single", "ddp") or (n == 1 and not host):
        weights, step, peak = est["weights_bytes"], est["step_bytes"], est["peak_bytes"]
    else:
        weights = sum(out[k] for k in WEIGHTS)
        step = out["optimizer_states"] + max(phases.values())
        peak = weights + step
    return {"layout": layout, "breakdown": out, "phases": phases, "phase_terms": parts, "weights_bytes": weights,
            "step_bytes": step, "peak_bytes": peak, "optimizer": est["optimizer"], "host_breakdown": host,
            "host_bytes_per_machine": sum(host.values()) * layout["per_machine"]}


def gpu_overheads(card: Card, gpu: GpuEstimate, device: str | DeviceProfile, free_is_total: bool) -> dict[str, float]:
    """The GPU margins under a layout: `labkit.preflight.sizing.overheads` for its strategy, and NCCL's buffers
    under DeepSpeed with several processes.

    Args:
        card: the card; gpu: a `per_gpu` result; device, free_is_total: as for `overheads`.
    Returns:
        {term id: bytes}.
    """
    layout = gpu["layout"]
    terms = overheads(layout_card(card, layout), gpu, device, free_is_total)  # type: ignore[arg-type]
    if terms and layout["id"].startswith("zero") and layout["processes"] > 1:
        terms["nccl_buffers"] = NCCL_GIB * GIB
    return terms


def layout_verdict(config: Any, card: Card, seq_len: int, free_bytes: float, device: str | DeviceProfile,
                   layout: Layout, free_is_total: bool = False, est: MemoryEstimate | None = None) -> FitVerdict:
    """Does a step fit each GPU under a layout? Under single and ddp: `labkit.preflight.sizing.fit_verdict` itself.

    Args:
        config, card, seq_len, free_bytes, device, free_is_total: as for `fit_verdict`.
        layout: from `layout_of`.
        est: the single-process `estimate_step`, when already computed.
    Returns:
        the `FitVerdict`, per GPU (a sharded layout proposes no smaller micro-batch: `options` is empty).
    """
    if layout["id"] in ("single", "ddp"):
        return fit_verdict(config, layout_card(card, layout), seq_len, free_bytes, device, free_is_total=free_is_total)
    gpu = per_gpu(est or estimate_step(config, card, seq_len, device=device), layout)
    terms = gpu_overheads(card, gpu, device, free_is_total)
    needed = gpu["peak_bytes"] + sum(terms.values())
    paged = paged_bytes(gpu)  # type: ignore[arg-type]
    out = {"needed_bytes": needed, "overheads": terms, "paged_bytes": paged, "peak_bytes": gpu["peak_bytes"],
           "options": []}
    if needed <= free_bytes:
        return {**out, "fits": True, "spare_bytes": free_bytes - needed,
                "message": f"fits with {(free_bytes - needed) / GIB:.2f} GiB spare per GPU"}
    if needed - paged <= free_bytes:
        return {**out, "fits": True, "spare_bytes": free_bytes - needed + paged,
                "message": f"fits per GPU only with {paged / GIB:.2f} GiB of paged optimiser states paging out to "
                           "host memory (slower steps)"}
    return {**out, "fits": False, "spare_bytes": free_bytes - needed,
            "message": f"needs {needed / GIB:.2f} GiB per GPU of {free_bytes / GIB:.2f} GiB"}


def fitting_layout(config: Any, card: Card, seq_len: int, free_bytes: float, device: str | DeviceProfile,
                   free_is_total: bool = True, est: MemoryEstimate | None = None,
                   max_gpus: int = 64) -> LayoutFit | None:
    """The fewest GPUs (2, 4, 8, then whole machines of `GPUS_PER_MACHINE`) and, among layouts of that many, the
    lightest (`CANDIDATES`: fsdp, zero2, zero3, then with CPU offload) on which a step fits each GPU.

    Args:
        config, card, seq_len, free_bytes, device, free_is_total: as for `layout_verdict`.
        est: the single-process `estimate_step`, when already computed.
        max_gpus: the most GPUs tried.
    Returns:
        the `LayoutFit`, or None when nothing up to `max_gpus` fits.
    """
    est = est or estimate_step(config, card, seq_len, device=device)
    n = 2
    while n <= max_gpus:
        machines = max(1, -(-n // GPUS_PER_MACHINE))
        for lid in CANDIDATES:
            layout: Layout = {"id": lid, "processes": n, "machines": machines, "per_machine": n // machines}
            verdict = layout_verdict(config, card, seq_len, free_bytes, device, layout, free_is_total, est)
            if verdict["fits"]:
                return {"layout": layout, "needed_bytes": verdict["needed_bytes"]}
        n *= 2
    return None



def estimate_layout(card: Card, card_path: Any, gpu_memory_gib: float, capability: str = "8.0",
                    seq_len: int | None = None, config_path: str | None = None, layout: Layout | None = None,
                    name: str | None = None) -> dict[str, Any]:
    """`labkit estimate`: `labkit.preflight.sizing.estimate_card` (one process holding everything), and each GPU's
    memory and verdict under the layout; when it does not fit, the fewest GPUs and lightest layout that do.

    Args:
        card, card_path, gpu_memory_gib, capability, seq_len, config_path, name: as for `estimate_card`.
        layout: from `layout_of` (default: the card's).
    Returns:
        `estimate_card`'s dict with "layout", "per_gpu" (`GpuEstimate`), "layout_verdict" (`FitVerdict`, per GPU),
        "fitting" (`LayoutFit` or None; only computed when the layout does not fit) and "efficiency" (assumed); all
        None for an architecture the estimate does not model.
    """
    got = estimate_card(card, card_path, gpu_memory_gib, capability, seq_len, config_path, name=name)
    layout = layout or layout_of(card)
    if got["verdict"] is None:  # not modelled: nothing per GPU to divide
        return {**got, "layout": layout, "per_gpu": None, "layout_verdict": None, "fitting": None, "efficiency": None}
    config = estimate_config(card, card_path, config_path)
    d = card.distributed
    count = max(layout["per_machine"], d.num_processes // d.num_machines)  # a machine of them, one GPU each
    profile, free, est = gpu_profile(gpu_memory_gib, capability, count, name), gpu_memory_gib * GIB, got["estimate"]
    same = layout == layout_of(card)
    verdict = got["verdict"] if same and layout["id"] in ("single", "ddp") else \
        layout_verdict(config, card, got["seq_len"], free, profile, layout, True, est)
    fitting = None if verdict["fits"] else fitting_layout(config, card, got["seq_len"], free, profile, True, est)
    return {**got, "layout": layout, "per_gpu": per_gpu(est, layout), "layout_verdict": verdict, "fitting": fitting,
            "efficiency": scaling_efficiency(layout["processes"], layout["machines"])}
