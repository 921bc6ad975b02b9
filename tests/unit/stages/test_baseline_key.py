"""Stage 01's baseline key names what makes two measurements of the base model the same: a key only training reads
(`data.prompt.loss_on`) leaves it as it is, so sibling variants share one baseline and are paired by `labkit compare`;
the prompt the base model is asked with still changes it."""

from __future__ import annotations

from pathlib import Path

from labkit.card.load import load_card
from labkit.core import runs as R
from labkit.stages.baseline import baseline_key
from labkit.stages.context import open_stage

REPO = Path(__file__).resolve().parents[3]


def _key(tmp_path: Path, parent: str, body: str = "") -> str:
    card = tmp_path / f"{parent}-{abs(hash(body))}.yaml"
    card.write_text(f"parent: {REPO / 'params' / 'examples' / parent}\nmodel: {{source: 'tiny:llama', dtype: float32, revision: null}}\n"
                    + body)
    run = R.new_run(load_card(card), tmp_path / "runs")
    return baseline_key(open_stage("baseline", str(run.card_path), str(run.dir)))


def test_a_training_only_key_keeps_the_baseline_and_the_prompt_does_not(tmp_path: Path) -> None:
    last = _key(tmp_path, "support-chat.yaml")
    assert _key(tmp_path, "support-chat-every-answer.yaml") == last
    assert _key(tmp_path, "support-chat.yaml", "data: {prompt: {conversation: true, instruction: 'Reply: {input}'}}\n") != last
