"""What an export tells the Hub about its base: GGUF metadata, a local folder's README, the portable base name."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from labkit.export.hub_card import describe_base, gguf_metadata
from labkit.export.publish import portable_base_fields
from labkit.model.sources import ResolvedModel


def _gguf(path: Path) -> Path:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_name("SmolLM2 135M Instruct")
    writer.add_organization("HuggingFaceTB")
    writer.add_license("apache-2.0")
    writer.add_languages(["en"])
    writer.add_tensor("token_embd.weight", np.zeros((4, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_base_is_described_from_its_metadata(tmp_path: Path) -> None:
    gguf = _gguf(tmp_path / "model.Q4_1.gguf")
    assert gguf_metadata(gguf) == {"name": "SmolLM2 135M Instruct", "organization": "HuggingFaceTB",
                                   "license": "apache-2.0", "language": ["en"]}
    resolved = ResolvedModel(source="model.Q4_1.gguf", kind="gguf", location=str(tmp_path / "converted"), revision="r")
    described = describe_base(resolved, card_dir=tmp_path)
    assert described["name"] == "HuggingFaceTB SmolLM2 135M Instruct (GGUF file model.Q4_1.gguf)"
    assert described["license"] == "apache-2.0" and described["language"] == ["en"] and "hub_id" not in described
    gguf_base = {"source": str(gguf), "kind": "gguf", "revision": "r"}  # no known Hub origin: its file name, no folder
    assert portable_base_fields(gguf_base) == {"base_model_name_or_path": "model.Q4_1.gguf", "revision": None}


def test_local_folder_and_hub_sources(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("---\nlicense: mit\nlanguage: [de, en]\n---\n# my model\n")
    local = describe_base(ResolvedModel(source=str(tmp_path), kind="local", location=str(tmp_path), revision="r"))
    assert local["license"] == "mit" and local["language"] == ["de", "en"] and local["name"] == tmp_path.name
    hub = describe_base(ResolvedModel(source="hf:org/name@" + "a" * 40, kind="hf", location="org/name",
                                      revision="a" * 40))
    assert hub["hub_id"] == "org/name" and "license" not in hub  # nothing cached offline: nothing invented
    assert portable_base_fields({"hf_repo": "org/name", "revision": "a" * 40, "source": "hf:org/name"})["base_model_name_or_path"] == "org/name"
