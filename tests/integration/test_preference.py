"""Preference training (DPO, ORPO) through TRL on the tiny model: card validation, the built-in preference
pairs, data errors, the tokens TRL trains on against the tokens stage 02 shows, real update checks, the
reference model, gradient accumulation, resume from a checkpoint and the memory estimate."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO
from transformers import TrainerCallback

from labkit.card.load import load_card
from labkit.card.schema import Full, Qlora
from labkit.card.update import updated
from labkit.data import sources as D
from labkit.data.pairs import encode_pairs, loss_positions
from labkit.data.prepare import derive_splits
from labkit.data.tickets import generate_tickets
from labkit.errors import CardError
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.preflight.stepchecks import accumulation_check, update_check
from labkit.train.flops import forward_parameters
from labkit.train.token_count import cost_record
from labkit.train.trainer import build_trainer


def _card(kind: str = "dpo"):
    return updated(load_card(REPO / "params" / "smoke-dpo.yaml").card, {"train.trainer": kind})


@pytest.fixture(scope="module")
def splits(tiny_model):
    """The smoke-dpo card's prepared splits (cleaned: no truncated or empty rows)."""
    card = _card()
    return derive_splits(card, load_tokenizer(tiny_model, card)).splits


def _trainer(card, tiny_model, rows, tmp_path: Path, **overrides):
    model = apply_method(load_model(tiny_model, card, "cpu"), card)
    tokenizer = load_tokenizer(tiny_model, card)
    args = {"max_steps": 2, "lr_scheduler_type": "constant", "warmup_steps": 0, "disable_tqdm": True, **overrides}
    return build_trainer(card, model, tokenizer, rows, tmp_path, device="cpu", **args), tokenizer


# --------------------------------------------------------------------------- the card
def _bad(tmp_path: Path, mutate) -> str:
    data = yaml.safe_load((REPO / "params" / "quickstart.yaml").read_text())
    mutate(data)
    path = tmp_path / "card.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(CardError) as info:
        load_card(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    return str(info.value)


def _prefer(data: dict, kind: str = "dpo", **train) -> None:
    data["train"].update(trainer=kind, **train)
    data["data"]["fields"]["rejected"] = "rejected"


def test_preference_card_without_rejected_field_names_the_key_and_the_fix(tmp_path: Path) -> None:
    msg = _bad(tmp_path, lambda d: d["train"].update(trainer="dpo"))
    assert "data.fields.rejected: train.trainer dpo trains on preference pairs" in msg
    assert "set data.fields.rejected to the column holding the rejected answer" in msg


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: _prefer(d, "dpo", packing=True), "train.packing: packing does not apply to preference pairs"),
    (lambda d: _prefer(d, "orpo", grad_accum=2), "train.grad_accum: TRL's ORPOTrainer averages its NLL term"),
    (lambda d: _prefer(d, "dpo", loss_normalisation="micro_batch_mean"), "train.loss_normalisation: micro_batch_mean"),
    (lambda d: d["train"].update(beta=0.2), "train.beta: applies to train.trainer dpo or orpo only"),
], ids=["packing-with-dpo", "orpo-grad-accum", "micro-batch-mean-with-dpo", "beta-on-sft"])
def test_settings_that_do_not_apply_are_errors(tmp_path: Path, mutate, expected) -> None:
    assert expected in _bad(tmp_path, mutate)


def test_example_cards_differ_from_the_quickstart_by_a_few_keys() -> None:
    for kind in ("dpo", "orpo"):
        loaded = load_card(REPO / "params" / "examples" / f"ticket-{kind}.yaml")
        assert loaded.card.train.trainer == kind and loaded.card.data.fields.rejected == "rejected"
        assert loaded.card.model == load_card(REPO / "params" / "quickstart.yaml").card.model
        assert set(loaded.diff) <= {"experiment.variant", "experiment.hypothesis", "data.fields.rejected",
                                    "train.trainer", "train.beta", "train.lr"}


# --------------------------------------------------------------------------- the data
def test_builtin_preference_rows_are_deterministic_and_plausibly_wrong() -> None:
    plain, planted = generate_tickets(rows=200, seed=5)
    pairs, planted_again = generate_tickets(rows=200, seed=5, preference=True)
    assert pairs == generate_tickets(rows=200, seed=5, preference=True)[0]
    assert planted == planted_again
    assert [{k: v for k, v in r.items() if k != "rejected"} for r in pairs] == plain  # the other columns are the same
    wrong = {"category": 0, "priority": 0, "product": 0}
    for row in pairs:
        chosen, rejected = json.loads(row["answer"]), json.loads(row["rejected"])
        assert list(rejected) == list(chosen) and row["rejected"] == json.dumps(rejected)  # same JSON shape
        (field,) = [k for k in chosen if chosen[k] != rejected[k]]  # exactly one field is wrong
        wrong[field] += 1
        if field == "priority":  # a neighbouring level
            levels = ["low", "medium", "high", "urgent"]
            assert abs(levels.index(chosen["priority"]) - levels.index(rejected["priority"])) == 1
    assert min(wrong.values()) > 10, wrong
    other_seed = generate_tickets(rows=200, seed=6, preference=True)[0]
    assert [r["rejected"] for r in other_seed] != [r["rejected"] for r in pairs]


def _pair_card(tmp_path: Path, rows: list[dict], **data):
    raw = yaml.safe_load((REPO / "params" / "quickstart.yaml").read_text())
    _prefer(raw)
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw["data"].update(source={"path": str(path)}, **data)
    card_path = tmp_path / "card.yaml"
    card_path.write_text(yaml.safe_dump(raw))
    return load_card(card_path).card, path


def _pair(i: int, rejected: str | None = None) -> dict:
    answer = json.dumps({"category": "billing", "priority": "low", "product": "Orbit Phone"})
    return {"id": f"r{i}", "text": f"ticket {i}", "category": "billing", "answer": answer,
            "rejected": rejected if rejected is not None else answer.replace("low", "high")}


def test_rejected_equal_to_chosen_is_named_with_file_and_line(tmp_path: Path) -> None:
    same = json.dumps({"category": "billing", "priority": "low", "product": "Orbit Phone"}, indent=1)  # same value
    card, path = _pair_card(tmp_path, [_pair(1), _pair(2, rejected=same)])
    with pytest.raises(D.DataError, match=re.escape(f"{path}:2: the rejected answer ('rejected', data.fields.rejected) "
                                                    "equals the chosen answer")):
        D.map_fields(card.data, D.load_source(card.data)[0])


def test_empty_rejected_is_dropped_by_drop_empty_or_named(tmp_path: Path) -> None:
    rows = [_pair(1), _pair(2, rejected="  "), _pair(3)]
    card, _ = _pair_card(tmp_path, rows)
    kept, report = D.apply_cleaning(card.data, D.map_fields(card.data, D.load_source(card.data)[0]), token_length=lambda r: 1)
    assert [r["id"] for r in kept] == ["r1", "r3"]
    assert next(r for r in report if r["rule"] == "drop_empty")["removed_ids"] == ["r2"]
    card, _ = _pair_card(tmp_path, rows, cleaning=["normalise_whitespace"])
    empty = r"row id 'r2': the rejected answer \(data.fields.rejected\) is empty .* \(add drop_empty"
    with pytest.raises(D.DataError, match=empty):
        D.apply_cleaning(card.data, D.map_fields(card.data, D.load_source(card.data)[0]))


def test_missing_rejected_column_names_the_card_key(tmp_path: Path) -> None:
    row = _pair(1)
    del row["rejected"]
    card, path = _pair_card(tmp_path, [row])
    with pytest.raises(D.DataError, match=re.escape(f"{path}:1: no field 'rejected' (data.fields.rejected;")):
        D.map_fields(card.data, D.load_source(card.data)[0])


def test_preference_variant_shares_the_data_version_of_its_sft_sibling(tiny_model, splits) -> None:
    sft = load_card(REPO / "params" / "smoke.yaml").card
    plain = derive_splits(sft, load_tokenizer(tiny_model, sft)).splits
    assert all("rejected" in r for rows in splits.values() for r in rows)
    assert {k: D.split_sha256(v) for k, v in splits.items()} == {k: D.split_sha256(v) for k, v in plain.items()}
    assert D.rows_hash(splits["train"]) != D.rows_hash(plain["train"])  # the rejected answers are versioned apart


def test_preference_variant_is_comparable_and_its_rejected_answers_are_versioned(tmp_path: Path) -> None:
    from labkit.core.protocol import protocol_changes, run_protocol

    def run(name: str, card: str, preference: str | None) -> dict:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "card.yaml").write_text(yaml.safe_dump(load_card(REPO / "params" / card).resolved))
        manifest = {"data_version": "same-rows", **({"preference": {"version": preference}} if preference else {})}
        (folder / "data_manifest.json").write_text(json.dumps(manifest))
        return run_protocol(folder)

    sft, dpo = run("sft", "quickstart.yaml", None), run("dpo", "examples/ticket-dpo.yaml", "v1")
    orpo = run("orpo", "examples/ticket-orpo.yaml", "v1")
    assert protocol_changes(sft, dpo) == {} and protocol_changes(dpo, orpo) == {}
    other = run("other", "examples/ticket-orpo.yaml", "v2")  # other rejected answers for the same rows
    assert list(protocol_changes(dpo, other)) == ["preference_version"]


# --------------------------------------------------------------------------- tokens: stage 02 == what TRL trains on
@pytest.mark.parametrize("kind", ["dpo", "orpo"])
def test_trainer_trains_on_the_tokens_stage_02_shows(kind: str, tiny_model, splits, tmp_path: Path) -> None:
    from labkit.show import tokens as tokenview
    from labkit.stages import preprocessing as inspection

    card = _card(kind)
    rows = splits["train"][:6]
    trainer, tokenizer = _trainer(card, tiny_model, rows, tmp_path)
    shown = encode_pairs(tokenizer, card, rows)  # what stage 02 renders (inspection.run_checks encodes the same way)
    encoded, checks = inspection.run_checks(tokenizer, card, {"train": rows})
    assert all(c["ok"] for c in checks), [c for c in checks if not c["ok"]]
    page = tokenview.render_page(tokenizer, [(r["id"], p) for r, p in zip(rows, encoded["train"])])
    assert [int(i) for i in re.findall(r'title="id (\d+)"', page)] == [
        t for p in shown for t in p.prompt_ids + p.chosen_ids + p.rejected_ids]
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(rows))])
    marks = [loss_positions(p) for p in shown]
    for i, pair in enumerate(shown):
        assert pair.chosen_ids[-1] == pair.rejected_ids[-1] == tokenizer.eos_token_id
        for side, row in (("chosen", i), ("rejected", len(rows) + i)):
            seq = getattr(pair, side).input_ids
            if kind == "dpo":  # TRL's DPO collator: prompt_ids + answer ids, completion_mask on the answer
                ids, mask = batch["input_ids"][row], batch["completion_mask"][row]
                assert ids[: len(seq)].tolist() == seq
                assert [bool(m) for m in mask[: len(seq)]] == [m == "answer" for m in marks[i][side]]
            else:  # ORPO's layout: input ids, odds-ratio labels on the answer, the NLL term on every unpadded token
                ids, labels = batch[f"{side}_input_ids"][i], batch[f"{side}_labels"][i]
                attention = batch[f"{side}_attention_mask"][i]
                assert ids[: len(seq)].tolist() == seq and int(attention.sum()) == len(seq)
                assert [int(x) != -100 for x in labels[: len(seq)]] == ["answer" in m for m in marks[i][side]]
                if side == "chosen":
                    assert [m.startswith("nll") for m in marks[i][side]] == [False] + [True] * (len(seq) - 1)


# --------------------------------------------------------------------------- real training steps
@pytest.mark.parametrize("kind", ["dpo", "orpo"])
def test_two_steps_change_exactly_the_lora_tensors(kind: str, tiny_model, splits, tmp_path: Path) -> None:
    card = _card(kind)
    trainer, _ = _trainer(card, tiny_model, splits["train"][:8], tmp_path)
    assert type(trainer).__name__ == f"Labkit{kind.upper()}Trainer" and trainer.args.beta == 0.1
    assert list(trainer.model.peft_config) == ["default"]  # no second "ref" adapter in memory or in checkpoints
    result = update_check(trainer, card, steps=2)
    assert result["ok"], result["problems"]
    assert result["changed"] == result["expected"] == 2 * 7 * 2  # A and B of 7 linears in 2 layers
    assert not result["changed_frozen"]  # every base weight bit for bit the same
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    if kind == "dpo":
        assert losses[0] == pytest.approx(math.log(2))  # policy == reference at step 1: -log σ(0)


@pytest.mark.parametrize("kind", ["dpo", "orpo"])
def test_two_visible_gpus_without_a_launcher_pin_the_preference_trainer_to_one(kind: str, tiny_model, splits,
                                                                              tmp_path: Path) -> None:
    """The recorded 2×T4 profile's decisions (as load_model stamps them on the model) reach TRL's trainer: its
    arguments drive one GPU, so Trainer does not wrap the model in the DataParallel that DPOTrainer refuses."""
    from labkit.core.device import load_profile
    from labkit.model.placement import decide

    card = _card(kind)
    tokenizer = load_tokenizer(tiny_model, card)
    made = decide(card, load_profile(REPO / "tests" / "unit" / "core" / "profiles" / "2xt4.json"), world_size=1,
                  kernels={})
    assert (made.gpus_visible, made.gpus_used) == (2, 1) and "training on cuda:0 only" in made.notes[0]
    args = {"max_steps": 1, "disable_tqdm": True}
    for decisions, gpus in ((made.as_dict(), 1), (None, 0)):  # 2×T4 profile, then this CPU's own decisions
        model = apply_method(load_model(tiny_model, card, "cpu"), card)
        if decisions:
            model.labkit_decisions = decisions
        trainer = build_trainer(card, model, tokenizer, splits["train"][:4], tmp_path / str(gpus), device="cpu", **args)
        assert type(trainer).__name__ == f"Labkit{kind.upper()}Trainer" and trainer.args.n_gpu == gpus


def test_qlora_dpo_on_cpu_keeps_4bit_weights_bit_for_bit(tiny_model, splits, tmp_path: Path) -> None:
    card = updated(_card("dpo"), {"method": Qlora(kind="qlora", r=4, alpha=8, dropout=0.0)})
    trainer, _ = _trainer(card, tiny_model, splits["train"][:8], tmp_path)
    # TRL's DPOTrainer casts the adapter of a quantised model to bfloat16 (QLoRA paper); labkit leaves it so
    assert {p.dtype for p in trainer.model.parameters() if p.requires_grad} == {torch.bfloat16}
    result = update_check(trainer, card, steps=2)
    assert result["ok"], result["problems"]


def test_dpo_reference_is_the_base_model_with_the_adapter_off(tiny_model, splits, tmp_path: Path) -> None:
    card = _card("dpo")
    trainer, _ = _trainer(card, tiny_model, splits["train"][:8], tmp_path)
    trainer.train()
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    with torch.no_grad():
        ref_chosen, ref_rejected = trainer.compute_ref_log_probs(trainer.model, batch)
        base = load_model(tiny_model, card, "cpu")  # a fresh base model, no adapter
        labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
        logits = base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
        target = labels[:, 1:]
        logp = torch.log_softmax(logits, -1).gather(-1, target.clamp(min=0)[..., None])[..., 0]
        expected = (logp * (target != -100)).sum(-1)
        policy = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        policy = torch.log_softmax(policy.float(), -1).gather(-1, target.clamp(min=0)[..., None])[..., 0]
        policy = (policy * (target != -100)).sum(-1)
    assert torch.allclose(torch.cat([ref_chosen, ref_rejected]), expected, atol=1e-4)
    assert not torch.allclose(policy, expected, atol=1e-4)  # the adapter has moved: the reference is not the policy
    # the reference's forward over the same tokens is counted in the FLOPs (labkit.train.token_count, docs/cost.md)
    cost = cost_record(trainer)
    n, trainable = forward_parameters(trainer.model)
    assert cost["reference_parameters"] == n - trainable > 0 and 0 < cost["loss_tokens"] < cost["tokens"]
    assert cost["flops_per_token"] == 4 * n + 2 * trainable + 2 * (n - trainable) and 0 < cost["mfu"] < 1


def test_full_fine_tuning_dpo_keeps_a_frozen_copy_as_reference(tiny_model, splits, tmp_path: Path) -> None:
    card = updated(_card("dpo"), {"method": Full(kind="full")})
    trainer, _ = _trainer(card, tiny_model, splits["train"][:8], tmp_path)
    reference = {n: p.detach().clone() for n, p in trainer.ref_model.named_parameters()}
    result = update_check(trainer, card, steps=2)
    assert result["ok"], result["problems"]
    assert all(torch.equal(reference[n], p) for n, p in trainer.ref_model.named_parameters())


def test_dpo_accumulation_matches_and_orpo_bias_is_shown(tiny_model, splits) -> None:
    rows = splits["train"][:8]
    for kind in ("dpo", "orpo"):
        card = _card(kind)
        tokenizer = load_tokenizer(tiny_model, card)
        result = accumulation_check(card, lambda: apply_method(load_model(tiny_model, card, "cpu"), card), tokenizer,
                                    rows, "cpu", micro_batch=2, accum=2)
        if kind == "dpo":  # a mean over pairs: unequal token counts do not matter
            assert result["ok"] and result["relative_difference"] <= 1e-4 and result["note"] is None
        else:  # TRL's ORPO NLL term is a per-micro-batch token mean: shown, and orpo cards do not accumulate
            assert result["relative_difference"] > 1e-3 and result["ok"] and "grad_accum: 1" in result["note"]


_CHECKPOINTING = """
import json, sys
from labkit.card.load import load_card
from labkit.card.update import updated
from labkit.data.prepare import derive_splits
from labkit.model.loading import load_model, load_tokenizer
from labkit.model.method import apply_method
from labkit.model.sources import resolve
from labkit.preflight.memory_check import measure
from labkit.preflight.shared import SharedModel
from labkit.preflight.stepchecks import checkpointing_check
card = updated(load_card(sys.argv[1]).card, {"train.trainer": "dpo"})
model = resolve("tiny:llama")
tokenizer = load_tokenizer(model, card)
rows = derive_splits(card, tokenizer).splits["train"][:16]
shared = SharedModel(apply_method(load_model(model, card, "cpu"), card))
measure(card, shared, tokenizer, rows, 360)  # stage 03's memory pass comes first: a process's one-time allocations
result = checkpointing_check(card, shared, tokenizer, rows, 360, "cpu", config=shared.model.config)
print(json.dumps({k: result[k] for k in ("ok", "problems", "memory_plain_bytes", "memory_checkpointed_bytes",
                                         "memory_saving_expected_bytes")}))
"""


def test_dpo_activation_checkpointing_same_loss_and_gradients_less_memory_as_expected(tiny_model) -> None:
    # in a fresh process, as stage 03 runs it: the CPU's memory figure is the process's peak resident memory, which
    # the heap a long test process has left behind can blur (43 MiB against 42 MiB once, 44 against 21 alone)
    proc = subprocess.run([sys.executable, "-c", _CHECKPOINTING, str(REPO / "params" / "smoke-dpo.yaml")], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"], result["problems"]  # the reference pass runs with checkpointing switched off (TRL)
    plain, checkpointed = result["memory_plain_bytes"], result["memory_checkpointed_bytes"]
    assert checkpointed < 0.8 * plain
    # the saving expected is the step estimate's without checkpointing less the one with it (27.5-27.8 MiB measured
    # against 29.8 expected here, 2026-12-04); the kept activations alone expected 14.2 MiB, half of it
    assert abs(result["memory_saving_expected_bytes"] / (plain - checkpointed) - 1) < 0.25, result


def test_dpo_resumes_from_a_checkpoint_with_the_same_curve(tiny_model, splits, tmp_path: Path) -> None:
    card = updated(_card("dpo"), {"train.max_steps": 4, "train.save_steps": 2, "train.micro_batch": 2})
    rows = splits["train"][:8]

    def curve(trainer):
        return [(e["step"], e["loss"]) for e in trainer.state.log_history if "loss" in e]

    whole, _ = _trainer(card, tiny_model, rows, tmp_path / "whole", checkpoints=True, max_steps=4)
    whole.train()
    assert (tmp_path / "whole" / "checkpoint-2").is_dir() and (tmp_path / "whole" / "checkpoint-4").is_dir()
    assert not (tmp_path / "whole" / "checkpoint-4" / "ref").exists()  # only the trained adapter is saved
    resumed, _ = _trainer(card, tiny_model, rows, tmp_path / "whole", checkpoints=True, max_steps=4)
    ran: list[int] = []

    class Count(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
            ran.append(state.global_step)

    resumed.add_callback(Count())
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-2"))
    assert ran == [3, 4]  # continued from step 2, not from scratch
    assert curve(resumed) == curve(whole)  # steps 1-2 from the checkpoint's history, 3-4 trained again: the same losses


def test_memory_estimate_counts_both_rows_of_a_pair(tiny_model) -> None:
    from transformers import AutoConfig

    from labkit.preflight.memory import estimate_step

    config = AutoConfig.from_pretrained(tiny_model.location)
    sft = load_card(REPO / "params" / "smoke.yaml").card
    dpo, orpo = _card("dpo"), _card("orpo")
    one, two = estimate_step(config, sft, 100), estimate_step(config, sft, 100, micro_batch=2 * sft.train.micro_batch)
    d, o = estimate_step(config, dpo, 100), estimate_step(config, orpo, 100)
    assert d["rows"] == o["rows"] == 2 * one["rows"] and d["micro_batch"] == one["micro_batch"]
    assert d["breakdown"]["activations"] == two["breakdown"]["activations"]
    assert "reference_forward" in d["phases"] and d["step_bytes"] >= two["step_bytes"]
    vocab_rows = o["rows"] * 100 * config.vocab_size * 4
    assert o["breakdown"]["loss_head_buffers"] >= 3 * vocab_rows  # full logits, not fused tiles


# --------------------------------------------------------------------------- through the real stages
def _history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "training" / "log_history.jsonl").read_text().splitlines()]


def test_tiny_dpo_card_through_stage_04(tmp_path: Path) -> None:
    """`labkit stage` 01, 02 and 04 on the tiny DPO card: pairs shown, trained with DPO, checkpointed, adapter saved."""
    from conftest import labkit

    runs = tmp_path / "runs"
    first = labkit("stage", "baseline", "params/smoke-dpo.yaml", runs=runs)
    assert first.returncode == 0, first.stdout + first.stderr
    (run,) = [p for p in (runs / "smoke").iterdir() if not p.name.startswith("_")]
    for name in ("preprocessing", "training"):
        proc = labkit("stage", name, str(run / "card.yaml"), "--run", str(run), runs=runs)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((run / "data_manifest.json").read_text())
    assert manifest["preference"]["trainer"] == "dpo" and manifest["preference"]["field"] == "rejected"
    checks = json.loads((run / "preprocessing" / "checks.json").read_text())
    assert all(c["ok"] for c in checks) and any(c["check"].startswith("rejected: ") for c in checks)
    samples = (run / "preprocessing" / "samples.html").read_text()
    assert "rejected →" in samples and "DPO: the loss reads the answer tokens" in samples
    outcome = json.loads((run / "training" / "outcome.json").read_text())
    assert outcome["steps"] == 8 and not outcome["interrupted"] and not outcome["budget_exhausted"]
    history = _history(run)
    losses = [r["loss"] for r in history if "loss" in r]
    assert len(losses) == 8 and all(math.isfinite(x) for x in losses) and losses[0] == pytest.approx(math.log(2))
    assert any("eval_loss" in r and "eval_rewards/accuracies" in r for r in history)
    assert sorted(p.name for p in (run / "training" / "trainer").iterdir() if p.is_dir()) == ["checkpoint-6", "checkpoint-8"]
    adapter = run / "training" / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file() and not (adapter / "ref").exists()
    assert json.loads((run / "training" / "summary.json").read_text())["trainer"] == "dpo"


@pytest.mark.slow
def test_tiny_dpo_run_all_stages_then_resume_reproduces_training(tmp_path: Path) -> None:
    """The whole `labkit run` on the tiny DPO card (stage 03's checks with the DPO trainer), then stage 04 again
    from its checkpoint at step 6: the same curve, point for point."""
    import shutil

    from conftest import labkit

    runs = tmp_path / "runs"
    proc = labkit("run", "params/smoke-dpo.yaml", runs=runs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = [p for p in (runs / "smoke").iterdir() if not p.name.startswith("_")]
    for name in ("update_check", "accumulation_check", "checkpointing_check"):
        result = json.loads((run / "parameter_check" / f"{name}.json").read_text())
        assert result["ok"], (name, result.get("problems"))
    before = [{k: v for k, v in r.items() if "runtime" not in k} for r in _history(run)]
    shutil.rmtree(run / "training" / "trainer" / "checkpoint-8")
    shutil.rmtree(run / "training" / "adapter")
    status = json.loads((run / "status.json").read_text())  # as if the run had been interrupted in stage 04
    for name in ("training", "comparison"):
        status["stages"].pop(name, None)
    status["status"] = "interrupted"
    (run / "status.json").write_text(json.dumps(status))
    again = labkit("run", "--resume", run.name, runs=runs)
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads((run / "training" / "outcome.json").read_text())["resumed_from"].endswith("checkpoint-6")
    assert [{k: v for k, v in r.items() if "runtime" not in k} for r in _history(run)] == before
