"""Disk full, read-only and corrupt files: one line naming the file and the fix, and nothing already written lost."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

from labkit.card.load import load_card
from labkit.cli.main import main
from labkit.core import io
from labkit.core import runs as R
from labkit.errors import CorruptFile, StorageError


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 1 MiB tmpfs (mounting needs root with CAP_SYS_ADMIN: CI and the dev machines have it)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root with CAP_SYS_ADMIN)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(folder: Path) -> None:
    try:
        with open(folder / "filler", "wb", buffering=0) as handle:
            while True:
                handle.write(b"\0" * 4096)
    except OSError:
        pass


def test_a_full_disk_is_one_line_and_the_old_file_is_kept(small_disk: Path) -> None:
    target = small_disk / "status.json"
    io.write_json(target, {"status": "running"})
    _fill(small_disk)
    with pytest.raises(StorageError) as err:
        io.write_json(target, {"status": "completed", "pad": "x" * 100_000})
    message = str(err.value)
    assert message.startswith(f"{target}: could not be written") and "free disk space" in message and "\n" not in message
    assert json.loads(target.read_text()) == {"status": "running"}
    assert [p.name for p in small_disk.iterdir() if p.name.startswith(".status.json")] == []  # no temporary left


def test_a_run_on_a_full_disk_is_still_recorded_as_failed(small_disk: Path) -> None:
    """The run's reserve (set aside when it started) makes room for recording what happened; past that, one line."""
    run = R.new_run(load_card(REPO / "params" / "smoke.yaml"), small_disk / "runs")
    assert (run.dir / R.RESERVE).stat().st_size == R.RESERVE_BYTES
    _fill(small_disk)
    with pytest.raises(StorageError):
        io.write_json(run.dir / "baseline" / "baseline_metrics.json", {"pad": "x" * 100_000})  # the stage's failure
    R.record(run, "failed", status="failed", stage="baseline", error="StorageError: No space left on device")
    assert run.status()["status"] == "failed" and not (run.dir / R.RESERVE).exists()
    assert R.read_registry(run.root)[-1]["event"] == "failed"
    with pytest.raises(StorageError, match="could not be written"):
        R.record(run, "stage_done", stage="baseline", seconds=1.0, pad="x" * 600_000)


def test_a_corrupt_status_file_is_one_line_naming_it(tmp_path: Path, capsys) -> None:
    run = R.new_run(load_card(REPO / "params" / "smoke.yaml"), tmp_path)
    run.status_path.write_text('{"status": "runn')
    with pytest.raises(CorruptFile, match=rf"{run.status_path}: cannot be read back"):
        run.status()
    assert main(["--runs", str(tmp_path), "runs"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert str(run.status_path) in line


def test_a_read_only_file_system_is_one_line_with_the_fix(small_disk: Path) -> None:
    target = small_disk / "runs" / "status.json"
    io.write_json(target, {"status": "running"})
    if subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], capture_output=True).returncode:
        pytest.skip("cannot remount the tmpfs read-only here")
    with pytest.raises(StorageError) as err:
        io.write_json(target, {"status": "completed"})
    assert str(err.value).startswith(f"{target}: could not be written") and "read-only" in str(err.value)
    assert json.loads(target.read_text()) == {"status": "running"}
