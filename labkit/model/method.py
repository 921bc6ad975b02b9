"""Apply the card's method (full, LoRA, QLoRA) and describe what is trainable.

The same function wraps the model for the parameter check (stage 03) and for training (stage 04),
so the check sees exactly what training will update.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import set_seed

from labkit.card.schema import Card, Lora
from labkit.card.experiment_and_data import Prompt
from labkit.errors import MethodError
from labkit.model.loading import sharded_loading


def kind_of(name: str) -> str:
    """A parameter's kind: the module name without layer numbers (model.layers.3.self_attn.q_proj.weight → self_attn.q_proj.weight)."""
    name = name.replace("base_model.model.", "")
    name = re.sub(r"\.(default|lora_A|lora_B)\.", lambda m: f".{m.group(1)}." if m.group(1) != "default" else ".", name)
    return re.sub(r"(^|\.)(layers|h|blocks)\.\d+\.", r"\1\2.*.", name)


def trainable_tokens(model: Any, prompt: Prompt) -> Any:
    """peft's `trainable_token_indices` for a `data.prompt.chat_template: chatml` card (`prompt`), else None.

    The ChatML tokens were added to a base model (`labkit.model.loading.resize_for_tokenizer`): their embedding rows
    and, when the LM head is not tied to the embeddings, their LM-head rows are trained and saved with the adapter.
    On the meta device (memory estimate) the last rows stand in for them: only their count matters there.
    """
    if prompt.format != "chat" or prompt.chat_template != "chatml":
        return None
    rows = model.get_input_embeddings().weight.shape[0]
    ids = list(getattr(model, "labkit_trainable_tokens", None) or [rows - 2, rows - 1])
    tied = bool(getattr(model.config.get_text_config(), "tie_word_embeddings", False))
    head = model.get_output_embeddings()
    if tied or head is None:
        return ids
    name_of = {id(m): n for n, m in model.named_modules()}
    return {name_of[id(model.get_input_embeddings())].rsplit(".", 1)[-1]: ids, name_of[id(head)].rsplit(".", 1)[-1]: ids}


def towers(model: Any) -> set[int]:
    """Ids of the parameters outside the text decoder and the LM head: a multimodal model's vision tower and projector
    (Gemma 3 4B and up load as Gemma3ForConditionalGeneration). labkit trains on text rows, which never run them.

    Args:
        model: a transformers model (not PEFT-wrapped).
    Returns:
        the parameter ids (empty for a text-only model).
    """
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if not isinstance(decoder, torch.nn.Module):
        return set()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    text = {id(p) for p in decoder.parameters()} | ({id(p) for p in head.parameters()} if head is not None else set())
    return {id(p) for p in model.parameters()} - text


def text_targets(model: Any, targets: Any) -> Any:
    """`method.target_modules` as PEFT gets it: "all-linear" on a model with a vision tower becomes one regular
    expression over the text decoder's linear layers (the tower's adapters would never move on text rows, and stage
    03's update check would rightly fail on them); anything else as the card says.

    Args:
        model: the base model (not PEFT-wrapped).
        targets: the card's target_modules.
    Returns:
        the target_modules for `LoraConfig`.
    """
    if targets != "all-linear" or model is None or not towers(model):
        return targets
    decoder = model.get_decoder()
    prefix = next(name for name, module in model.named_modules() if module is decoder)
    leaves = sorted({name.rsplit(".", 1)[-1] for name, module in decoder.named_modules()
                     if isinstance(module, torch.nn.Linear)})  # bitsandbytes' 4-bit layers are Linear subclasses
    return rf"{re.escape(prefix)}\..*\.(?:{'|'.join(map(re.escape, leaves))})"


def lora_config(method: Lora, prompt: Prompt, model: Any = None) -> Any:
    """The peft LoraConfig of a lora/qlora `method` (target_modules: names, "all-linear" — the text decoder's on a
    multimodal model, `text_targets` —, or one regex string; the ChatML rows of `trainable_tokens` for the card's
    `data.prompt` when the model is given)."""
    m = method
    tokens = trainable_tokens(model, prompt) if model is not None else None
    return LoraConfig(r=m.r, lora_alpha=m.alpha, lora_dropout=m.dropout, target_modules=text_targets(model, m.target_modules),
                      modules_to_save=m.modules_to_save or None, task_type="CAUSAL_LM", bias="none",
                      trainable_token_indices=tokens)


def trainer_checkpointing(card: Card) -> bool:
    """Whether the model (the trainer, or PEFT's k-bit preparation) checkpoints activations itself.

    `train.gradient_checkpointing` is carried out by exactly one layer: under `distributed.strategy: fsdp` it is FSDP's
    own (the accelerate config's `fsdp_activation_checkpointing`, `labkit.train.distributed`), as transformers 5.24
    refuses both at once ("can't both be set to True"); under ddp, deepspeed or one process it is the trainer's.

    Args:
        card: the card.
    Returns:
        True when the trainer's `activation_checkpointing` is on.
    """
    return card.train.gradient_checkpointing and card.distributed.strategy != "fsdp"


def keep_training_layout(model: Any) -> None:
    """Keep bitsandbytes' 4-bit weights in the layout training differentiates through.

    On a CPU with AVX512-BF16, bitsandbytes 0.50 converts a `Linear4bit` weight to an inference layout at its first
    forward in eval mode without grad (a validation pass) and keeps it: later training forwards then take a kernel
    with no backward, so no gradient flows through the 4-bit layers to the layers below them (adapters below a
    4-bit layer whose own update is still zero get none at all). A model that trains turns that conversion off.

    Raises:
        MethodError: a 4-bit layer already took the inference layout (an evaluation forward before the method).
    """
    for module in model.modules():
        if getattr(module, "support_avx512bf16_for_cpu", False):
            if getattr(getattr(module.weight, "quant_state", None), "packing_format_for_cpu", False):
                raise MethodError(f"{type(module).__name__} weights are already in bitsandbytes' CPU inference "
                                  "layout: apply the method before any evaluation forward")
            module.support_avx512bf16_for_cpu = False


def prepare_kbit(model: Any, card: Card) -> Any:
    """Prepare a 4-bit model for training as `method.quantisation.upcast` says, in the layout training needs
    (`keep_training_layout`).

    all: PEFT's `prepare_model_for_kbit_training` (every non-4-bit weight to float32, embeddings and LM head
    included). norms: the base frozen and only the normalisation weights in float32; the embeddings and the LM head
    keep the weights' dtype (the trainer enables activation checkpointing itself, non-reentrant, so no input-grad
    hook is needed). Checkpointing is `trainer_checkpointing`'s one layer (FSDP's own under strategy fsdp).
    """
    keep_training_layout(model)
    if card.method.quantisation.upcast == "all":
        return prepare_model_for_kbit_training(model, use_gradient_checkpointing=trainer_checkpointing(card))
    for name, param in model.named_parameters():
        param.requires_grad_(False)
        if "norm" in name and param.dtype in (torch.float16, torch.bfloat16):
            param.data = param.data.to(torch.float32)
    return model


def apply_method(model: Any, card: Card, meta: bool = False) -> Any:
    """Wrap or unfreeze the model as the card's method says.

    Args:
        model: the loaded base model (4-bit already for qlora).
        card: the card (method, train.gradient_checkpointing).
        meta: the model lives on the meta device (memory estimate): skip the k-bit preparation.
    Returns:
        the trainable model (a PeftModel for lora/qlora).
    Raises:
        MethodError: target modules match nothing, a module to save does not exist, or LoRA dropout on a mixture of
            experts' fused expert weights (PEFT refuses it).
    """
    method = card.method
    if method.kind == "full":
        frozen = towers(model)  # a vision tower stays frozen: text rows never run it
        for param in model.parameters():
            param.requires_grad_(id(param) not in frozen)
        return model

    set_seed(card.train.seed)  # LoRA's A matrices are drawn at random: the same card gives the same adapter init
    if method.kind == "qlora" and not meta:
        model = prepare_kbit(model, card)  # method.quantisation.upcast
    targets = method.target_modules
    config = lora_config(method, card.data.prompt, model)
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [m for m in method.modules_to_save if m not in names]
    if missing:
        raise MethodError(f"method.modules_to_save: no module named {', '.join(missing)} in {type(model).__name__}")
    linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m).__name__ in {"Linear", "Linear4bit"}})
    try:
        wrapped = get_peft_model(model, config)
    except ValueError as exc:
        said = str(exc).splitlines()[0]
        if "ParamWrapper does not work with lora_dropout" in said:  # LoRA on a parameter: a mixture of experts' experts
            raise MethodError(f"method.dropout: {method.dropout:g} with target_modules {targets!r}, which reaches this "
                              "mixture of experts' fused expert weights: PEFT's LoRA on a weight that is not a layer "
                              "takes no dropout; set method.dropout: 0, or name the attention's layers only (e.g. "
                              "[q_proj, k_proj, v_proj, o_proj])") from None
        raise MethodError(f"method.target_modules {targets!r}: {said} (linear modules of this model: "
                          f"{', '.join(linear)})") from None
    _expose_head_bias(wrapped)
    if sharded_loading() == "fsdp":
        rank0_buffers(wrapped)
    return wrapped


def rank0_buffers(model: Any) -> None:
    """Give every rank rank 0's values of the buffers some rank holds on the meta device (a collective: every rank of
    an FSDP run calls it after wrapping).

    Under FSDP's loading (`labkit.model.loading.load_model`) only rank 0 has the weights; a buffer copied from them
    when the method wraps the model (peft's trainable tokens keep the original ChatML rows) is on the meta device on
    the other ranks, and accelerate re-registers each rank's own non-persistent buffers after sharding, so they must
    be real and rank 0's.
    """
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    buffers = list(model.named_buffers())
    on_meta = torch.tensor([b.is_meta for _, b in buffers], dtype=torch.uint8, device=device)
    dist.all_reduce(on_meta, op=dist.ReduceOp.MAX)
    for (name, buffer), missing in zip(buffers, on_meta.tolist()):
        if not missing:
            continue
        value = buffer.to(device) if not buffer.is_meta else torch.empty(buffer.shape, dtype=buffer.dtype, device=device)
        dist.broadcast(value, src=0)
        if buffer.is_meta:  # the model waits on the CPU for FSDP to place it
            owner, _, leaf = name.rpartition(".")
            module = model.get_submodule(owner)
            module.register_buffer(leaf, value.to("cpu"), persistent=leaf not in module._non_persistent_buffers_set)


def _expose_head_bias(model: Any) -> None:
    """Give an LM head wrapped by peft's trainable tokens its `bias` attribute.

    peft 0.21's `TrainableTokensWrapper` answers `weight` (the merged rows) but not `bias`, and TRL's fused LM head
    (SFT on CUDA, DPO on any device) reads both. The wrapped layer's own bias (None, or Phi's bias vector) is set as a
    plain attribute: no parameter is registered twice, and the trained rows still come through `weight`.
    """
    head = model.get_output_embeddings()
    if type(head).__name__ == "TrainableTokensWrapper" and "bias" not in vars(head):
        base = head.token_adapter.base_layer
        object.__setattr__(head, "bias", getattr(base, "bias", None))


def parameter_table(model: Any) -> list[dict[str, Any]]:
    """Trainable and total parameters by kind, with dtypes.

    Args:
        model: the (wrapped) model.
    Returns:
        rows {"kind", "tensors", "parameters", "trainable", "dtype"} sorted by kind, then a "total" row.
    """
    groups: dict[str, dict[str, Any]] = defaultdict(lambda: {"tensors": 0, "parameters": 0, "trainable": 0, "dtype": set()})
    for name, param in model.named_parameters():
        group = groups[kind_of(name)]
        count = _numel(param)
        group["tensors"] += 1
        group["parameters"] += count
        group["trainable"] += count if param.requires_grad else 0
        group["dtype"].add(_dtype_name(param))
    rows = [{"kind": kind, **{k: v for k, v in g.items() if k != "dtype"}, "dtype": ",".join(sorted(g["dtype"]))}
            for kind, g in sorted(groups.items())]
    total = sum(r["parameters"] for r in rows)
    trainable = sum(r["trainable"] for r in rows)
    rows.append({"kind": "total", "tensors": sum(r["tensors"] for r in rows), "parameters": total,
                 "trainable": trainable, "dtype": ""})
    return rows


def _numel(param: Any) -> int:
    """Parameter count, undoing bitsandbytes' 4-bit packing (two values per byte)."""
    if type(param).__name__ == "Params4bit" and getattr(param, "quant_state", None) is not None:
        return int(param.quant_state.shape.numel())
    return param.numel()


def _dtype_name(param: Any) -> str:
    if type(param).__name__ == "Params4bit":
        quant = getattr(getattr(param, "quant_state", None), "quant_type", "4bit")
        return f"{quant}(4-bit)"
    return str(param.dtype).replace("torch.", "")


def matched_modules(model: Any) -> list[dict[str, Any]]:
    """Which module kinds carry LoRA adapters (or are fully trainable), and in how many layers: the linear layers, and
    a mixture of experts' fused expert weights (3-D, one matrix per expert) and any other weight PEFT adapts as a
    parameter (its `target_parameters`: the experts, the router's weight under `all-linear`), named
    `<module>.<parameter>`.

    Returns:
        rows {"module", "layers", "adapted"} per module kind.
    """
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {"layers": 0, "adapted": 0})
    weights: dict[str, bool] = {}  # "<module>.<parameter>" -> adapted, for weights that are not a Linear's
    for name, module in model.named_modules():
        if ".lora_" in name or "modules_to_save" in name:
            continue
        where, kind = name.replace(".base_layer", ""), type(module).__name__
        if kind == "ParamWrapper":  # PEFT's LoRA on a parameter (it wraps the module that owns it)
            weights[f"{where}.{module.parameter_name}"] = True
        elif kind in {"Linear", "Linear4bit", "Embedding"} and not name.endswith(".base_layer"):
            counts[_kind(where)]["layers"] += 1
            counts[_kind(where)]["adapted"] += int(hasattr(module, "lora_A") or any(p.requires_grad for p in module.parameters()))
        elif kind not in {"Linear", "Linear4bit", "Embedding"}:
            for pname, param in module.named_parameters(recurse=False):
                if param.dim() == 3 and where.endswith(".experts"):  # fused experts (transformers 5): not Linear
                    weights[f"{where}.{pname}"] = weights.get(f"{where}.{pname}", False) or param.requires_grad
    for where, adapted in weights.items():
        counts[_kind(where)]["layers"] += 1
        counts[_kind(where)]["adapted"] += int(adapted)
    return [{"module": k, **v} for k, v in sorted(counts.items())]


def _kind(name: str) -> str:
    """A module's kind: its name without the PEFT prefix and the layer number (model.layers.3.mlp.experts →
    mlp.experts)."""
    return re.sub(r"^.*?(layers|h|blocks)\.\d+\.", "", name.replace("base_model.model.", ""))


def trainable_names(model: Any) -> list[str]:
    """Names of the parameters that require gradients."""
    return [n for n, p in model.named_parameters() if p.requires_grad]
