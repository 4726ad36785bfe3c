"""Find duplicates at three levels (prompt, response, pair) and near-duplicate prompts.

Keys are sha256 hashes of normalised content (`annotation.imports.content_hash`), kept as
64-bit integers so a stream of a million rows costs tens of megabytes, not gigabytes.

* prompt: the same normalised prompt text (or chat transcript) twice;
* response: the same normalised response text twice under one prompt;
* pair: the same prompt with the same two responses, in either order.

Near-duplicate prompts (optional) are found with MinHash over word 3-gram shingles and
locality-sensitive hashing (Broder 1997, "On the resemblance and containment of documents";
Leskovec, Rajaraman & Ullman, Mining of Massive Datasets, ch. 3.4 for the banding): a pair
of prompts is reported when the estimated Jaccard similarity of their shingle sets is at
least ``threshold``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np
import xxhash

EXAMPLES = 5
_WORD = re.compile(r"\w+", re.UNICODE)


def key64(hex_digest: str) -> int:
    """Return the first 64 bits of a hex digest as an int (a compact set member)."""
    return int(hex_digest[:16], 16)


def pair_key(prompt_hash: str, first_hash: str, second_hash: str) -> tuple[int, int, int]:
    """Return an order-free key for a prompt and two responses."""
    a, b = sorted((key64(first_hash), key64(second_hash)))
    return key64(prompt_hash), a, b


def preview(payload, limit: int = 80) -> str:
    """Return a short one-line preview of a text or chat transcript for reports."""
    if not isinstance(payload, str):
        payload = " | ".join(f"{m.get('role')}: {m.get('content')}" for m in payload or [])
    text = " ".join(str(payload).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class _Level:
    """Duplicate count and a few examples for one level."""

    duplicates: int = 0
    examples: list = field(default_factory=list)

    def add(self, example, limit: int) -> None:
        self.duplicates += 1
        if len(self.examples) < limit:
            self.examples.append(example)


class MinHasher:
    """MinHash signatures of word 3-gram shingles, with LSH bands to find near duplicates."""

    def __init__(self, *, num_perm: int = 32, bands: int = 8, threshold: float = 0.8, seed=1):
        if num_perm % bands:
            raise ValueError("num_perm must be a multiple of bands")
        rng = np.random.default_rng(seed)
        # Multiply-shift hashing (Dietzfelbinger et al. 1997): odd 64-bit multipliers, high bits
        self._mult = rng.integers(1, 2**63, size=num_perm, dtype=np.uint64) * np.uint64(2) + 1
        self._add = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64)
        self.bands = bands
        self.rows = num_perm // bands
        self.threshold = threshold
        self._buckets: dict[tuple[int, bytes], Hashable] = {}
        self._signatures: dict[Hashable, np.ndarray] = {}

    def signature(self, text: str) -> np.ndarray | None:
        """Return the MinHash signature of a text, or None when it has no words."""
        words = _WORD.findall(text.lower())
        if not words:
            return None
        shingles = {" ".join(words[i : i + 3]) for i in range(max(1, len(words) - 2))}
        base = np.fromiter(
            (xxhash.xxh64_intdigest(s.encode("utf-8")) for s in shingles),
            dtype=np.uint64,
            count=len(shingles),
        )
        with np.errstate(over="ignore"):
            mixed = base[None, :] * self._mult[:, None] + self._add[:, None]
        return (mixed >> np.uint64(32)).astype(np.uint32).min(axis=1)

    def add(self, key: Hashable, text: str) -> tuple[Hashable, float] | None:
        """Index a text; return (earlier key, estimated Jaccard) of a near duplicate, or None."""
        sig = self.signature(text)
        if sig is None:
            return None
        match = None
        bands = [(b, sig[b * self.rows : (b + 1) * self.rows].tobytes()) for b in range(self.bands)]
        for band in bands:
            other = self._buckets.get(band)
            if other is not None and other != key:
                similarity = float(np.mean(self._signatures[other] == sig))
                if similarity >= self.threshold:
                    match = (other, similarity)
                    break
        if match is None:
            self._signatures[key] = sig
            for band in bands:
                self._buckets.setdefault(band, key)
        return match


class DedupTracker:
    """Count repeated prompts, responses and pairs in a stream, with a few examples each.

    ``see_*`` return whether the key was seen before. Response and pair keys include the
    prompt, so a generic answer ("I don't know.") under two prompts is not a duplicate.
    ``forget_prompt_scope`` drops response/pair memory when a caller streams grouped by
    prompt and knows a prompt will not come back (the exporter does), keeping memory flat.
    """

    def __init__(self, *, examples: int = EXAMPLES, near_duplicates: MinHasher | None = None):
        self.limit = examples
        self._prompts: set[int] = set()
        self._responses: set[tuple[int, int]] = set()
        self._pairs: set[tuple[int, int, int]] = set()
        self.prompt = _Level()
        self.response = _Level()
        self.pair = _Level()
        self.near = _Level()
        self.minhash = near_duplicates
        self.seen = {"prompts": 0, "responses": 0, "pairs": 0}

    def see_prompt(self, prompt_hash: str, payload=None, where=None) -> bool:
        """Record a prompt; return True when the same normalised prompt came before."""
        self.seen["prompts"] += 1
        key = key64(prompt_hash)
        if key in self._prompts:
            self.prompt.add({"where": where, "prompt": preview(payload)}, self.limit)
            return True
        self._prompts.add(key)
        return False

    def see_near_prompt(self, key: Hashable, payload, where=None) -> Hashable | None:
        """Check a new prompt against earlier ones; return the near duplicate's key or None."""
        if self.minhash is None:
            return None
        text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
        match = self.minhash.add(key, text)
        if match is None:
            return None
        other, similarity = match
        example = {"where": where, "prompt": preview(payload), "similar_to": str(other)}
        self.near.add({**example, "jaccard": round(similarity, 3)}, self.limit)
        return other

    def see_response(self, prompt_hash: str, response_hash: str, text=None, where=None) -> bool:
        """Record a response under its prompt; return True when it came before."""
        self.seen["responses"] += 1
        key = (key64(prompt_hash), key64(response_hash))
        if key in self._responses:
            self.response.add({"where": where, "response": preview(text or "")}, self.limit)
            return True
        self._responses.add(key)
        return False

    def see_pair(self, prompt_hash: str, first_hash: str, second_hash: str, where=None) -> bool:
        """Record a (prompt, response, response) pair in either order; True when seen before."""
        self.seen["pairs"] += 1
        key = pair_key(prompt_hash, first_hash, second_hash)
        if key in self._pairs:
            self.pair.add({"where": where}, self.limit)
            return True
        self._pairs.add(key)
        return False

    def forget_prompt_scope(self) -> None:
        """Forget response and pair keys (the caller moved on to a new prompt for good)."""
        self._responses.clear()
        self._pairs.clear()

    def report(self) -> dict:
        """Return counts and examples per level, JSON-serialisable."""
        out = {"seen": dict(self.seen)}
        for name in ("prompt", "response", "pair"):
            level = getattr(self, name)
            out[name] = {"duplicates": level.duplicates, "examples": level.examples}
        if self.minhash is not None:
            out["near_duplicate_prompt"] = {
                "duplicates": self.near.duplicates,
                "examples": self.near.examples,
                "threshold": self.minhash.threshold,
            }
        return out
