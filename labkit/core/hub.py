"""The Hugging Face hub for `hf:` model and data sources: exact pins, and a fast, clear failure when it
cannot serve a revision (one request with a short timeout, instead of the libraries' retry loops)."""

from __future__ import annotations

import os
import re

from labkit.errors import LabkitError

COMMIT = re.compile(r"^[0-9a-f]{40}$")
TIMEOUT_SECONDS = 5.0


def check_pin(key: str, revision: str, error: type[LabkitError], where: str = "") -> None:
    """Refuse a hub revision that is not a 40-hex commit hash (a branch or tag moves under the run).

    Args:
        key: the card key, for the message (model.source, data.source.revision…).
        revision: the revision given.
        error: the exception class to raise.
        where: `file:line` prefix for the message, when known.
    Raises:
        error: one line naming the key and the fix.
    """
    if not COMMIT.match(revision):
        what = "a branch or tag name" if re.fullmatch(r"[A-Za-z0-9._/-]+", revision) and not re.fullmatch(
            r"[0-9a-fA-F]{7,39}", revision) else "not a full commit hash"
        prefix = f"{where}: " if where else ""
        raise error(f"{prefix}{key}: {revision!r} is {what}, not a pin: use the 40-hex commit hash of that revision "
                    "(the repository's commit history on the hub lists it)")


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
    from huggingface_hub import HfApi, snapshot_download, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

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
    endpoint = os.environ.get("HF_ENDPOINT") or None
    api = HfApi(endpoint=endpoint)
    info = api.model_info if kind == "model" else api.dataset_info
    try:
        info(repo, revision=revision, timeout=TIMEOUT_SECONDS)
    except GatedRepoError:
        raise error(f"{key}: {name} is gated: accept its terms on the hub and log in (`hf auth login`)") from None
    except RevisionNotFoundError:
        raise error(f"{key}: {name}: no such revision in that repository (check the commit hash)") from None
    except RepositoryNotFoundError:
        raise error(f"{key}: {name}: no such {kind} repository on the hub (check the name; a private one needs "
                    "`hf auth login`)") from None
    except Exception as exc:  # noqa: BLE001 - connection refused, DNS, timeout: one line, no retry loop
        first = (str(exc).splitlines() or [""])[0][:120]
        raise error(f"{key}: the hub ({endpoint or 'https://huggingface.co'}) cannot be reached for {name} "
                    f"({type(exc).__name__}: {first}); check the network, or set HF_HUB_OFFLINE=1 to use the local "
                    "cache") from None
