"""Batched greedy generation with left padding and a KV cache (the evaluation procedure).

Every generated token's logits are checked (`FiniteLogits`, a transformers LogitsProcessor): a NaN or +inf logit, or a
row with no finite one, raises `labkit.errors.NonFiniteError` — an answer decoded from such logits (token 0 repeated,
"!!!!") is never scored.
"""

from __future__ import annotations

import time
from typing import Any, TypedDict

import torch
import tqdm.auto
from transformers import LogitsProcessor, LogitsProcessorList

from labkit.card.schema import Card
from labkit.core.progress import emit
from labkit.data.prompting import prompt_ids
from labkit.errors import NonFiniteError
from labkit.scoring.stopping import answer_end


class Answer(TypedDict):
    """One generated answer and how it ended (`generate_with_stops`)."""

    text: str  # decoded, special tokens skipped, stripped
    stopped: bool  # ended on a stop token (or a stop string) before eval.max_new_tokens
    answer_tokens: int  # tokens generated before the stop token (eval.max_new_tokens when it ran to the limit)


class FiniteLogits(LogitsProcessor):
    """Raises `NonFiniteError` at the first generated token whose logits hold a NaN or +inf, or a row none of whose
    logits is finite (a single -inf is a token generate's own processors ruled out, e.g. suppressed tokens). Scores
    pass through unchanged.

    Args:
        desc: what is being generated (the progress label), named in the error.
        fix: the fix the error names.
    """

    def __init__(self, desc: str, fix: str) -> None:
        self.desc, self.fix = desc, fix
        self.row_ids: list[Any] = []  # the ids of the current batch's rows, in batch order
        self.prompt_width = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        bad = scores.isnan().any(dim=-1) | scores.isposinf().any(dim=-1) | ~scores.isfinite().any(dim=-1)
        if bool(bad.any()):
            rows = [self.row_ids[i] if i < len(self.row_ids) else i for i in bad.nonzero().flatten().tolist()]
            kind = "nan" if bool(scores.isnan().any()) else "inf"
            raise NonFiniteError(f"{self.desc}: non-finite logits ({kind}) at generated token "
                                 f"{input_ids.shape[1] - self.prompt_width + 1} of row(s) {rows}; an answer decoded "
                                 f"from them is not scored; {self.fix}")
        return scores


def logits_fix(model: Any) -> str:
    """The fix non-finite logits name, by the dtype the model computes in."""
    dtype = next(model.parameters()).dtype
    if dtype == torch.float16:
        return ("fix: load in bfloat16 (a GPU of compute capability ≥ 8.0) or float32 (model.dtype, train.precision) — "
                "float16 overflows above 65504; Phi in float16 needs model.attn_implementation: eager or auto")
    return ("fix: the weights hold NaN or inf — check the training run's loss (a lower train.lr or "
            "train.max_grad_norm) and retrain")


def batches(lengths: list[int], size: int) -> list[list[int]]:
    """The evaluation's batches: row indices sorted by prompt length (less padding), in chunks of `size`.

    Args:
        lengths: the prompt length of each row, in token ids.
        size: the batch size (`eval.batch_size`).
    Returns:
        lists of row indices, shortest prompts first; every batch but the last holds `size` rows.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    return [order[start:start + size] for start in range(0, len(order), size)]


def stop_ids(model: Any, tokenizer: Any) -> list[int]:
    """The token ids generation stops on: the model's generation-config stop list (all of them: Llama 3 Instruct
    stops on <|eot_id|> as well as <|end_of_text|>) and the tokenizer's EOS.

    Passing `eos_token_id=tokenizer.eos_token_id` alone to `generate` would replace the model's own list.
    """
    config = getattr(model, "generation_config", None)
    listed = getattr(config, "eos_token_id", None)
    ids = [listed] if isinstance(listed, int) else list(listed or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def cut_at_stops(answer: str, stops: list[str]) -> str:
    """The answer up to the first stop string (generation stops after the token that completes one)."""
    cuts = [answer.find(s) for s in stops if s and s in answer]
    return answer[:min(cuts)] if cuts else answer


def generate_with_stops(model: Any, tokenizer: Any, card: Card, rows: list[dict[str, Any]],
                        desc: str = "generating", prompts: list[list[int]] | None = None,
                        stop_strings: list[str] | None = None) -> list[Answer]:
    """Generate an answer for each row with the card's evaluation procedure, recording how each ended.

    Prompts are built by `labkit.data.prompting` (as in training), sorted by length and left-padded into
    batches of `eval.batch_size` (`batches`), decoded greedily up to `eval.max_new_tokens`, stopping
    at any of the model's stop tokens (`stop_ids`); the answers come back in the order of `rows`, each with whether it
    stopped before the limit and its length in tokens (`labkit.scoring.stopping.answer_end`).

    Args:
        model: a causal LM (plain or PEFT), on its device.
        tokenizer: its tokenizer.
        card: the card (eval settings, prompt).
        rows: prepared rows with `input`.
        desc: progress bar label.
        prompts: the prompt ids of each row (default: the training prompt, `prompt_ids`); the baseline's other
            prompts (`labkit.data.prompting_baseline`) pass theirs.
        stop_strings: strings generation also stops on (transformers' stop_strings), cut from the answers.
    Returns:
        the Answers, in the order of `rows`.
    Raises:
        NonFiniteError: a generated token's logits were not finite (`FiniteLogits`).
    """
    if card.eval.max_new_tokens is None:
        raise ValueError("eval.max_new_tokens is unset: open the run's stage (labkit.stages.context) so stage 01 sizes "
                         "it from the data (labkit.core.run_card.resolved_card), or set it in the card")
    device = next(model.parameters()).device
    prompts = prompts if prompts is not None else [prompt_ids(tokenizer, card, r["input"]) for r in rows]
    stopping = {"stop_strings": list(stop_strings), "tokenizer": tokenizer} if stop_strings else {}
    answers: list[Answer] = [{"text": "", "stopped": False, "answer_tokens": 0}] * len(prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stops = stop_ids(model, tokenizer)
    was_training = model.training
    model.eval()
    start, done = time.monotonic(), 0
    check = FiniteLogits(desc, logits_fix(model))
    # tqdm.auto.tqdm looked up at call time: under `labkit run` the kernel's plain-text bar replaces it
    with torch.inference_mode(), tqdm.auto.tqdm(total=len(prompts), desc=desc, unit="ex") as bar:
        for idx in batches([len(p) for p in prompts], card.eval.batch_size):
            width = max(len(prompts[i]) for i in idx)
            input_ids = torch.full((len(idx), width), pad, dtype=torch.long)
            attention = torch.zeros((len(idx), width), dtype=torch.long)
            for row, i in enumerate(idx):
                ids = prompts[i]
                input_ids[row, width - len(ids):] = torch.tensor(ids)
                attention[row, width - len(ids):] = 1
            check.row_ids, check.prompt_width = [rows[i].get("id", i) for i in idx], width
            out = model.generate(
                input_ids=input_ids.to(device), attention_mask=attention.to(device), do_sample=False,
                max_new_tokens=card.eval.max_new_tokens, eos_token_id=stops, pad_token_id=pad,
                use_cache=True, temperature=None, top_p=None, top_k=None, logits_processor=LogitsProcessorList([check]),
                **stopping)
            for row, i in enumerate(idx):
                stopped, length = answer_end(out[row, width:].tolist(), stops, pad, card.eval.max_new_tokens)
                text = cut_at_stops(tokenizer.decode(out[row, width:], skip_special_tokens=True), stop_strings or [])
                answers[i] = {"text": text.strip(), "stopped": stopped, "answer_tokens": length}
            bar.update(len(idx))
            done += len(idx)
            seconds = time.monotonic() - start
            emit(phase="generate", label=desc, done=done, total=len(prompts),
                 eta_s=seconds / done * (len(prompts) - done))  # a batch's time grows with its prompts: a rough ETA
    if was_training:
        model.train()
    return answers


def generate_answers(model: Any, tokenizer: Any, card: Card, rows: list[dict[str, Any]],
                     desc: str = "generating", prompts: list[list[int]] | None = None,
                     stop_strings: list[str] | None = None) -> list[str]:
    """The answers' texts of `generate_with_stops` (same procedure and arguments), in the order of `rows`."""
    return [answer["text"] for answer in generate_with_stops(model, tokenizer, card, rows, desc, prompts, stop_strings)]
