"""`labkit check --data CARD` says what the card's method trains (from the model's config on the meta device), and a
method that does not apply fails the check as it fails `labkit run`; so does a model transformers does not load as a
causal LM, in `labkit estimate` too."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from conftest import MISTRAL3_REFUSAL, REPO, mistral3_card

from labkit.cli.checks import method_text
from labkit.cli.main import main
from labkit.preflight.records import MethodCheck


def _card(tmp_path: Path, **method) -> Path:
    raw = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    raw["method"] = {**raw["method"], **method}
    path = tmp_path / "card.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_check_data_prints_what_the_method_trains(tmp_path: Path, capsys) -> None:
    assert main(["--runs", str(tmp_path / "runs"), "check", "--data", str(_card(tmp_path, target_modules=["q_proj"]))]) == 0
    out = capsys.readouterr().out
    found = re.search(r"\n  method: lora on llama: ([\d.]+k) of ([\d.]+k) parameters trainable \(([\d.]+) %\), in q_proj\n",
                      out)
    assert found, out
    assert out.index("  data: ") < out.index("  method: ")
    assert not (tmp_path / "runs").exists()  # nothing written


def test_check_data_says_what_removed_rows_and_how_many(tmp_path: Path, capsys) -> None:
    """The smoke card's planted rows (an empty answer, an overlong ticket, a near-duplicate of an evaluation row) are
    counted by what removed them; a rule that removes most of the data shows its count before a run spends anything."""
    assert main(["--runs", str(tmp_path / "runs"), "check", "--data", str(_card(tmp_path))]) == 0
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("  data: "))
    assert line == ("  data: loaded 60, train 36, validation 11, test 10 rows; 3 removed: 1 by drop_empty, 1 by "
                    "{drop_longer_than_tokens: 400}, 1 by data.leakage (training rows that repeat an evaluation row); "
                    "every reference and encoding check passes")
    strict = yaml.safe_load(_card(tmp_path).read_text())
    strict["data"]["cleaning"][-1] = {"drop_longer_than_tokens": 180}
    (tmp_path / "card.yaml").write_text(yaml.safe_dump(strict, sort_keys=False))
    assert main(["--runs", str(tmp_path / "runs"), "check", "--data", str(tmp_path / "card.yaml")]) == 0
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("  data: "))
    found = re.fullmatch(r"  data: loaded 60, train (\d+), validation (\d+), test (\d+) rows; (\d+) removed: 1 by "
                         r"drop_empty, (\d+) by \{drop_longer_than_tokens: 180\}(, (\d+) by data\.leakage \(.*\))?; "
                         r"every reference and encoding check passes", line)
    assert found, line
    train, validation, test, removed, too_long = map(int, found.groups()[:5])
    assert too_long > 10 and 60 - train - validation - test == removed == 1 + too_long + int(found.group(7) or 0)
    assert not (tmp_path / "runs").exists()


def test_check_without_data_does_not_apply_the_method(tmp_path: Path, capsys) -> None:
    """The card-only check stays free of torch (tests/unit/cli/test_fast_start.py): no method line, and a target that
    matches nothing is left to `--data` and `labkit run`."""
    assert main(["--runs", str(tmp_path / "runs"), "check", str(_card(tmp_path, target_modules=["qkv_proj"]))]) == 0
    assert "  method: " not in capsys.readouterr().out
    assert main(["--runs", str(tmp_path / "runs"), "check", "--data", str(_card(tmp_path, target_modules=["qkv_proj"]))]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and re.search(r"card\.yaml:\d+: method\.target_modules \['qkv_proj'\]: ", err), err


def test_method_text() -> None:
    moe = MethodCheck(architecture="qwen3_moe", kind="lora", trainable=16_900, parameters=155_000,
                      adapted=["experts", "gate", "q_proj"], experts_adapted=True)
    assert method_text(moe) == ("lora on qwen3_moe: 16.9k of 155k parameters trainable (10.9 %), in experts (fused), "
                                "gate, q_proj")
    full = MethodCheck(architecture="gemma3", kind="full", trainable=4_300_000_000, parameters=4_300_000_000,
                       adapted=["down_proj", "q_proj"], experts_adapted=False)
    assert method_text(full) == "full on gemma3: 4.3B of 4.3B parameters trainable (100 %)"
    qlora = MethodCheck(architecture="llama", kind="qlora", trainable=41_943_040, parameters=8_072_204_288,
                        adapted=["q_proj", "v_proj"], experts_adapted=False)
    assert method_text(qlora) == "qlora on llama: 41.9M of 8.07B parameters trainable (0.52 %), in q_proj, v_proj"
    assert method_text(None).startswith("not checked here (a .gguf file, a pypi: model not converted")


def test_each_failing_card_is_named_when_several_are_checked(tmp_path: Path, capsys) -> None:
    """A check after the card loaded (the template, the tokenizer, the data) names a key or a model, not the card: with
    several cards each line starts at the key's `file:line` (in the parent that writes it), else at the card."""
    smoke = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(smoke, sort_keys=False))
    cards = {"gemma2": "model: {source: 'tiny:gemma2'}\n", "mistral": "model: {source: 'tiny:mistral'}\n",
             "own": "model: {source: 'tiny:gemma2'}\ndata:\n  prompt:\n    system: Sort the ticket.\n", "ok": ""}
    for name, text in cards.items():
        (tmp_path / f"{name}.yaml").write_text(f"parent: base.yaml\nexperiment: {{variant: {name}}}\n{text}")
    paths = [str(tmp_path / f"{name}.yaml") for name in cards]
    assert main(["--runs", str(tmp_path / "runs"), "check", "--data", *paths]) == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("labkit: error:")]  # (tiny models' build bars)
    in_base = next(i for i, text in enumerate((tmp_path / "base.yaml").read_text().splitlines(), 1) if "system:" in text)
    assert lines[0].startswith(f"labkit: error: {tmp_path / 'base.yaml'}:{in_base}: data.prompt.system: the chat "
                               "template of tiny:gemma2 refuses a system message"), lines
    assert lines[1].startswith(f"labkit: error: {tmp_path / 'mistral.yaml'}: tiny:mistral: the tokenizer has no chat "
                               "template"), lines
    assert lines[2].startswith(f"labkit: error: {tmp_path / 'own.yaml'}:6: data.prompt.system: "), lines
    assert len(lines) == 3 and f"{tmp_path / 'ok.yaml'}: ok" in out


def test_a_vision_language_checkpoint_is_refused_in_one_line_before_anything_is_written(tmp_path: Path, capsys) -> None:
    """A local Mistral 3 checkpoint (the format of Mistral Small 3.1 and Ministral 3: a vision tower beside a
    `ministral3` text decoder) has no causal-LM class in transformers: `check --data`, `estimate`, `run` and `stage`
    say so in one line at the card's `model.source` line, exit 2, and neither `run` nor `stage` creates a run."""
    card = mistral3_card(tmp_path)
    runs = tmp_path / "runs"
    expected = f"labkit: error: {card}:3: model.source {tmp_path / 'mistral3'}: {MISTRAL3_REFUSAL}"
    for command in (["check", "--data", str(card)], ["estimate", str(card), "--gpu-memory", "24"], ["run", str(card)],
                    ["stage", "baseline", str(card)]):
        assert main(["--runs", str(runs), *command]) == 2, command
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("labkit: ")]
        assert lines == [expected], (command, lines)
    assert not runs.exists() or not any(runs.rglob("*.json"))  # no run, no registry event
