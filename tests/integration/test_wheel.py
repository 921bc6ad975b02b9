"""labkit as a user installs it: a wheel built from the repository, installed into a fresh venv outside the checkout by
the notebooks' Colab/Kaggle set-up cell, then `labkit --version`, `labkit init` and `labkit run` on the smoke card.

Offline: the fresh venv (made without pip) sees the project venv's installed libraries (torch, transformers, papermill,
pip…) through a `.pth` file pointing at a mirror of its site-packages without labkit itself, so pip resolves every
dependency as already installed (PIP_NO_INDEX=1) and installs only the wheel, into the fresh venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest
from conftest import REPO

import labkit
from labkit.core import io
from labkit.core.runs import NOTEBOOKS, STAGES

SOURCES = ("pyproject.toml", "README.md", "labkit", "notebooks", "params")


def _venv_site(venv: Path) -> Path:
    return Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The wheel, a fresh venv that sees the project's libraries but not labkit, and a clean environment."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for name in SOURCES:  # a copy: building writes build/ and *.egg-info next to the sources
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        copy(REPO / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree
                                         else {}))
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "-o", str(base / "dist"),
                            str(src)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = (base / "dist").glob("labkit-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    # named site-packages: dill (datasets' fingerprints) pickles modules from elsewhere by value, and fails
    mirror = base / "deps" / "site-packages"
    mirror.mkdir(parents=True)
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower()
        if not (name.startswith(("labkit", "__editable__", "_distutils_hack", "distutils-precedence"))
                or name.endswith(".pth")):
            (mirror / entry.name).symlink_to(entry)
    (_venv_site(venv) / "labkit_test_deps.pth").write_text(f"{mirror}\n")
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "LABKIT_RUNS",
                                                              "COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE"}}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", PIP_NO_INDEX="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    return {"wheel": wheel, "venv": venv, "env": env, "base": base}


def _run(fresh: dict, args: list[str], cwd: Path, timeout: int = 600, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env={**fresh["env"], **extra}, capture_output=True, text=True, timeout=timeout)


def _setup_cell() -> str:
    return nbformat.read(REPO / "notebooks" / NOTEBOOKS[STAGES[0]], as_version=4).cells[1].source


def test_wheel_ships_the_notebooks_and_cards(fresh: dict) -> None:
    import zipfile

    names = set(zipfile.ZipFile(fresh["wheel"]).namelist())
    assert {f"labkit/notebooks/{nb}" for nb in NOTEBOOKS.values()} <= names
    cards = {p.relative_to(REPO).as_posix() for p in (REPO / "params").rglob("*") if p.is_file()}
    assert {f"labkit/{c}" for c in cards} <= names, sorted(cards - {n[len("labkit/"):] for n in names})


def test_setup_cell_installs_the_wheel_on_colab_only(fresh: dict) -> None:
    python = str(fresh["venv"] / "bin" / "python")
    upload = fresh["base"] / "content"  # what Colab's /content holds after uploading the notebook and the wheel
    upload.mkdir()
    shutil.copy2(fresh["wheel"], upload)
    cell = _setup_cell()
    elsewhere = _run(fresh, [python, "-c", cell], upload)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert _run(fresh, [python, "-c", "import labkit"], upload).returncode != 0, "the cell installs only on Colab/Kaggle"
    colab = _run(fresh, [python, "-c", cell], upload, COLAB_RELEASE_TAG="release-colab-test")
    assert colab.returncode == 0, colab.stdout[-3000:] + colab.stderr[-3000:]
    where = _run(fresh, [python, "-c", "import labkit; print(labkit.__file__)"], upload)
    assert Path(where.stdout.strip()).is_relative_to(fresh["venv"]), where.stdout + where.stderr
    version = _run(fresh, [str(fresh["venv"] / "bin" / "labkit"), "--version"], upload)
    assert version.returncode == 0 and version.stdout.strip() == f"labkit {labkit.__version__}"


def test_init_then_run_the_smoke_card_outside_the_checkout(fresh: dict) -> None:
    command = str(fresh["venv"] / "bin" / "labkit")
    if not Path(command).exists():
        pytest.skip("the wheel was not installed (test_setup_cell_installs_the_wheel_on_colab_only failed)")
    work = fresh["base"] / "work"
    first = _run(fresh, [command, "init", str(work)], fresh["base"])
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in (work / "notebooks").iterdir()) == sorted(NOTEBOOKS.values())
    assert (work / "params" / "smoke.yaml").read_bytes() == (REPO / "params" / "smoke.yaml").read_bytes()
    (work / "params" / "smoke.yaml").write_text((work / "params" / "smoke.yaml").read_text() + "# mine\n")
    again = _run(fresh, [command, "init", str(work)], fresh["base"])
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1, again.stderr
    assert "already exists" in again.stderr and (work / "params" / "smoke.yaml").read_text().endswith("# mine\n")

    bare = fresh["base"] / "bare"  # no params/ here: the card shipped in the package is used, runs go here
    bare.mkdir()
    check = _run(fresh, [command, "check", "../params/smoke.yaml"], bare)
    assert check.returncode == 0 and str(fresh["venv"]) in check.stdout, check.stdout + check.stderr
    assert not (bare / "runs").exists(), "labkit check writes nothing"

    run = _run(fresh, [command, "run", "params/smoke.yaml"], work)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (run_dir,) = [p for p in (work / "runs" / "smoke").iterdir() if not p.name.startswith("_")]
    assert io.read_json(run_dir / "status.json")["status"] == "completed"
    assert sorted(p.name for p in (run_dir / "notebooks").iterdir()) == sorted(NOTEBOOKS.values())
