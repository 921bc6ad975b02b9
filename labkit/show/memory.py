"""How the memory estimate is shown: its terms as a table, the lines `labkit estimate` prints.

Each identifier key's display label is in `labkit.show.memory_labels`.
"""

from __future__ import annotations

from typing import Any

from labkit.preflight.export_memory import export_estimate, in_16_bits
from labkit.preflight.memory import GIB
from labkit.preflight.sizing import estimate_config, gpu_profile
from labkit.preflight.records import Layout, MemoryEstimate
from labkit.show.memory_labels import SHORT, label


def breakdown_rows(estimates: list[MemoryEstimate]) -> list[dict[str, Any]]:
    """The estimate's terms (GiB) per sequence length, and the phase that sets the peak (or why there is no estimate).

    Args:
        estimates: `labkit.preflight.memory.estimate_step` results, one per length.
    Returns:
        rows {"term": label, "<seq_len> tokens": GiB, …}.
    """
    if estimates and not estimates[0].get("modelled", True):
        return [{"term": estimates[0]["note"]}]
    rows = []

    def row(term: str, values: list[float]) -> None:
        rows.append({"term": term, **{f"{e['seq_len']} tokens": v / GIB for e, v in zip(estimates, values)}})

    for key in estimates[0]["breakdown"]:
        row(label(key), [e["breakdown"][key] for e in estimates])
    for key in estimates[0]["phases"]:
        row(f"phase: {label(key)} (above weights and optimiser states)", [e["phases"][key] for e in estimates])
    row("PEAK (weights + optimiser states + largest phase)", [e["peak_bytes"] for e in estimates])
    for key in estimates[0]["alternatives"]:
        row(f"alternative: {label(key)}", [e["alternatives"][key] for e in estimates])
    row("alternative: full logits, log-softmax and its gradient (an unfused loss)",
        [e["unfused_logits_bytes"] for e in estimates])
    return rows


HELD = ("weights_frozen", "weights_4bit", "trainable_parameters", "optimizer_states")  # beside every phase of a step


def _line(term: str, value: float, note: str = "", indent: int = 2) -> str:
    """One term of `labkit estimate`'s step: its label and GiB, aligned (nested lines indented further)."""
    return f"{' ' * indent}{label(term):<{34 - indent}} {value / GIB:8.2f} GiB{note}"


def step_lines(est: Any, overheads: dict[str, float], needed_bytes: float, gpu_memory_gib: float) -> list[str]:
    """`labkit estimate`'s terms of one GPU's peak, which add up to "needed": the weights, the optimiser states, the
    largest phase's terms, the margins; then the smaller phases in one line.

    Args:
        est: an `estimate_step` or `labkit.preflight.layouts.per_gpu` result.
        overheads: the GPU margins ({term id: bytes}).
        needed_bytes: the verdict's needed bytes (the peak and the margins).
        gpu_memory_gib: the GPU's memory.
    Returns:
        the lines, indented under the caller's heading.
    """
    phases, parts = est["phases"], est["phase_terms"]
    peak = max(phases, key=phases.get)
    lines = [_line(k, est["breakdown"][k]) for k in HELD if est["breakdown"].get(k)]
    lines.append(f"  largest phase, {label(peak)}:")
    lines += [_line(term, value, indent=4) for term, value in parts[peak].items() if value]
    lines += [_line(term, value, "  (margin)") for term, value in overheads.items()]
    lines.append(f"  {'needed':<32} {needed_bytes / GIB:8.2f} GiB of {gpu_memory_gib:g} GiB")
    others = [f"{label(k)} {v / GIB:.2f} GiB" for k, v in phases.items() if k != peak]
    return lines + [f"  (smaller phases: {'; '.join(others)})"] if others else lines


def unmodelled_lines(est: Any, gpu_memory_gib: float) -> tuple[list[str], bool]:
    """`labkit estimate`'s lines for an architecture the estimate does not model: what the config alone gives (the
    weights, the trainable parameters, the optimiser states), why the step is not estimated, and a mixture of experts'
    two costs (its fused experts are never 4-bit; LoRA on them keeps a merged copy of each layer's experts).

    Args:
        est: the `estimate_step` result (`modelled` false).
        gpu_memory_gib: the GPU's memory.
    Returns:
        (the lines, whether the weights and optimiser states alone already exceed the GPU).
    """
    known = {k: est["breakdown"][k] for k in HELD if est["breakdown"][k]}
    total = sum(known.values())
    lines = [_line(k, v) for k, v in known.items()]
    lines.append(f"  {'weights and optimiser states':<32} {total / GIB:8.2f} GiB of {gpu_memory_gib:g} GiB")
    lines.append(f"  the step's activations: not estimated: {est['note']}")
    experts, layers = est["experts"], est["shape"]["layers"]
    bits = round(8 * experts["bytes"] / experts["parameters"]) if experts["parameters"] else 0
    if experts["parameters"] and est["breakdown"]["weights_4bit"]:
        lines.append(f"  qlora: the {experts['parameters'] / 1e9:.2f} B fused expert weights stay in {bits}-bit "
                     f"({experts['bytes'] / GIB:.2f} GiB of the frozen weights): bitsandbytes quantises Linear layers, "
                     "and these are 3-D parameters" + ("; PEFT's k-bit preparation upcasts them "
                                                       "(method.quantisation.upcast: norms keeps them 16-bit)"
                                                       if bits == 32 else ""))
    if experts["parameters"] and experts["adapted"]:
        each = experts["bytes"] / layers
        lines.append(f"  LoRA on the fused experts keeps a merged copy of each layer's expert weights for the backward: "
                     f"{each / GIB:.2f} GiB per layer, {each * layers / GIB:.2f} GiB over {layers} layers without "
                     "activation checkpointing (method.target_modules without the experts avoids it)")
    return lines, total > gpu_memory_gib * GIB


def export_line(card: Any, card_path: Any, gpu_memory_gib: float, capability: str, config_path: str | None,
                sized: dict[str, Any]) -> str:
    """`labkit estimate`'s line on the export: its peak (merge and reload check) beside training's, and a float32
    merge's 16-bit alternative (`labkit export --dtype`) when it does not fit.

    Args:
        card, card_path, gpu_memory_gib, capability, config_path: as for `labkit.preflight.sizing.estimate_card`.
        sized: what `estimate_card` returned (training's estimate and verdict).
    Returns:
        the line.
    """
    d = card.distributed  # a machine of the card's processes, as `estimate_card` sizes it
    profile = gpu_profile(gpu_memory_gib, capability, count=max(1, d.num_processes // d.num_machines))
    config = estimate_config(card, card_path, config_path)
    need = export_estimate(config, card, sized["seq_len"], profile)
    margins = sum(sized["verdict"]["overheads"].values())
    total = need["peak_bytes"] + margins
    fits = "fits" if total <= gpu_memory_gib * GIB else "does not fit"
    other = in_16_bits(config, card, sized["seq_len"], profile, need) if fits != "fits" else None
    if other:  # a float32 run's adapter merged in 16 bits (`labkit export --dtype`)
        smaller, peak = other[0], other[1] + margins
        fits += (f"; in {smaller} (labkit export RUN --dtype {smaller}) {peak / GIB:.2f} GiB: "
                 + ("fits" if peak <= gpu_memory_gib * GIB else "does not fit"))
    return (f"export ({need['dtype']} merge and reload check, {need['phase']} phase): peak {need['peak_bytes'] / GIB:.2f} GiB "
            f"beside training's {sized['estimate']['peak_bytes'] / GIB:.2f} GiB; with the margins {total / GIB:.2f} GiB "
            f"of {gpu_memory_gib:g} GiB: {fits}")


def layout_text(layout: Layout) -> str:
    """A layout in words: "fsdp (full shard), 4 processes on 2 machines (2 per machine)"."""
    where = (f" on {layout['machines']} machines ({layout['per_machine']} per machine)" if layout["machines"] > 1
             else " on one machine")
    return label(layout["id"]) + ("" if layout["id"] == "single" else f", {layout['processes']} processes{where}")


def layout_lines(sized: dict[str, Any], gpu: str, gpu_memory_gib: float) -> list[str]:
    """`labkit estimate`'s lines on the layout: each GPU's memory by term, host memory under offload, the verdict
    per GPU, the layout that fits when this one does not, and the assumed scaling efficiency.

    Args:
        sized: `labkit.preflight.layouts.estimate_layout`'s result.
        gpu: the GPU's name ("L4", "16 GiB GPU").
        gpu_memory_gib: its memory.
    Returns:
        the lines (the verdict line included).
    """
    layout, each, verdict = sized["layout"], sized["per_gpu"], sized["layout_verdict"]
    lines = []
    if layout["id"] != "single":
        lines.append(f"per GPU under {layout_text(layout)}:")
        lines += step_lines(each, verdict["overheads"], verdict["needed_bytes"], gpu_memory_gib)
        if each["host_breakdown"]:
            moved = ", ".join(label(k) for k in each["host_breakdown"])
            lines.append(f"host memory per machine (CPU offload: {moved}): {each['host_bytes_per_machine'] / GIB:.2f} "
                         f"GiB for its {layout['per_machine']} process(es)")
    per = " per GPU" if layout["id"] != "single" else ""
    lines.append(f"verdict{per}: {'fits' if verdict['fits'] else 'does not fit'}: {verdict['message']}")
    if not verdict["fits"]:
        found = sized.get("fitting")
        lines.append(f"fits with {SHORT[found['layout']['id']]} on {found['layout']['processes']}× {gpu}"
                     + (f" ({found['layout']['machines']} machines)" if found["layout"]["machines"] > 1 else "")
                     + f": {found['needed_bytes'] / GIB:.2f} GiB per GPU" if found
                     else "no layout up to 64 GPUs fits: use qlora, a shorter max_length or a larger GPU")
    if layout["processes"] > 1:
        where = "across machines" if layout["machines"] > 1 else "within one machine (NVLink / PCIe)"
        lines.append(f"training time: an epoch's steps ÷ {layout['processes']} processes, each step "
                     f"÷ {sized['efficiency']:g} scaling efficiency (assumed, {where}; `labkit plan` uses a run's "
                     "measured seconds per step at this many processes)")
    return lines
