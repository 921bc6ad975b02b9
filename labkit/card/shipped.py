"""The files shipped inside the labkit package: the stage notebooks and the example cards.

In git there is one copy, the repository's top-level `notebooks/` and `params/`; the wheel maps them onto
`labkit/notebooks/` and `labkit/params/` (pyproject.toml's package-dir and package-data). Installed from a wheel,
they are found inside the package; in a checkout (editable install included), next to it. `labkit init` copies them
into a working folder, and a card path such as the notebooks' default `../params/quickstart.yaml` falls back to the
shipped copy when there is no local `params/` folder (Colab, Kaggle, a bare folder).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from labkit.errors import MissingInput, UsageError

PACKAGE = Path(__file__).resolve().parent.parent
KINDS = ("notebooks", "params")


def shipped(kind: str) -> Path:
    """The shipped folder of one kind.

    Args:
        kind: "notebooks" or "params".
    Returns:
        the folder inside the installed package, else the checkout's top-level folder.
    Raises:
        MissingInput: neither exists (a broken install).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r} (expected one of {KINDS})")
    for folder in (PACKAGE / kind, PACKAGE.parent / kind):
        if folder.is_dir() and any(folder.iterdir()):
            return folder
    raise MissingInput(f"labkit's {kind}/ were not found in {PACKAGE} nor next to it (reinstall labkit: "
                       "pip install --force-reinstall labkit)")


def is_shipped(path: Path) -> bool:
    """Whether a path lies inside the installed package (a shipped card: its runs do not go there)."""
    return path.resolve().is_relative_to(PACKAGE)


def shipped_card(path: str | Path) -> Path | None:
    """The shipped copy of a card path that names a missing `params/` folder, e.g. `../params/quickstart.yaml`.

    Args:
        path: the card path as given (relative to the working folder, or absolute).
    Returns:
        the shipped card, or None when the path has no `params` part, its `params/` folder exists locally
        (a missing file there is the user's to fix), or the package has no such card.
    """
    given = Path(path).expanduser()
    parts = given.parts
    if "params" not in parts:
        return None
    cut = len(parts) - 1 - parts[::-1].index("params")
    if Path(*parts[: cut + 1]).resolve().is_dir():
        return None
    candidate = shipped("params").joinpath(*parts[cut + 1:])
    return candidate if candidate.is_file() else None


def init_folder(dest: str | Path) -> list[Path]:
    """Copy the shipped notebooks and cards into `dest/notebooks` and `dest/params` (as torchtune's `tune cp`).

    Args:
        dest: the working folder (created when missing).
    Returns:
        the files written, in order.
    Raises:
        UsageError: a file would be overwritten (nothing is written then) or `dest` is a file.
    """
    dest = Path(dest).expanduser().resolve()
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"{dest}: is a file; labkit init needs a folder (a new or an empty one)")
    plan: list[tuple[Path, Path]] = []
    for kind in KINDS:
        source = shipped(kind)
        for file in sorted(source.rglob("*")):
            if file.is_file() and "__pycache__" not in file.parts and not file.name.startswith("."):
                plan.append((file, dest / kind / file.relative_to(source)))
    existing = [target for _, target in plan if target.exists() or target.is_symlink()]  # a dangling link too
    if existing:
        raise UsageError(f"{existing[0]}: already exists ({len(existing)} of the {len(plan)} files labkit init writes "
                         "do); labkit init never overwrites: choose a new folder, or move those files away")
    outside = [target for _, target in plan if not Path(os.path.realpath(target)).is_relative_to(dest)]
    if outside:
        raise UsageError(f"{outside[0]}: a symbolic link in the way leads outside {dest}; labkit init writes only "
                         "inside its folder: remove the link or choose a new folder")
    for source, target in plan:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(source, "rb") as src, open(target, "xb") as dst:  # "x": never through a link or over a file
            shutil.copyfileobj(src, dst)
    return [target for _, target in plan]
