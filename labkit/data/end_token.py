"""Stage 02's end-token check: every rendered training example ends its answer with a token generation stops on,
inside the loss mask.

The evaluation stops on a list of token ids (`labkit.evaluate.generation.stop_ids`: the model's generation-config
stop list and the tokenizer's EOS). A model learns to emit one only where an example puts it after the answer *and*
computes the loss there; an example whose answer runs on without one, or whose end token is masked (label -100),
teaches the model to ramble to `eval.max_new_tokens` — what `stop_rate` (`labkit.scoring.stopping`) measures after
training. This module checks it before training, per example, with a one-line cause and its fix.
"""

from __future__ import annotations

from typing import Any

from labkit.data.prompting import IGNORE, Encoded

CHECK = "every answer ends with a token generation stops on, inside the loss mask"
MISSING_FIX = ("fix: close the answer with an end token generation stops on — a chat template that ends the assistant "
               "turn with the EOS, or a tokenizer with an eos_token (format plain appends it after the answer)")
MASKED_FIX = ("fix: keep the end token's label (it teaches the model to stop): a template, collator or pad = EOS "
              "masking that sets it to -100 must leave the answer's end token in the loss")


def _token(tokenizer: Any, token_id: int) -> str:
    return f"{tokenizer.convert_ids_to_tokens(int(token_id))!r} (id {token_id})"


def end_token_cause(tokenizer: Any, encoded: Encoded, stops: list[int]) -> str | None:
    """Why one encoded example does not teach the model to stop (None when it does).

    The first token of the answer that generation stops on is where the answer ends at inference: it must exist and
    carry loss (its label is the token, not -100).

    Args:
        tokenizer: the tokenizer (to name tokens).
        encoded: the example (`labkit.data.prompting.encode_example`).
        stops: the token ids generation stops on.
    Returns:
        the cause and its fix in one line, or None.
    """
    ends = set(stops)
    first = next((i for i in range(encoded.prompt_len, len(encoded.input_ids)) if encoded.input_ids[i] in ends), None)
    if first is None:
        last = _token(tokenizer, encoded.input_ids[-1]) if encoded.input_ids else "nothing"
        return f"the answer ends with {last} and no token generation stops on follows it; {MISSING_FIX}"
    if encoded.labels[first] == IGNORE or encoded.labels[first] != encoded.input_ids[first]:
        return (f"the end token {_token(tokenizer, encoded.input_ids[first])} after the answer is masked out of the "
                f"loss (label {encoded.labels[first]} at position {first}); {MASKED_FIX}")
    return None


def end_token_check(tokenizer: Any, rows: list[dict[str, Any]], encoded: list[Encoded],
                    stops: list[int]) -> dict[str, Any]:
    """The end-token check over a split's examples (a truncated example is the truncation check's finding: skipped).

    Args:
        tokenizer: the tokenizer.
        rows: the prepared rows (with `id`), in the order of `encoded`.
        encoded: their encodings.
        stops: the token ids generation stops on (`labkit.evaluate.generation.stop_ids`).
    Returns:
        a check row {"check", "ok", "failed_ids", "explanation"} like `labkit.data.prompting.check_encoded`'s; when it
        fails, the explanation is the first failing example's cause and fix.
    """
    causes = {row["id"]: cause for row, enc in zip(rows, encoded, strict=True)
              if not enc.truncated and (cause := end_token_cause(tokenizer, enc, stops))}
    names = ", ".join(_token(tokenizer, s) for s in stops) or "none"
    first = next(iter(causes.items()), None)
    explanation = (f"row {first[0]}: {first[1]}" if first else
                   f"generation stops on {names}: every answer ends with one, and its label trains it")
    return {"check": f"{CHECK} ({names})", "ok": not causes, "failed_ids": list(causes), "explanation": explanation}
