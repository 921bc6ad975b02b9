"""Duplicate and leakage detection within and between data splits.

Texts are normalised (:func:`normalise_text`), cut into word n-gram shingles
hashed to stable 64-bit integers, and compared by Jaccard similarity.
:func:`find_duplicates` finds exact duplicates with a hash map and near
duplicates with MinHash + LSH banding (vectorised with numpy); every near
candidate is verified with the exact Jaccard, so no false positive is reported.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterable, Sequence

import numpy as np
import tqdm.auto

__all__ = ["normalise_text", "shingles", "jaccard", "find_duplicates", "summarise", "emptied_train"]

# Characters stripped from both ends of every token (ASCII + common Unicode punctuation).
_EDGE_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~" + "“”‘’«»‹›„‚…–—―‐‑¡¿·•′″"
_M64 = (1 << 64) - 1
_C1, _C2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53  # murmur3 fmix64 constants
_SEED = 0x9E3779B97F4A7C15
_PROGRESS_ROWS = 20_000
_RECALL_MISS = 1e-4  # target probability that LSH misses a pair at exactly `threshold`


def normalise_text(text: str) -> str:
    """Normalise text for duplicate comparison.

    Drops format characters (Unicode category Cf: zero-width spaces and joiners, the byte-order mark, bidirectional
    marks), applies Unicode NFKC, casefolds, splits on any whitespace, strips
    punctuation from both ends of each token (inner punctuation such as
    ``don't`` or ``1.5`` is kept), drops tokens that become empty, and joins
    the rest with single spaces.

    Args:
        text: Raw text.

    Returns:
        The normalised text ("" for blank or punctuation-only input).
    """
    visible = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")  # zero-width and other format characters
    folded = unicodedata.normalize("NFKC", visible).casefold()
    tokens = (tok.strip(_EDGE_PUNCT) for tok in folded.split())
    return " ".join(tok for tok in tokens if tok)


def _fmix_int(z: int) -> int:
    """64-bit finaliser on a Python int (mirrors :func:`_fmix_np`)."""
    z ^= z >> 33
    z = (z * _C1) & _M64
    z ^= z >> 33
    z = (z * _C2) & _M64
    return z ^ (z >> 33)


def _fmix_np(z: np.ndarray) -> np.ndarray:
    """64-bit finaliser on a uint64 array (wrapping arithmetic, in place)."""
    z ^= z >> np.uint64(33)
    z *= np.uint64(_C1)
    z ^= z >> np.uint64(33)
    z *= np.uint64(_C2)
    z ^= z >> np.uint64(33)
    return z


def _token_hash(token: str) -> int:
    return int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest(), "little")


def _shingle_arrays(norm_texts: Sequence[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Hash the word n-grams of many normalised texts at once.

    Each token is hashed with blake2b (8 bytes); an n-gram hash chains the
    token hashes through a 64-bit mixer, so it is stable across runs.

    Returns:
        ``(hashes, counts)``: all shingle hashes (uint64, possibly repeated
        within a row) concatenated row by row, and the number per row.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    lengths = np.fromiter((t.count(" ") + 1 if t else 0 for t in norm_texts),
                          dtype=np.int64, count=len(norm_texts))
    tokens = " ".join(t for t in norm_texts if t).split(" ") if lengths.any() else []
    vocab: dict[str, int] = {}
    ids = np.array([vocab.setdefault(tok, len(vocab)) for tok in tokens], dtype=np.int64)
    vocab_hash = np.fromiter((_token_hash(tok) for tok in vocab), dtype=np.uint64, count=len(vocab))
    flat = vocab_hash[ids]
    long_rows = lengths >= n
    counts = np.where(long_rows, lengths - n + 1, np.minimum(lengths, 1))
    out = np.empty(int(counts.sum()), dtype=np.uint64)
    slot_is_gram = np.repeat(long_rows, counts)
    if flat.size >= n:
        span = flat.size - n + 1
        grams = _fmix_np(flat[:span] ^ np.uint64(_SEED))
        for k in range(1, n):
            grams ^= flat[k:k + span]
            _fmix_np(grams)
        ends = np.cumsum(lengths)
        row_of = np.repeat(np.arange(len(lengths)), lengths)[:span]
        out[slot_is_gram] = grams[np.arange(span) + n <= ends[row_of]]
    # Texts shorter than n words: one shingle chaining all of their tokens.
    short = []
    for i in np.flatnonzero(~long_rows & (lengths > 0)).tolist():
        h = _SEED
        for tok in norm_texts[i].split(" "):
            h = _fmix_int(h ^ _token_hash(tok))
        short.append(h)
    out[~slot_is_gram] = np.array(short, dtype=np.uint64)
    return out, counts


def shingles(text: str, n: int = 3) -> set[int]:
    """Word n-gram shingles of the normalised text as stable 64-bit ints.

    Args:
        text: Raw text (normalised internally).
        n: Words per shingle. Texts with fewer than ``n`` words give a single
            shingle of the whole text.

    Returns:
        The set of shingle hashes; empty for empty (normalised) text.
    """
    hashes, _ = _shingle_arrays([normalise_text(text)], n)
    return set(hashes.tolist())


def jaccard(a: str, b: str, n: int = 3) -> float:
    """Jaccard similarity of the shingle sets of two texts.

    Args:
        a: First text.
        b: Second text.
        n: Words per shingle.

    Returns:
        ``|A & B| / |A | B|`` in [0, 1]; 0.0 when either text is empty.
    """
    sa, sb = shingles(a, n), shingles(b, n)
    if not sa or not sb:
        return 0.0
    inter = len(sa & sb)
    return inter / (len(sa) + len(sb) - inter)


def _lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """Pick (bands, rows): the most selective banding whose miss rate at ``threshold`` is tiny."""
    best = (num_perm, 1)
    for r in range(1, num_perm + 1):
        b = num_perm // r
        if (1.0 - threshold ** r) ** b <= _RECALL_MISS:
            best = (b, r)
    return best


def _minhash(hashes: np.ndarray, counts: np.ndarray, num_perm: int, seed: int,
             progress: bool) -> np.ndarray:
    """MinHash signatures (rows x num_perm); permutation k is x -> (x ^ m_k) * a_k mod 2**64 (a_k odd)."""
    rng = np.random.default_rng(seed)
    masks = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    mults = rng.integers(0, 2**62, size=num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    sig = np.empty((len(counts), num_perm), dtype=np.uint64)
    ends = np.cumsum(counts)
    budget = max(1, 1_000_000 // num_perm)  # shingles per chunk (~8 MB work arrays)
    # tqdm.auto.tqdm looked up at call time: under `labkit run` the kernel's plain-text bar replaces it
    bar = tqdm.auto.tqdm(total=len(counts), desc="minhash", unit="row", disable=not progress)
    row = 0
    while row < len(counts):
        base = ends[row - 1] if row else 0
        stop = max(row + 1, int(np.searchsorted(ends, base + budget, side="right")))
        block = hashes[base:ends[stop - 1]]
        y = block[:, None] ^ masks[None, :]
        y *= mults
        offsets = np.concatenate(([0], ends[row:stop - 1] - base))
        sig[row:stop] = np.minimum.reduceat(y, offsets, axis=0)
        bar.update(stop - row)
        row = stop
    bar.close()
    return sig


def _candidates(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Unique candidate pairs (i < j) sharing at least one LSH band, as an (k, 2) array."""
    n = sig.shape[0]
    found: list[np.ndarray] = []
    for b in range(bands):
        key = np.full(n, _SEED, dtype=np.uint64)
        for c in range(b * rows, (b + 1) * rows):
            key ^= sig[:, c]
            _fmix_np(key)
        order = np.argsort(key, kind="stable")
        sk = key[order]
        gstart = np.flatnonzero(np.concatenate(([True], sk[1:] != sk[:-1])))
        sizes = np.diff(np.append(gstart, n))
        pairs2 = gstart[sizes == 2]
        if pairs2.size:
            a, c = order[pairs2], order[pairs2 + 1]
            found.append(np.minimum(a, c) * n + np.maximum(a, c))
        for s, size in zip(gstart[sizes > 2].tolist(), sizes[sizes > 2].tolist()):
            members = np.sort(order[s:s + size])
            i, j = np.triu_indices(size, 1)
            found.append(members[i] * n + members[j])
    if not found:
        return np.empty((0, 2), dtype=np.int64)
    codes = np.unique(np.concatenate(found))
    return np.stack([codes // n, codes % n], axis=1)


def find_duplicates(splits: dict[str, list[tuple[str, str]]], threshold: float = 0.85,
                    n: int = 3, num_perm: int = 128, seed: int = 0) -> list[dict]:
    """Find exact and near duplicate pairs within and across splits.

    Args:
        splits: Split name -> list of ``(row_id, text)``. Rows whose normalised
            text is empty are skipped.
        threshold: Minimum Jaccard similarity of shingle sets for a near pair.
        n: Words per shingle.
        num_perm: MinHash permutations; LSH bands/rows are chosen so a pair at
            ``threshold`` is missed with probability <= 1e-4.
        seed: Seed for the MinHash permutations (the verified result does
            not depend on it except for the rare missed candidate).

    A tqdm progress bar is shown for more than 20,000 rows. Row ids should be
    mutually comparable (e.g. all ``str``); they order the output.

    Returns:
        One dict per unordered pair, ``{"a_split", "a_id", "b_split", "b_id",
        "kind": "exact" | "near", "similarity"}`` (similarity rounded to 4
        places). ``a`` precedes ``b`` by (split order in ``splits``, row id);
        the list is sorted the same way.
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError("threshold must be in (0, 1]")
    rows: list[tuple[int, str, str]] = []  # (split rank, split, id)
    groups: dict[str, list[int]] = {}      # normalised text -> row indices
    for rank, (split, items) in enumerate(splits.items()):
        for row_id, text in items:
            norm = normalise_text(text)
            if norm:
                groups.setdefault(norm, []).append(len(rows))
                rows.append((rank, split, row_id))
    sort_key = [(r[0], r[2], i) for i, r in enumerate(rows)]
    raw: list[tuple[int, int, str, float]] = []
    for members in groups.values():
        for x in range(len(members)):
            for y in range(x + 1, len(members)):
                raw.append((members[x], members[y], "exact", 1.0))

    reps = list(groups)
    if len(reps) > 1:
        hashes, counts = _shingle_arrays(reps, n)
        progress = len(rows) > _PROGRESS_ROWS
        sig = _minhash(hashes, counts, num_perm, seed, progress)
        bands, band_rows = _lsh_params(threshold, num_perm)
        starts = np.concatenate(([0], np.cumsum(counts)))
        sets: dict[int, set[int]] = {}

        def shingle_set(i: int) -> set[int]:
            if i not in sets:
                sets[i] = set(hashes[starts[i]:starts[i + 1]].tolist())
            return sets[i]

        for i, j in _candidates(sig, bands, band_rows).tolist():
            sa, sb = shingle_set(i), shingle_set(j)
            small, large = sorted((len(sa), len(sb)))
            if small < threshold * large:
                continue
            inter = len(sa & sb)
            sim = inter / (len(sa) + len(sb) - inter)
            if sim >= threshold:
                gi, gj = groups[reps[i]], groups[reps[j]]
                raw.extend((x, y, "near", sim) for x in gi for y in gj)

    pairs = []
    for x, y, kind, sim in raw:
        if sort_key[y] < sort_key[x]:
            x, y = y, x
        pairs.append((sort_key[x], sort_key[y], kind, sim))
    pairs.sort(key=lambda p: (p[0], p[1]))
    return [{"a_split": rows[a[2]][1], "a_id": a[1], "b_split": rows[b[2]][1], "b_id": b[1],
             "kind": kind, "similarity": round(sim, 4)} for a, b, kind, sim in pairs]


def summarise(pairs: Iterable[dict], split_order: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
    """Count duplicate pairs per split pair and kind.

    Args:
        pairs: Output of :func:`find_duplicates`.
        split_order: Optional split order (e.g. ``list(splits)``); otherwise
            splits are ordered by first appearance in ``pairs``.

    Returns:
        ``{"a~b": {"exact": int, "near": int}, ...}`` with keys ordered by
        (rank of a, rank of b).
    """
    pairs = list(pairs)
    rank: dict[str, int] = {s: i for i, s in enumerate(split_order or [])}
    for p in pairs:
        for s in (p["a_split"], p["b_split"]):
            rank.setdefault(s, len(rank))
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for p in pairs:
        a, b = sorted((p["a_split"], p["b_split"]), key=rank.__getitem__)
        counts.setdefault((a, b), {"exact": 0, "near": 0})[p["kind"]] += 1
    ordered = sorted(counts, key=lambda k: (rank[k[0]], rank[k[1]]))
    return {f"{a}~{b}": counts[(a, b)] for a, b in ordered}


def emptied_train(threshold: float, cross: Sequence[dict], train_rows: int, by_group: int) -> str:
    """The one line for `data.leakage.policy: drop_from_train` leaving no training row: what dropped them and the fix.

    Args:
        threshold: data.leakage.near_duplicate_threshold.
        cross: the pairs of :func:`find_duplicates` across splits (``similarity`` each).
        train_rows: training rows before the policy dropped any.
        by_group: training rows dropped for sharing a group (data.fields.group) with an evaluation row, not counted
            among the duplicates.
    Returns:
        the message, naming the card keys that change the outcome.
    """
    similar = [p["similarity"] for p in cross if "train" in (p["a_split"], p["b_split"])]
    low, top = (min(similar), max(similar)) if similar else (0.0, 0.0)
    causes = []
    if similar:
        causes.append(f"{train_rows - by_group} as duplicates of validation/test rows at similarity {low:.3f}–{top:.3f}")
    if by_group:
        causes.append(f"{by_group} for sharing a group (data.fields.group) with one")
    fix = ("if they are different examples (rows written from one template), raise "
           f"data.leakage.near_duplicate_threshold above {top:.3f}, or " if similar and top < 1.0 else "")
    return (f"data.leakage: policy drop_from_train dropped all {train_rows} training rows, {'; '.join(causes)}, so "
            f"nothing is left to train on (threshold {threshold}); {fix}set data.leakage.policy: report to keep them "
            "and see the pairs in stage 02 (preprocessing/leakage.json)")
