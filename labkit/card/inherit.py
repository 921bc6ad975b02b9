"""How a child card's keys combine with its parent's (`parent:`): mappings merge key by key, a list or a scalar in the
child replaces the parent's — except where the child picks another kind of a section that comes in kinds.

`method` comes in kinds (`full`, `lora`, `qlora`) and `data.source` in kinds named by their first key (`builtin`,
`path`, `hf`, `files`). A child that picks another kind keeps only the parent's keys the new kind takes: `method:
{kind: full}` under a LoRA parent drops `r`, `alpha`, `dropout`, `target_modules`; `kind: qlora` under it keeps them;
`data: {source: {path: mine.jsonl}}` under the built-in tickets drops `rows` and `seed`. `data.target_format` takes
keys by its `kind` (`TargetFormat.KIND_ONLY`): `{kind: label}` under a JSON target drops `required_keys`,
`optional_keys` and `category_key`. A key the child writes itself is never dropped, so one its kind does not take is
still refused, at its line.
"""

from __future__ import annotations

import copy
from typing import Any, get_args

from pydantic import BaseModel

from labkit.card.experiment_and_data import DataSource, TargetFormat
from labkit.card.schema import Method

# the kinds, read from the schema's unions: a method by its `kind` literal, a source by its first required key
_METHODS: dict[str, type[BaseModel]] = {get_args(cls.model_fields["kind"].annotation)[0]: cls
                                        for cls in get_args(get_args(Method)[0])}
_SOURCES: dict[str, type[BaseModel]] = {next(k for k, f in cls.model_fields.items() if f.is_required()): cls
                                        for cls in get_args(DataSource)}


def _kind(where: tuple[str, ...], section: dict[str, Any]) -> type[BaseModel] | None:
    """The kind a mapping at `where` picks (None: not a section with kinds, or it names none)."""
    if where == ("method",):
        return _METHODS.get(section.get("kind"))  # type: ignore[arg-type]
    if where == ("data", "source"):
        return next((cls for key, cls in _SOURCES.items() if key in section), None)
    return None


def _dropped(where: tuple[str, ...], parent: dict[str, Any], child: dict[str, Any]) -> set[str]:
    """The parent's keys at `where` that the kind the child picks does not take (none when it picks no other kind)."""
    if where == ("data", "target_format"):
        kind = child.get("kind")
        if kind is None or kind == parent.get("kind"):
            return set()
        return {key for key in parent if TargetFormat.KIND_ONLY.get(key, kind) != kind}
    cls = _kind(where, child)
    if cls is None or cls is _kind(where, parent):
        return set()
    return {key for key in parent if key not in cls.model_fields}


def merge(parent: dict[str, Any], child: dict[str, Any], where: tuple[str, ...] = ()) -> dict[str, Any]:
    """A child card's mapping over its parent's.

    Args:
        parent: the parent's (resolved) mapping.
        child: the child's mapping as written.
        where: the keys above these mappings (() for the whole card).
    Returns:
        a new mapping: the parent's keys, merged or replaced by the child's; under a child that picks another kind of
        `method`, `data.source` or `data.target_format`, only the parent's keys that kind takes.
    """
    dropped = _dropped(where, parent, child)
    out = copy.deepcopy({key: value for key, value in parent.items() if key not in dropped})
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value, (*where, key))
        else:
            out[key] = copy.deepcopy(value)
    return out
