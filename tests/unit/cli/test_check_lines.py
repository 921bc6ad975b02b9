"""`labkit check --data CARD` says what the card's method trains (from the model's config on the meta device), and a
method that does not apply fails the check as it fails `labkit run`."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from conftest import REPO

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
