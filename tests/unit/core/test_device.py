"""The device profile captured on this machine (a CPU) and recorded profiles round-trip."""

from __future__ import annotations

import json

from labkit.core.device import DeviceProfile, capture, gpu_driver, load_profile


def test_capture_on_the_cpu(tmp_path) -> None:
    p = capture("cpu")
    assert (p.type, p.device, p.is_gpu, p.native_bf16, p.memory_gib) == ("cpu", "cpu", False, False, None)
    assert p.describe() == "cpu" and gpu_driver(p) == {"tool": None, "driver": None, "mig_mode": None}
    (tmp_path / "p.json").write_text(json.dumps(p.as_dict()))
    assert load_profile(tmp_path / "p.json") == p  # as_dict's derived native_bf16 is ignored on the way back


def test_rocm_uses_the_cuda_device_namespace() -> None:
    p = DeviceProfile(type="rocm", name="AMD Instinct MI300X", arch="gfx942:sramecc+:xnack-", memory_gib=192.0)
    assert p.device == "cuda" and p.is_gpu and p.native_bf16
    assert p.describe() == "1 × AMD Instinct MI300X (rocm, gfx942:sramecc+:xnack-, 192 GiB each)"


def test_env_json_records_the_profile_and_the_distributed_backend(monkeypatch) -> None:
    from labkit.core.environment import capture as environment

    env = environment()
    acc = env["accelerators"]
    assert acc["type"] == "cpu" and acc["native_bf16"] is False and "nccl" in acc
    assert env["distributed"] == {"world_size": 1, "backend": None, "initialized": False, "local_rank": None}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert environment()["distributed"] == {"world_size": 2, "backend": "gloo", "initialized": False, "local_rank": 1}
