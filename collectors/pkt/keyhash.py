"""64-bit hashes of packet keys: one hash for flows (:mod:`.flowkey`) and connections
(:mod:`.collective`), so both group packets the same way. Grouping checks collisions on the full
key, so the hash only has to spread well (a murmur3-style finaliser), not be cryptographic.
"""
from __future__ import annotations

import numpy as np


def mix64(x: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """Avalanche mix of a uint64 array. With ``scratch`` (a uint64 array of the same shape) it
    works in place on ``x`` (which it returns), without full-size temporaries."""
    with np.errstate(over="ignore"):
        if scratch is None:
            x = x ^ (x >> np.uint64(33))
            x = x * np.uint64(0xFF51AFD7ED558CCD)
            x = x ^ (x >> np.uint64(33))
            x = x * np.uint64(0xC4CEB9FE1A85EC53)
            return x ^ (x >> np.uint64(33))
        s33 = np.uint64(33)
        x ^= np.right_shift(x, s33, out=scratch)
        x *= np.uint64(0xFF51AFD7ED558CCD)
        x ^= np.right_shift(x, s33, out=scratch)
        x *= np.uint64(0xC4CEB9FE1A85EC53)
        x ^= np.right_shift(x, s33, out=scratch)
        return x


def hash_rows(k: np.ndarray) -> np.ndarray:
    """64-bit hash of each row of a uint64 matrix (grouping key; collisions are checked)."""
    with np.errstate(over="ignore"):
        h = mix64(k[:, -1] ^ np.uint64(0x9E3779B97F4A7C15))
        for c in range(k.shape[1] - 1):
            h = mix64(h ^ k[:, c] * np.uint64(0x100000001B3 + 2 * c))
    return h
