"""The Hugging Face hub for `hf:` model and data sources: exact pins, `resolve` (the hub's current commit, looked up
once), and a fast, clear failure when it cannot serve a revision (one request with a short timeout, instead of the
libraries' retry loops). The token of a gated repository is huggingface_hub's own: HF_TOKEN, else its token file
(`hf auth login`); labkit never reads, passes or records it."""

from __future__ import annotations

import os
import re

from huggingface_hub import HfApi, snapshot_download, try_to_load_from_cache
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

from labkit.errors import LabkitError

COMMIT = re.compile(r"^[0-9a-f]{40}$")
TIMEOUT_SECONDS = 5.0
RESOLVE = "resolve"  # a revision looked up once, at the experiment's first run (labkit.core.protocol.pin_card)


def check_pin(key: str, revision: str, error: type[LabkitError], where: str = "", allow_resolve: bool = True) -> None:
    """Refuse a hub revision that is not a 40-hex commit hash (a branch or tag moves under the run).

    Args:
        key: the card key, for the message (model.source, data.source.revision…).
        revision: the revision given.
        error: the exception class to raise.
        where: `file:line` prefix for the message, when known.
        allow_resolve: whether `resolve` is accepted (card keys: yes; the `@` of a source string: no).
    Raises:
        error: one line naming the key and the fix.
    """
    if allow_resolve and revision == RESOLVE:
        return
    if not COMMIT.match(revision):
        what = "a branch or tag name" if re.fullmatch(r"[A-Za-z0-9._/-]+", revision) and not re.fullmatch(
            r"[0-9a-fA-F]{7,39}", revision) else "not a full commit hash"
        prefix = f"{where}: " if where else ""
        also = f", or {RESOLVE} to look it up once at the experiment's first run" if allow_resolve else ""
        raise error(f"{prefix}{key}: {revision!r} is {what}, not a pin: use the 40-hex commit hash of that revision "
                    f"(the repository's commit history on the hub lists it){also}")


def offline() -> bool:
    """Whether HF_HUB_OFFLINE asks for the local cache only (read now, not at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def check_reachable(kind: str, repo: str, revision: str, error: type[LabkitError], key: str) -> None:
    """One request to the hub for `repo@revision`, failing in seconds with one line when it cannot be served.

    Args:
        kind: "model" or "dataset".
        repo: the repository id.
        revision: the commit hash.
        error: the exception class to raise.
        key: the card key, for the message.
    Raises:
        error: offline and not cached, hub unreachable, repository or revision not found.
    """
    name = f"hf:{repo}@{revision[:12]}…"
    if offline():
        if kind == "model":
            cached = isinstance(try_to_load_from_cache(repo, "config.json", revision=revision), str)
        else:
            try:
                snapshot_download(repo, repo_type="dataset", revision=revision, local_files_only=True)
                cached = True
            except Exception:  # noqa: BLE001 - not in the cache (LocalEntryNotFoundError and kin)
                cached = False
        if not cached:
            raise error(f"{key}: {name} is not in the local hub cache and HF_HUB_OFFLINE=1 (fetch it once online, or "
                        "point the card at a local copy)")
        return
    _ask(kind, repo, revision, error, key)


def resolve_commit(kind: str, repo: str, error: type[LabkitError], key: str) -> str:
    """The commit the hub's default branch points at now: one request (5 s timeout), no retry loop.

    Args:
        kind: "model" or "dataset".
        repo: the repository id.
        error: the exception class to raise.
        key: the card key, for the message.
    Returns:
        the 40-hex commit hash.
    Raises:
        error: offline, hub unreachable, gated without a token, repository not found.
    """
    if offline():
        raise error(f"{key}: {RESOLVE} needs the hub once to look up hf:{repo}'s current commit, and HF_HUB_OFFLINE=1; "
                    "write the 40-hex commit hash in the card instead")
    sha = getattr(_ask(kind, repo, None, error, key, "check the network, or write the 40-hex commit hash in the card"),
                  "sha", None)
    if not sha or not COMMIT.match(sha):
        raise error(f"{key}: the hub gave no commit for hf:{repo}; write the 40-hex commit hash in the card instead")
    return sha


def _ask(kind: str, repo: str, revision: str | None, error: type[LabkitError], key: str,
         fix: str = "check the network, or set HF_HUB_OFFLINE=1 to use the local cache") -> object:
    """One model_info / dataset_info request; every failure is one line naming the key."""
    name = f"hf:{repo}@{revision[:12]}…" if revision else f"hf:{repo}"
    endpoint = os.environ.get("HF_ENDPOINT") or None
    api = HfApi(endpoint=endpoint)  # the token: HF_TOKEN or the hub's token file, read by huggingface_hub itself
    info = api.model_info if kind == "model" else api.dataset_info
    try:
        return info(repo, revision=revision, timeout=TIMEOUT_SECONDS)
    except GatedRepoError:
        raise error(f"{key}: {name} is gated: accept its terms on the hub and log in (`hf auth login`, or set "
                    "HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise error(f"{key}: {name}: no such revision in that repository (check the commit hash)") from None
    except RepositoryNotFoundError:
        raise error(f"{key}: {name}: no such {kind} repository on the hub (check the name; a private one needs "
                    "`hf auth login`)") from None
    except Exception as exc:  # noqa: BLE001 - connection refused, DNS, timeout: one line, no retry loop
        first = (str(exc).splitlines() or [""])[0][:120]
        raise error(f"{key}: the hub ({endpoint or 'https://huggingface.co'}) cannot be reached for {name} "
                    f"({type(exc).__name__}: {first}); {fix}") from None
