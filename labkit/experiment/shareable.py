"""Text for a folder meant for sharing: this machine's absolute paths made relative, or named by what they are.

The experiment's report is zipped and sent: it must not carry the home folder, /tmp, the virtual environment or the
project's location. `machine_prefixes` lists the folders a page can mention, the most specific first, with what
each becomes: the folder that holds the runs folder (the project) and the working folder become relative paths
(`runs/<experiment>/<run_id>`, `params/x.yaml`), labkit's source checkout `$LABKIT`, its cache `$LABKIT_CACHE`,
Python's prefix `$PYTHON`, the temporary folder `$TMPDIR`, the home folder `~`. `shareable` rewrites a text with them.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

import labkit


def machine_prefixes(root: Path) -> list[tuple[str, str]]:
    """The absolute folders a report may mention and their shareable spelling, longest first.

    Args:
        root: the runs root (its parent is taken as the project folder).
    Returns:
        [(absolute folder, replacement ending in "/" or "")], one entry per folder.
    """
    source = Path(labkit.__file__).resolve().parent.parent
    cache = os.environ.get("LABKIT_CACHE")
    named = [(Path(root).parent, ""), (Path.cwd(), ""),
             *([(source, "$LABKIT/")] if (source / "pyproject.toml").exists() else []),
             *([(Path(cache).expanduser(), "$LABKIT_CACHE/")] if cache else []),
             (Path(sys.prefix), "$PYTHON/"), (Path(sys.base_prefix), "$PYTHON/"),
             (Path(tempfile.gettempdir()), "$TMPDIR/"), (Path.home(), "~/")]
    found: dict[str, str] = {}
    for folder, spelling in named:
        for variant in (folder.absolute(), folder.resolve()):
            if len(variant.parts) > 2 or (len(variant.parts) == 2 and spelling not in ("", "$PYTHON/")):
                found.setdefault(str(variant), spelling)  # never "/" itself; "/usr" as Python's prefix is too broad
    return sorted(found.items(), key=lambda item: -len(item[0]))


def shareable(text: str, prefixes: list[tuple[str, str]]) -> str:
    """`text` with every path under one of `prefixes` rewritten (a folder itself becomes its spelling, or ".").

    Args:
        text: a page, JSON text or any text.
        prefixes: from `machine_prefixes`.
    Returns:
        the text with no path under those folders left absolute; a path under another machine folder (LEFT) is
        shown as its last part.
    """
    text = _known(text, prefixes)
    return LEFT.sub(lambda m: "…/" + m.group(0).rstrip("/").rsplit("/", 1)[-1], text)


# a path under a top-level folder of a machine that no prefix named (another user's home, a data disk): shown as its
# last part (not Colab's /content nor Kaggle's /kaggle: the set-up cell of every notebook names them as they are)
LEFT = re.compile(r"(?<![\w.~$/:,=+-])/(?:home|Users|root|tmp|var|private|mnt|media|srv|data|opt|work|scratch|"
                  r"workspace|usr|etc)(?:/[\w.@+-]+)+/?(?![\w*])")


def _known(text: str, prefixes: list[tuple[str, str]]) -> str:
    for folder, spelling in prefixes:
        before = r"(?<![\w.~$-])" + re.escape(folder)  # the folder where a path starts, not inside a longer name
        text = re.sub(before + "/", lambda _m, s=spelling: s, text)
        text = re.sub(before + r"(?![\w.-])", lambda _m, s=spelling: s.rstrip("/") or ".", text)
    return text
