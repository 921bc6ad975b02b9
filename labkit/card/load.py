"""Load experiment cards: YAML, `parent:` inheritance, one-line errors, diff and hash.

Every problem with a card is raised as `CardError`, whose message is a single line
`<file>:<line>: <key.path>: <what is wrong> (<what was expected>)`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from labkit.card.consistency import check_consistency
from labkit.card.experiment_and_data import HubSource
from labkit.card.inherit import merge
from labkit.card.schema import Card
from labkit.card.shipped import shipped_card
from labkit.card.update import updated
from labkit.errors import CardError


@dataclass(frozen=True)
class LoadedCard:
    """A validated card with where it came from (frozen, like the card).

    Attributes:
        card: the validated, resolved card.
        path: the card file that was loaded.
        chain: the files of the inheritance chain, child first.
        resolved: the resolved card as plain data (what is archived as card.yaml).
        diff: keys this card changes against its parent (empty without parent).
    """

    card: Card
    path: Path
    chain: list[Path]
    resolved: dict[str, Any]
    diff: dict[str, Any] = field(default_factory=dict)

    def where(self, key: str) -> str:
        """`file:line` of a dotted key in the card or the parent that sets it (the card's path when no file does)."""
        loc = tuple(int(p) if p.isdigit() else p for p in key.split("."))
        nodes = [(path, yaml.compose(path.read_text(encoding="utf-8"))) for path in self.chain]
        for exact in (True, False):  # the file that writes the key itself, else the deepest part of it written
            for path, node in nodes:
                line = _line_of(node, loc, exact=exact)
                if line is not None:
                    return f"{path}:{line}"
        return str(self.path)

    @property
    def hash(self) -> str:
        """Short sha256 of the resolved card's non-default values (stable across key order, and across labkit
        versions that add optional keys: a new key at its default leaves the hash of an archived card unchanged)."""
        return card_hash(self.card.model_dump(mode="json", exclude_defaults=True))


def card_hash(resolved: dict[str, Any]) -> str:
    """Return the first 8 hex digits of the sha256 of a canonical JSON dump."""
    blob = json.dumps(resolved, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def _decode(path: Path) -> str:
    """The card's text; bytes that are not UTF-8 are one line naming the byte offset and its line."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise CardError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                        "save the card as UTF-8") from None


def _check_duplicates(path: Path, node: yaml.Node | None, prefix: str = "") -> None:
    """A key given twice in one mapping is an error naming both lines (YAML would silently keep the last)."""
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(path, item, f"{prefix}{i}.")
    if not isinstance(node, yaml.MappingNode):
        return
    seen: dict[str, int] = {}
    for key_node, value_node in node.value:
        if isinstance(key_node, yaml.ScalarNode):
            line = key_node.start_mark.line + 1
            if key_node.value in seen:
                raise CardError(f"{path}:{line}: {prefix}{key_node.value}: given twice (lines {seen[key_node.value]} "
                                f"and {line}); keep one (YAML would silently use the last)")
            seen[key_node.value] = line
            _check_duplicates(path, value_node, f"{prefix}{key_node.value}.")


def _read_yaml(path: Path, referenced_by: str | None = None) -> tuple[dict[str, Any], yaml.Node | None]:
    if not path.is_file():
        if referenced_by:
            raise CardError(f"{referenced_by}: parent: card not found: {path} (a parent path is relative to the "
                            "card that names it; fix the parent: line)")
        raise CardError(f"{path}: card file not found (give the path of a .yaml card, e.g. params/quickstart.yaml)")
    text = _decode(path)
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise CardError(f"{where}: not valid YAML: {problem} (fix the syntax on that line)") from None
    if data is None:
        raise CardError(f"{path}: the card is empty (expected the sections experiment, data, model, method)")
    if not isinstance(data, dict):
        raise CardError(f"{path}:1: the card must be a mapping of sections, got {type(data).__name__}")
    _check_duplicates(path, node)
    return data, node


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...], exact: bool = False) -> int | None:
    """Find the 1-based line of a key path in a composed YAML node (deepest key found; with exact, None unless the
    whole path is there)."""
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if key_node.value == str(part):
                    line, node = key_node.start_mark.line + 1, value_node
                    break
            else:
                return None if exact else line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return None if exact else line
    return line


def card_diff(parent: Any, child: Any, prefix: str = "") -> dict[str, Any]:
    """Flat {dotted.key: {"parent": a, "card": b}} of what differs."""
    if isinstance(parent, dict) and isinstance(child, dict):
        out: dict[str, Any] = {}
        for key in sorted(set(parent) | set(child), key=str):
            out.update(card_diff(parent.get(key), child.get(key), f"{prefix}{key}."))
        return out
    if parent != child:
        return {prefix.rstrip("."): {"parent": parent, "card": child}}
    return {}


def _resolve_relative(ref: str, base: Path) -> Path:
    """Resolve a path written in a card: relative to the card's own folder (never a folder above it)."""
    candidate = Path(ref).expanduser()
    if candidate.is_absolute():
        return candidate
    return (base.parent / candidate).resolve()


def _expected(err: dict[str, Any]) -> str:
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown key: remove it or check its spelling against the card reference in docs/cards.md"
    if kind == "missing":
        return "required key is missing: add it"
    if kind == "literal_error":
        return f"expected one of {ctx.get('expected', '')}"
    if "expected" in ctx:
        return f"expected {ctx['expected']}"
    return err.get("msg", "invalid value")


_UNION_TAGS = {"BuiltinSource", "PathSource", "HubSource", "FilesSource", "RegexRule", "full", "lora", "qlora", "str", "list[str]", "int",
               "float", "bool", "constrained-str"}


def _is_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in _UNION_TAGS or part == "[key]"
                                      or part.startswith(("function-", "literal[", "dict[")))


def _format_error(exc: ValidationError, chain: list[tuple[Path, yaml.Node | None, dict[str, Any]]]) -> str:
    errors = exc.errors()
    # A union reports one error per member: group by the path before the first union tag.
    groups = {tuple(p for p in e["loc"][: next((i for i, p in enumerate(e["loc"]) if _is_tag(p)), None)]) for e in errors}
    # keep the most specific path; a mapping member whose key did not match is the least informative.
    candidates = [e for e in errors if "[key]" not in e["loc"]] or errors
    depth = lambda e: len([p for p in e["loc"] if not _is_tag(p)])  # noqa: E731
    err = max(candidates, key=depth)
    cut = next((i for i, p in enumerate(err["loc"]) if _is_tag(p)), None)
    if cut is not None:  # a union's members each fail: the one meant has the fewest errors (then the deepest)
        members = Counter(e["loc"][:cut + 1] for e in candidates if e["loc"][:cut] == err["loc"][:cut])
        err = min((e for e in candidates if e["loc"][:cut + 1] in members),
                  key=lambda e: (members[e["loc"][:cut + 1]], -depth(e)))
    loc = tuple(p for p in err["loc"] if not _is_tag(p))
    key = ".".join(str(p) for p in loc) or "<card>"
    where = str(chain[0][0])
    for path, node, _ in chain:  # the file that defines the deepest part of the key
        line = _line_of(node, loc)
        if line is not None:
            where = f"{path}:{line}"
            break
    got = err.get("input")
    quiet = err["type"] in {"missing", "extra_forbidden", "value_error"} or isinstance(got, dict)
    got_text = "" if quiet else f"; got {got!r}"
    detail = _expected(err) if err["type"] in {"extra_forbidden", "missing", "literal_error"} else err["msg"]
    detail = detail.removeprefix("Value error, ")
    if err["type"] == "value_error" and ": " in detail and loc == ():  # card-level check naming its own key
        key, detail = detail.split(": ", 1)
        for path, node, _ in chain:
            line = _line_of(node, tuple(int(p) if p.isdigit() else p for p in key.split(".")))
            if line is not None:
                where = f"{path}:{line}"
                break
    more = f" (+{len(groups) - 1} more problem{'s' if len(groups) > 2 else ''})" if len(groups) > 1 else ""
    return f"{where}: {key}: {detail}{got_text}{more}".replace("\n", " ")


def load_card(path: str | Path) -> LoadedCard:
    """Load, resolve (`parent:` chain) and validate a card.

    Args:
        path: the card file; a path into a `params/` folder that does not exist here (the notebooks' default
            `../params/quickstart.yaml` on Colab) loads the card shipped with labkit (labkit.card.shipped).
    Returns:
        LoadedCard with the validated card, its resolved data and its diff against the parent.
    Raises:
        CardError: one line naming the file, line, key and the fix.
    """
    given, path = path, Path(path).expanduser().resolve()
    if not path.is_file():
        path = shipped_card(given) or path
    chain: list[tuple[Path, yaml.Node | None, dict[str, Any]]] = []
    current, referenced_by = path, None
    while True:
        if any(current == p for p, _, _ in chain):
            raise CardError(f"{referenced_by}: parent: inheritance cycle ({' -> '.join(str(p) for p, _, _ in chain)} "
                            f"-> {current}); remove one parent: line")
        data, node = _read_yaml(current, referenced_by)
        chain.append((current, node, data))
        parent_ref = data.get("parent")
        if parent_ref is None:
            break
        if not isinstance(parent_ref, str):
            raise CardError(f"{current}:{_line_of(node, ('parent',))}: parent: expected a path to a card, got {parent_ref!r}")
        referenced_by = f"{current}:{_line_of(node, ('parent',))}"
        current = _resolve_relative(parent_ref, current)
    resolved: dict[str, Any] = {}
    for _, _, data in reversed(chain):
        resolved = merge(resolved, {k: v for k, v in data.items() if k != "parent"})
    try:
        card = Card.model_validate(resolved)
    except ValidationError as exc:
        raise CardError(_format_error(exc, chain)) from None
    card = _check_paths(card, path, chain)
    parent_resolved: dict[str, Any] = {}
    for _, _, data in reversed(chain[1:]):  # none without a parent
        parent_resolved = merge(parent_resolved, {k: v for k, v in data.items() if k != "parent"})
    full = card.model_dump(mode="json")
    if card.data.split.from_source is not None and isinstance(card.data.source, HubSource):
        del full["data"]["source"]["split"]  # unused (the mapping names the splits): an archived copy must reload
    diff = card_diff(_normalise(_paths_resolved(parent_resolved, chain[1:])), _normalise(full)) if len(chain) > 1 else {}
    loaded = LoadedCard(card=card, path=path, chain=[p for p, _, _ in chain], resolved=full, diff=diff)
    check_consistency(card, loaded.where)  # settings that would silently do nothing (labkit.card.consistency)
    return loaded


def _normalise(data: dict[str, Any]) -> dict[str, Any]:
    """Validate a parent's data leniently for diffing (defaults filled when it validates)."""
    try:
        return Card.model_validate(data).model_dump(mode="json")
    except ValidationError:
        return data


def _paths_resolved(data: dict[str, Any], chain: list[tuple[Path, yaml.Node | None, dict[str, Any]]]) -> dict[str, Any]:
    """A parent's data with its paths resolved as `_check_paths` resolves the child's: a diff compares files, not spellings."""
    def resolve(ref: Any, loc: tuple[str, ...]) -> Any:
        if not isinstance(ref, str) or (loc == ("model", "source") and _SCHEME.match(ref)):
            return ref
        return str(_resolve_relative(ref, next((p for p, n, _ in chain if _line_of(n, loc, exact=True)), chain[0][0])))
    out = copy.deepcopy(data)
    source = (out.get("data") or {}).get("source") or {}
    if "path" in source:
        source["path"] = resolve(source["path"], ("data", "source", "path"))
    if isinstance(source.get("files"), dict):
        source["files"] = {k: resolve(v, ("data", "source", "files", k)) for k, v in source["files"].items()}
    if isinstance(out.get("model"), dict) and "source" in out["model"]:
        out["model"]["source"] = resolve(out["model"]["source"], ("model", "source"))
    return out


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")  # pypi:, hf:, tiny:… (2+ letters: not a Windows drive)


def _check_paths(card: Card, card_path: Path, chain: list[tuple[Path, yaml.Node | None, dict[str, Any]]]) -> Card:
    """The card with its data and model paths resolved against the folder of the card that sets each (the card itself
    or the parent it inherits the path from), absolute in the resolved card."""
    def setter(loc: tuple[str, ...]) -> tuple[Path, int | None]:
        for path, node, _ in chain:  # the card that writes the key itself (not only its section)
            line = _line_of(node, loc, exact=True)
            if line is not None:
                return path, line
        return card_path, None

    def where(loc: tuple[str, ...]) -> str:
        path, line = setter(loc)
        return f"{path}:{line}" if line is not None else str(path)

    changes: dict[str, Any] = {}
    source = card.data.source
    if hasattr(source, "path"):
        resolved = _resolve_relative(source.path, setter(("data", "source", "path"))[0])
        if resolved.is_dir():
            raise CardError(f"{where(('data', 'source', 'path'))}: data.source.path: {source.path} is a folder, not a "
                            "data file (name the .jsonl, .json, .csv or .parquet file in it)")
        if not resolved.exists():
            raise CardError(f"{where(('data', 'source', 'path'))}: data.source.path: file not found: {source.path} "
                            f"(looked for {resolved}; paths are relative to the folder of the card that writes them)")
        changes["data.source.path"] = str(resolved)
    files = getattr(source, "files", None) or {}
    for name, ref in files.items():  # a files source: one file per split
        resolved = _resolve_relative(ref, setter(("data", "source", "files", name))[0])
        if not resolved.is_file():
            raise CardError(f"{where(('data', 'source', 'files', name))}: data.source.files.{name}: file not found: {ref} "
                            f"(looked for {resolved}; paths are relative to the folder of the card that writes them)")
    if files:
        changes["data.source.files"] = {name: str(_resolve_relative(ref, setter(("data", "source", "files", name))[0]))
                                        for name, ref in files.items()}
    model = card.model.source
    if not _SCHEME.match(model):  # a local model folder or .gguf file
        resolved = _resolve_relative(model, setter(("model", "source"))[0])
        if not resolved.exists():
            raise CardError(f"{where(('model', 'source'))}: model.source: no such file or folder: {model} (looked for "
                            f"{resolved}; paths are relative to the folder of the card that writes them)")
        changes["model.source"] = str(resolved)
    return updated(card, changes) if changes else card


def dump_yaml(data: dict[str, Any]) -> str:
    """YAML text of a resolved card or diff, keys in card order."""
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
