"""Device profiles → decisions: dtypes, precision, placement, attention and packing for a T4, a 2×T4 box, an A100, an
H100, an MI300X and the CPU, from recorded profiles (no GPU needed), with every refusal's message."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.core.device import DeviceProfile, cpu_profile, load_profile
from labkit.errors import CardError
from labkit.model.attention import FP32_SCORES
from labkit.model.placement import PACK_TOLERANCE, architecture_kernels, decide, for_architecture, one_gpu

PROFILES = Path(__file__).resolve().parent.parent / "core" / "profiles"
NONE = {"flash_attention_2": False, "flex_attention": False}
FLEX = {"flash_attention_2": False, "flex_attention": True}
BOTH = {"flash_attention_2": True, "flex_attention": True}


def profile(name: str) -> DeviceProfile:
    return load_profile(PROFILES / f"{name}.json")


def card(kind: str = "lora", **keys):
    """The quickstart card with `method.kind` and dotted keys changed (validated like a card file)."""
    loaded = load_card(REPO / "params" / "quickstart.yaml").card
    data = loaded.model_dump()
    data["method"] = {"kind": kind} if kind == "full" else {**{"kind": kind}, "r": 8}
    data["model"]["dtype"], data["train"]["precision"] = "auto", "auto"  # the quickstart states float32 / fp32
    for dotted, value in keys.items():
        section, key = dotted.split("__")
        data[section][key] = value
    return type(loaded).model_validate(data)


def test_native_bf16_is_read_from_the_hardware_not_from_emulation() -> None:
    assert [profile(n).native_bf16 for n in ("t4", "2xt4", "a100", "h100", "mi300x")] == [False, False, True, True, True]
    # ROCm reports a compute capability too (9.0 on an MI50, gfx906): it does not count, the architecture does
    mi50 = DeviceProfile(type="rocm", name="AMD Instinct MI50", capability="9.0", arch="gfx906:sramecc+:xnack-")
    assert not mi50.native_bf16 and not cpu_profile().native_bf16
    assert DeviceProfile.from_dict(profile("mi300x").as_dict()) == profile("mi300x")


@pytest.mark.parametrize("name, weights, precision, compute", [
    ("t4", "float16", "fp16", "float16"), ("2xt4", "float16", "fp16", "float16"),
    ("a100", "bfloat16", "bf16", "bfloat16"), ("h100", "bfloat16", "bf16", "bfloat16"),
    ("mi300x", "bfloat16", "bf16", "bfloat16")])
def test_auto_precision_and_qlora_compute_dtype(name, weights, precision, compute) -> None:
    made = decide(card("qlora"), profile(name), world_size=1, kernels=NONE)
    assert (made.weight_dtype, made.precision, made.compute_dtype) == (weights, precision, compute)
    assert made.loss_scaler == (precision == "fp16") and made.device == "cuda"


def test_cpu_trains_in_float32() -> None:
    made = decide(card("qlora"), cpu_profile(), world_size=1, kernels=NONE)
    assert (made.device, made.weight_dtype, made.precision, made.compute_dtype, made.loss_scaler) == (
        "cpu", "float32", "fp32", "float32", False)


def test_full_fine_tuning_keeps_float32_master_weights_under_fp16() -> None:
    made = decide(card("full"), profile("t4"), world_size=1, kernels=NONE)
    assert (made.weight_dtype, made.precision, made.loss_scaler) == ("float32", "fp16", True)
    assert decide(card("full"), profile("a100"), world_size=1, kernels=NONE).weight_dtype == "bfloat16"


def test_fp16_weights_for_full_fine_tuning_are_refused() -> None:
    with pytest.raises(CardError, match=r"^model.dtype: float16 weights with train.precision auto \(fp16 on Tesla T4\) "
                       r"for method full: the loss scaler refuses float16 trainable weights \(\"Attempting to unscale "
                       r"FP16 gradients\"\); set model.dtype: float32 or auto$"):
        decide(card("full", model__dtype="float16"), profile("t4"), world_size=1, kernels=NONE)
    # stated outright in the card, it is refused when the card is read, on any machine
    with pytest.raises(ValueError, match="train.precision: fp16 with model.dtype: float16 and method full .*"
                       "Attempting to unscale FP16 gradients.*set model.dtype: float32"):
        card("full", model__dtype="float16", train__precision="fp16")


@pytest.mark.parametrize("keys, where, fix", [
    ({"train__precision": "bf16"}, "train.precision", "use auto \\(fp16 with a loss scaler here\\) or fp16"),
    ({"model__dtype": "bfloat16"}, "model.dtype", "use auto \\(float16 here\\) or float16"),
])
def test_emulated_bf16_is_refused_on_a_t4(keys, where, fix) -> None:
    with pytest.raises(CardError, match=rf"^{where}: bf(loat)?16 is emulated, not native, on Tesla T4 \(sm_75; native "
                       rf"bf16 needs CUDA compute capability ≥ 8.0 or an MI200/MI300 GPU\).*; {fix}$"):
        decide(card("lora", **keys), profile("t4"), world_size=1, kernels=NONE)
    decide(card("lora", **keys), profile("a100"), world_size=1, kernels=NONE)  # native there


def test_bf16_4bit_compute_is_refused_on_a_t4() -> None:
    c = updated(card("qlora"), {"method.quantisation.compute_dtype": "bfloat16"})
    with pytest.raises(CardError, match="^method.quantisation.compute_dtype: bfloat16 is emulated.*use auto "
                       "\\(float16 here\\) or float16$"):
        decide(c, profile("t4"), world_size=1, kernels=NONE)
    assert decide(c, profile("mi300x"), world_size=1, kernels=NONE).compute_dtype == "bfloat16"


def test_mixed_precision_on_the_cpu_is_refused() -> None:
    with pytest.raises(CardError, match="^train.precision: fp16 needs a CUDA GPU \\(this machine trains on cpu\\); "
                       "use fp32 or auto$"):
        decide(card("lora", train__precision="fp16"), cpu_profile(), world_size=1, kernels=NONE)


def test_two_gpus_without_a_launcher_train_on_one_with_a_note() -> None:
    made = decide(card("lora"), profile("2xt4"), world_size=1, kernels=NONE)
    assert (made.gpus_visible, made.gpus_used) == (2, 1)
    assert made.notes == ("2 GPUs visible (2 × Tesla T4 (cuda, sm_75, 14.74 GiB each)), training on cuda:0 only; to "
                          "use all 2, set distributed: {launcher: accelerate, strategy: ddp, num_processes: 2}",)
    assert decide(card("lora"), profile("t4"), world_size=1, kernels=NONE).notes == ()


def test_trainer_arguments_drive_one_gpu_when_two_are_visible_without_a_launcher(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    def args() -> TrainingArguments:  # this process: no launcher (world size 1), on the CPU (n_gpu 0)
        return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")

    pinned = args()
    assert one_gpu(pinned, decide(card("lora"), profile("2xt4"), world_size=1, kernels=NONE)) is True
    assert pinned.n_gpu == 1 and pinned.world_size == 1  # what transformers sets for a device_map model: no DataParallel
    as_stamped = args()  # the dict load_model stamps on the model (model.labkit_decisions)
    assert one_gpu(as_stamped, decide(card("lora"), profile("2xt4"), world_size=1, kernels=NONE).as_dict())
    for name in ("t4", "h100", "cpu"):
        kept = args()
        made = decide(card("lora"), cpu_profile() if name == "cpu" else profile(name), world_size=1, kernels=NONE)
        assert one_gpu(kept, made) is False and kept.n_gpu == 0  # one GPU (or none): nothing to pin
    assert one_gpu(args(), None) is False


def test_ddp_over_both_gpus_when_the_card_asks() -> None:
    made = decide(card("lora", distributed__launcher="accelerate", distributed__strategy="ddp",
                       distributed__num_processes=2), profile("2xt4"), world_size=1, kernels=NONE)
    assert made.gpus_used == 2 and made.notes == ()
    launched = decide(card("lora", distributed__launcher="accelerate", distributed__strategy="ddp",
                           distributed__num_processes=2), profile("2xt4"), world_size=2, kernels=NONE)
    assert launched.gpus_used == 1 and launched.notes == ()  # each launched process drives one GPU
    with pytest.raises(CardError, match=r"^distributed.num_processes: 4 but this machine has 2 GPU\(s\) \(2 × Tesla T4 "
                       r".*\); set num_processes: 2$"):
        decide(card("lora", distributed__launcher="accelerate", distributed__strategy="ddp",
                    distributed__num_processes=4), profile("2xt4"), world_size=1, kernels=NONE)
    two = dict(distributed__launcher="accelerate", distributed__strategy="ddp", distributed__num_machines=2)
    assert decide(card("lora", distributed__num_processes=4, **two), profile("2xt4"), world_size=1,
                  kernels=NONE).gpus_used == 2  # 2 machines × 2 processes: this machine drives its 2 GPUs
    with pytest.raises(CardError, match=r"^distributed.num_processes: 8 over 2 machines is 4 per machine but this "
                       r"machine has 2 GPU\(s\) .*; set num_processes: 4$"):
        decide(card("lora", distributed__num_processes=8, **two), profile("2xt4"), world_size=1, kernels=NONE)


@pytest.mark.parametrize("name, kernels, attention, path", [
    ("cpu", BOTH, "sdpa", "block_mask"),  # the CPU keeps labkit's 4D block mask
    ("t4", NONE, "sdpa", "block_mask"),  # no flex attention: the 4D mask
    ("t4", FLEX, "sdpa", "block_mask"),  # flex attention is not chosen below sm80 (not validated on sm_75)
    ("t4", BOTH, "sdpa", "block_mask"),  # flash-attn 2 does not run on sm_75, flex is not chosen there
    ("a100", BOTH, "flash_attention_2", "padding_free"),
    ("h100", FLEX, "flex_attention", "padding_free"),
    ("mi300x", BOTH, "flash_attention_2", "padding_free"),
    ("mi300x", FLEX, "sdpa", "block_mask"),  # flex attention is not chosen on ROCm
])
def test_attention_when_packing(name, kernels, attention, path) -> None:
    p = cpu_profile() if name == "cpu" else profile(name)
    made = decide(card("lora", train__packing=True), p, world_size=1, kernels=kernels)
    assert (made.attention, made.packing) == (attention, path)
    unpacked = decide(card("lora"), p, world_size=1, kernels=kernels)
    assert (unpacked.attention, unpacked.packing, unpacked.packing_tolerance) == ("sdpa", None, None)


def test_flex_attention_named_in_the_card_below_sm80_gets_a_note() -> None:
    flex = card("lora", model__attn_implementation="flex_attention", train__packing=True)
    made = decide(flex, profile("t4"), 1, FLEX)
    assert (made.attention, made.packing) == ("flex_attention", "padding_free")
    assert made.notes == ("model.attn_implementation: flex_attention has not been validated below compute capability "
                          "8.0 (Tesla T4, sm_75); auto packs with sdpa and labkit's block mask here",)
    assert decide(card("lora", model__attn_implementation="flex_attention"), profile("h100"), 1, FLEX).notes == ()


@pytest.mark.parametrize("name, keys", [
    ("t4", {}), ("t4", {"method__kind": "qlora"}), ("a100", {"train__precision": "fp16"}),
    ("cpu", {"model__dtype": "float16"}), ("t4", {"model__attn_implementation": "eager"})])
def test_phi_in_float16_gets_eager_attention_with_float32_scores(name, keys) -> None:
    kind = keys.pop("method__kind", "lora")
    c = card(kind, train__packing=True, **keys)
    made = decide(c, cpu_profile() if name == "cpu" else profile(name), world_size=1, kernels=BOTH)
    phi = for_architecture(made, c, "phi")
    assert (phi.attention, phi.packing) == (FP32_SCORES, "block_mask")  # labkit's mask: never the padding-free path
    assert phi.notes[-1].startswith("phi in f") and "float32 scores" in phi.notes[-1]
    assert for_architecture(made, c, "llama") is made and for_architecture(phi, c, "phi") is phi


def test_phi_in_bf16_or_fp32_keeps_its_kernel() -> None:
    for name, p in (("a100", profile("a100")), ("cpu", cpu_profile())):
        made = decide(card("lora"), p, world_size=1, kernels=NONE)
        assert for_architecture(made, card("lora"), "phi") is made, name


@pytest.mark.parametrize("kernel", ["sdpa", "flash_attention_2", "flex_attention"])
def test_a_fused_kernel_for_phi_in_float16_is_refused_naming_bf16_and_fp32(kernel) -> None:
    c = card("lora", model__attn_implementation=kernel, train__precision="fp16")
    made = decide(c, profile("a100"), world_size=1, kernels=BOTH)
    with pytest.raises(CardError, match=rf"^model.attn_implementation: {kernel} computes phi's attention scores in "
                       r"fp16, "
                       r"where they overflow to NaN .*set auto or eager \(float32 scores\), or train in bf16 .* or "
                       r"fp32 \(train.precision, model.dtype\)$"):
        for_architecture(made, c, "phi")


def test_attention_named_in_the_card() -> None:
    made = decide(card("lora", model__attn_implementation="sdpa", train__packing=True), profile("a100"), 1, BOTH)
    assert (made.attention, made.packing) == ("sdpa", "block_mask")
    with pytest.raises(CardError, match=r"^model.attn_implementation: flash_attention_2 needs the flash-attn package "
                       r"and a GPU of compute capability ≥ 8.0 \(this machine: 1 × Tesla T4 .*\); use auto or sdpa$"):
        decide(card("lora", model__attn_implementation="flash_attention_2"), profile("t4"), 1, BOTH)
    with pytest.raises(CardError, match=r"^model.attn_implementation: flash_attention_2 needs float32 weights"):
        decide(card("full", model__attn_implementation="flash_attention_2", model__dtype="float32"),
               profile("a100"), 1, BOTH)
    with pytest.raises(CardError, match="^model.attn_implementation: flex_attention needs torch ≥ 2.5"):
        decide(card("lora", model__attn_implementation="flex_attention"), profile("h100"), 1, NONE)


@pytest.mark.parametrize("name, tolerance", [("cpu", 1e-4), ("t4", 1e-2), ("a100", 5e-2), ("mi300x", 5e-2)])
def test_packing_tolerance_by_dtype(name, tolerance) -> None:
    p = cpu_profile() if name == "cpu" else profile(name)
    assert decide(card("lora", train__packing=True), p, world_size=1, kernels=NONE).packing_tolerance == tolerance
    assert PACK_TOLERANCE["float32"] < PACK_TOLERANCE["float16"] < PACK_TOLERANCE["bfloat16"]


def test_baseline_numerics_differ_across_device_dtype_and_quantisation() -> None:
    from labkit.model.loading import baseline_numerics, baseline_quantize

    qlora = card("qlora")
    cpu, t4, a100 = (baseline_numerics(qlora, p) for p in (cpu_profile(), profile("t4"), profile("a100")))
    assert (cpu["device"], cpu["dtype"]) == ("cpu", "float32") and (t4["device"], t4["dtype"]) == ("cuda", "float16")
    assert t4["quantisation"] == {"type": "nf4", "double_quant": True, "compute_dtype": "float16"}
    assert a100["quantisation"]["compute_dtype"] == "bfloat16" and len({str(cpu), str(t4), str(a100)}) == 3
    assert baseline_quantize(qlora)  # the baseline is the numeric model that is trained
    qlora = updated(qlora, {"method.quantisation.unquantised_baseline": True})
    assert not baseline_quantize(qlora) and baseline_numerics(qlora, profile("t4"))["quantisation"] is None
    assert baseline_numerics(card("lora"), profile("t4"))["quantisation"] is None
    # the attention the architecture really gets: Phi in float16 on a T4 scores in float32, Llama keeps sdpa
    assert baseline_numerics(qlora, profile("t4"), "phi")["attention"] == FP32_SCORES
    llama = baseline_numerics(qlora, profile("t4"), "llama")
    assert llama["attention"] == baseline_numerics(qlora, profile("t4"))["attention"] == "sdpa"


def test_decisions_are_computed_once_per_card_and_profile() -> None:
    made = decide(card("lora"), profile("2xt4"), world_size=1, kernels=NONE)
    assert decide(card("lora"), profile("2xt4"), world_size=1, kernels=NONE) is made  # an equal card: the same
    assert decide(card("lora"), profile("t4"), world_size=1, kernels=NONE) is not made  # another profile: decided
    assert decide(card("full"), profile("2xt4"), world_size=1, kernels=NONE) is not made  # another card: decided


def test_the_machines_decisions_print_their_note_once(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from labkit.model import loading

    monkeypatch.setattr(loading, "profile_of", lambda device: profile("2xt4"))  # this machine, as recorded
    loading._decisions.cache_clear()
    try:
        first = loading.decisions(card("lora"), "cuda")
        again = [loading.decisions(card("lora"), "cuda:0"), loading.decisions(card("lora"), "cuda")]
        assert all(made is first for made in again)
        assert capsys.readouterr().out.count("note: 2 GPUs visible") == 1
    finally:
        loading._decisions.cache_clear()


def test_architecture_kernels_read_the_transformers_class() -> None:
    assert architecture_kernels("gemma2") == ("Gemma2ForCausalLM", {"sdpa": False, "flash_attention_2": True,
                                                                   "flex_attention": True})
    assert architecture_kernels("llama")[1] == {"sdpa": True, "flash_attention_2": True, "flex_attention": True}
    assert architecture_kernels("my_remote_arch") is None and architecture_kernels(None) is None


@pytest.mark.parametrize("model_type", ["gemma2", "gpt_oss"])
def test_auto_attention_becomes_eager_where_the_class_has_no_sdpa(model_type) -> None:
    for p in (cpu_profile(), profile("a100")):
        made = decide(card("lora"), p, world_size=1, kernels=NONE)
        adjusted = for_architecture(made, card("lora"), model_type)
        assert (adjusted.attention, adjusted.packing) == ("eager", None)
        assert adjusted.notes[-1].startswith(f"{architecture_kernels(model_type)[0]} has no sdpa attention in "
                                             "transformers ") and "more activation memory" in adjusted.notes[-1]
        assert for_architecture(made, card("lora"), "llama") is made  # sdpa where the class has it
    packed = decide(card("lora", train__packing=True), cpu_profile(), world_size=1, kernels=NONE)
    assert (packed.attention, packed.packing) == ("sdpa", "block_mask")
    assert for_architecture(packed, card("lora", train__packing=True), "gemma2").packing == "block_mask"


def test_packing_kernel_the_class_lacks_falls_back_to_sdpa_with_the_block_mask() -> None:
    c = card("lora", train__packing=True)
    made = decide(c, profile("a100"), world_size=1, kernels=BOTH)
    assert (made.attention, made.packing) == ("flash_attention_2", "padding_free")
    gpt_neo = for_architecture(made, c, "gpt_neo")  # flash-attn only: kept
    assert gpt_neo is made
    flex = decide(c, profile("a100"), world_size=1, kernels=FLEX)
    neo = for_architecture(flex, c, "gpt_neo")  # GPTNeo has no flex kernel, and no sdpa either
    assert (neo.attention, neo.packing) == ("eager", "block_mask") and "block mask" in neo.notes[-1]


def test_a_kernel_the_class_lacks_named_in_the_card_is_refused() -> None:
    c = card("lora", model__attn_implementation="sdpa")
    made = decide(c, cpu_profile(), world_size=1, kernels=NONE)
    with pytest.raises(CardError, match=r"^model.attn_implementation: sdpa is not implemented for Gemma2ForCausalLM in "
                       r"transformers [0-9.]+ \(it has eager, flash_attention_2, flex_attention\); set auto or one of "
                       r"those$"):
        for_architecture(made, c, "gemma2")
    eager = card("lora", model__attn_implementation="eager")
    kept = decide(eager, cpu_profile(), world_size=1, kernels=NONE)
    assert for_architecture(kept, eager, "gemma2") is kept
