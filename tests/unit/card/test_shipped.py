"""The files shipped with labkit: the package list, `labkit init`, and cards found in the package without params/."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from labkit.card.load import load_card
from labkit.card.shipped import init_folder, shipped, shipped_card
from labkit.cli.main import main
from labkit.core.runs import NOTEBOOKS, project_root
from labkit.errors import UsageError

REPO = Path(__file__).resolve().parents[3]


def test_pyproject_lists_every_package_and_maps_the_data_folders() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    code = {p.parent.relative_to(REPO).as_posix().replace("/", ".") for p in (REPO / "labkit").rglob("__init__.py")}
    data = {name for name in config["packages"] if name not in code}
    assert code <= set(config["packages"]), sorted(code - set(config["packages"]))
    assert {config["package-dir"][name] for name in data} == {
        p.relative_to(REPO).as_posix() for folder in ("notebooks", "params") for p in [REPO / folder,
                                                                                        *(REPO / folder).rglob("*")]
        if p.is_dir() and p.name != "__pycache__"}
    suffixes = {p.suffix for folder in ("notebooks", "params") for p in (REPO / folder).rglob("*") if p.is_file()}
    shipped_patterns = {pattern[1:] for patterns in config["package-data"].values() for pattern in patterns}
    assert suffixes <= shipped_patterns, f"files of these kinds would not ship: {sorted(suffixes - shipped_patterns)}"


def test_version_is_one_string(capsys: pytest.CaptureFixture) -> None:
    import labkit

    assert "version" not in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"labkit {labkit.__version__}"


def test_init_copies_and_never_overwrites(tmp_path: Path) -> None:
    written = init_folder(tmp_path / "lab")
    assert sorted(p.name for p in (tmp_path / "lab" / "notebooks").iterdir()) == sorted(NOTEBOOKS.values())
    assert (tmp_path / "lab" / "params" / "quickstart.yaml").read_bytes() == (REPO / "params/quickstart.yaml").read_bytes()
    assert len(written) == sum(1 for f in ("notebooks", "params") for p in shipped(f).rglob("*") if p.is_file())
    (tmp_path / "other" / "params").mkdir(parents=True)
    (tmp_path / "other" / "params" / "smoke.yaml").write_text("mine")
    with pytest.raises(UsageError, match="smoke.yaml: already exists"):
        init_folder(tmp_path / "other")
    assert (tmp_path / "other" / "params" / "smoke.yaml").read_text() == "mine"
    assert not (tmp_path / "other" / "notebooks").exists(), "nothing is written when one file exists"


def test_init_command_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["init", str(tmp_path)]) == 0
    assert main(["init", str(tmp_path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_card_falls_back_to_the_shipped_one_without_params(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert shipped_card("../params/quickstart.yaml") == shipped("params") / "quickstart.yaml"
    loaded = load_card("../params/examples/ticket-qlora.yaml")  # with its parent, from the package
    assert loaded.card.experiment.id and loaded.path.parent.name == "examples"
    (tmp_path / "params").mkdir()  # a local params/ folder: a missing file there stays an error
    assert shipped_card("params/quickstart.yaml") is None
    assert shipped_card("nothing/quickstart.yaml") is None


def test_runs_of_a_card_inside_the_package_go_to_the_working_folder(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import labkit.core.runs as R

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(R, "is_shipped", lambda path: path.is_relative_to(REPO / "params"))
    assert project_root(REPO / "params") == tmp_path


def test_init_never_writes_through_a_link_or_outside_its_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "work"
    (dest / "params").mkdir(parents=True)
    (dest / "params" / "quickstart.yaml").symlink_to(outside / "victim.yaml")  # dangling: exists() is False
    with pytest.raises(UsageError, match="already exists"):
        init_folder(dest)
    (dest / "params" / "quickstart.yaml").unlink()
    (dest / "params").rmdir()
    (dest / "params").symlink_to(outside)  # a folder link leading out
    with pytest.raises(UsageError, match="leads outside"):
        init_folder(dest)
    assert list(outside.iterdir()) == [] and not (dest / "notebooks").exists()
